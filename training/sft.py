"""Supervised warm start: teach a small model the search format, and which retrieval works for which question,
before reinforcement learning (FrugalRAG's recipe, with routing labels).

Each training example is a trajectory the policy *could* have produced. Two plans:

* :func:`gold_plan` (format only): the question's gold supporting passages as if retrieved, in one search or two,
  each in a random mode;
* :func:`retrieval_plan` (routing): what the retriever really returns for the question, in the mode whose documents
  let the reader answer it (routing labels from ``routerag eval`` records of the naive one-search strategies, see
  :func:`training.data.routing_labels`), and the question searched again, in the cheapest mode that adds it, when
  the first search misses the answer (or, for a multi-hop question, a supporting page).

The last turn names the document that holds the answer and copies the answer from it; where no retrieved document
holds it, the last turn guesses, or, with refusals on (``routerag train-sft --refusals``), refuses
(``<answer> [refuse] </answer>``) under an instruction that states the convention
(:data:`~routerag.prompts.REFUSAL_INSTRUCTION`). The information blocks are
formatted as the policy loop formats them (:func:`routerag.policy.loop.information_block`), the thoughts and search
tags come from :mod:`routerag.prompts`, and only the tokens the policy would write are trained on.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from routerag.config import LOOP_DEFAULTS
from routerag.datasets import QAItem, title_key
from routerag.policy.card import PolicyCard
from routerag.policy.citations import split_sentences
from routerag.policy.loop import doc_key, information_block, unseen_documents
from routerag.policy.tokens import TokenCounter
from routerag.prompts import (CHECK_THOUGHTS, COMBINED_THOUGHTS, DEFAULT_INSTRUCTION, FIRST_THOUGHTS,
                              FOUND_THOUGHTS, GUESS_THOUGHTS, NEXT_THOUGHTS, REFUSAL_INSTRUCTION, REFUSE_MARKER,
                              REFUSE_THOUGHT, SEARCH_TAGS, user_message)
from routerag.retrieval.types import RetrievalResult, RetrievedDoc
from routerag.vocabulary import Mode

from .checkpoints import resume_checkpoint, save_checkpoint
from .grpo import first_loss_position
from .sequences import TokenSequence, micro_batches

log = logging.getLogger(__name__)

@dataclass(slots=True)
class PlannedSearch:
    """One search of a warm-start trajectory: the mode the policy names, its query, and what comes back."""

    mode: Mode
    query: str
    docs: list[RetrievedDoc]
    extra: bool = False
    """Made although the trajectory's documents already answered (``retrieval_plan(extra=True)``)."""


def gold_documents(item: QAItem, texts_by_title: dict[str, str]) -> list[RetrievedDoc]:
    docs = []
    for g in item.supporting:
        text = g.text if g.text is not None else texts_by_title.get(g.title)
        if text:
            docs.append(RetrievedDoc(id=g.hash or g.title, title=g.title, text=text, score=1.0))
    return docs


def gold_plan(item: QAItem, docs: Sequence[RetrievedDoc], rng: random.Random) -> list[PlannedSearch]:
    """The format-only warm start (FrugalRAG): the gold passages as if retrieved, in one search or two (the
    subject's page, then the rest), each in a random mode, so no mode is taught as the default."""
    modes = list(SEARCH_TAGS)
    if len(docs) >= 2 and rng.random() < 0.5:
        return [PlannedSearch(rng.choice(modes), docs[0].title, [docs[0]]),  # type: ignore[arg-type]
                PlannedSearch(rng.choice(modes), item.question, list(docs[1:]))]  # type: ignore[arg-type]
    return [PlannedSearch(rng.choice(modes), item.question, list(docs))]  # type: ignore[arg-type]


def retrieval_plan(item: QAItem, results: dict[str, RetrievalResult], rng: random.Random,
                   label: str | None = None, *, again: dict[str, RetrievalResult] | None = None,
                   k: int = LOOP_DEFAULTS.k, budget: int = 2, extra: bool = False) -> list[PlannedSearch]:
    """The routing warm start: what the retriever really returns for the question. The first search uses
    ``label`` (the mode whose documents let the reader answer this question, from :func:`training.data.
    routing_labels`; None: a random mode). When its documents miss what the question needs (:func:`needs_more`)
    and the budget allows, the question is searched again, in the cheapest mode of :data:`FOLLOW_UP_MODES` whose
    documents add it (:func:`adds_evidence`). So the policy sees the documents it will see when served, learns which
    mode works for which kind of question, and when to search again.

    ``again``: each mode's documents for the question searched a second time under the loop's ``fresh_documents``
    (the retriever asked for ``2k``; those already shown are left out by
    :func:`~routerag.policy.loop.unseen_documents`, as the loop does), so a second search may use the same mode.
    None: the loop without it, where the same mode would show the same documents again.

    ``extra``: search again even when the first search found what the question needs (the cheapest follow-up
    mode, no evidence required): an over-retrieving warm start, the habit RouteRAG's stage-2 cost term is there to
    remove (docs/training.md, "An over-retrieving warm start")."""
    first = label if label in results else rng.choice(sorted(results))
    plan = [PlannedSearch(first, item.question, list(results[first].docs[:k]))]  # type: ignore[arg-type]
    if budget < 2:
        return plan
    needed = needs_more(item, plan)
    if not needed and not extra:
        return plan
    shown = {doc_key(d) for d in plan[0].docs}
    for mode in FOLLOW_UP_MODES:
        if mode not in results or (again is None and mode == first):
            continue
        docs = unseen_documents(again[mode].docs, shown, k) if again is not None else list(results[mode].docs[:k])
        if not needed or adds_evidence(item, plan, docs):
            return [*plan, PlannedSearch(mode, item.question, docs, extra=not needed)]
    return plan


FOLLOW_UP_MODES: tuple[Mode, ...] = ("passage", "graph", "hybrid")
"""The order in which a second search's mode is chosen: the cheapest first (per-search costs in
docs/training.md)."""


def is_multi_hop(item: QAItem) -> bool:
    """Whether every supporting passage is needed to answer (HotpotQA's supporting facts, MuSiQue's hops), as the
    data set marks it (:func:`routerag.datasets.parse_item`); PopQA's object page is marked supporting but is not
    needed."""
    return bool(item.meta.get("multi_hop"))


def judged_by_support(item: QAItem) -> bool:
    """Whether a plan for ``item`` is complete when it has every supporting page (a multi-hop question whose
    supporting titles are known), rather than when a document names the answer."""
    return is_multi_hop(item) and bool(item.supporting)


def missing_support(item: QAItem, plan: Sequence[PlannedSearch]) -> list[str]:
    """Titles of the item's supporting passages that no search of ``plan`` returned, in the data set's order."""
    seen = {title_key(d.title) for step in plan for d in step.docs}
    return [g.title for g in item.supporting if title_key(g.title) not in seen]


def needs_more(item: QAItem, plan: Sequence[PlannedSearch]) -> bool:
    """Whether ``plan`` misses what the question needs: a supporting page of a multi-hop question, else a document
    that names the answer."""
    if judged_by_support(item):
        return bool(missing_support(item, plan))
    return answer_span([d for step in plan for d in step.docs], item.answers) is None


def adds_evidence(item: QAItem, plan: Sequence[PlannedSearch], docs: Sequence[RetrievedDoc]) -> bool:
    """Whether a further search's ``docs`` bring what ``plan`` misses: a missing supporting page of a multi-hop
    question, else a document that names the answer (a search that finds nothing new teaches nothing)."""
    if judged_by_support(item):
        missing = {title_key(t) for t in missing_support(item, plan)}
        return any(title_key(d.title) in missing for d in docs)
    return answer_span(docs, item.answers) is not None


def answer_span(docs: Sequence[RetrievedDoc], golds: Sequence[str]) -> tuple[RetrievedDoc, str, str] | None:
    """(document, sentence, answer as written there) for the first sentence of ``docs`` that names a gold alias
    as whole words, or None: what the last thought quotes and the answer copies, verbatim."""
    aliases = sorted({g.strip() for g in golds if g.strip()}, key=len, reverse=True)
    for d in docs:
        for sentence in split_sentences(d.text):
            for alias in aliases:
                m = re.search(rf"(?<!\w){re.escape(alias)}(?!\w)", sentence, re.IGNORECASE)
                if m:
                    return d, sentence, m.group(0)
    return None


def refusal_template(template: str) -> str:
    """The instruction of a warm start with refusals: the default instruction becomes
    :data:`~routerag.prompts.REFUSAL_INSTRUCTION` (the default's text stays as it is: trained policies carry it); a
    template of one's own must state the convention itself."""
    if template == DEFAULT_INSTRUCTION:
        return REFUSAL_INSTRUCTION
    if REFUSE_MARKER not in template:
        raise ValueError(f"a warm start with refusals needs an instruction template that tells the policy to answer "
                         f"<answer> {REFUSE_MARKER} </answer> when the documents do not answer the question")
    return template


def found_answer(item: QAItem, plan: Sequence[PlannedSearch], counter: TokenCounter, *,
                 max_information_tokens: int = LOOP_DEFAULTS.max_information_tokens,
                 k: int = LOOP_DEFAULTS.k) -> tuple[RetrievedDoc, str, str] | None:
    """:func:`answer_span` over the plan's documents as the policy reads them (each cut to its share of an
    information block), or None when none of them holds a gold answer: a question to guess at, or to refuse."""
    seen = [d for step in plan for d in step.docs]
    return answer_span([RetrievedDoc(d.id, d.title, counter.truncate(d.text, max_information_tokens // k), d.score)
                        for d in seen], item.answers)


def covers_support(item: QAItem, plan: Sequence[PlannedSearch]) -> bool:
    """A multi-hop trajectory that retrieved every supporting passage: it answers even where no document spells
    the answer out (a comparison's "yes"), instead of refusing."""
    return judged_by_support(item) and not missing_support(item, plan)


def unanswered(item: QAItem, plan: Sequence[PlannedSearch], counter: TokenCounter, *,
               max_information_tokens: int = LOOP_DEFAULTS.max_information_tokens,
               k: int = LOOP_DEFAULTS.k) -> bool:
    """Whether :func:`build_example` ends ``plan`` without an answer (a guess, or with refusals a refusal): no
    document as the policy reads it holds the answer, and the plan did not retrieve every supporting page."""
    return (found_answer(item, plan, counter, max_information_tokens=max_information_tokens, k=k) is None
            and not covers_support(item, plan))


def build_example(item: QAItem, plan: Sequence[PlannedSearch], tokenizer: Any, rng: random.Random, *,
                  template: str = DEFAULT_INSTRUCTION,
                  max_information_tokens: int = LOOP_DEFAULTS.max_information_tokens,
                  k: int = LOOP_DEFAULTS.k, refuse: bool = False) -> TokenSequence | None:
    """One warm-start trajectory as tokens with its loss mask (only the policy's own turns are trained), or None
    without searches, or without gold answers unless ``refuse`` (an unanswerable question's trajectory refuses).
    The last turn names the document that holds the answer (``Doc n`` of its information block,
    :data:`~routerag.prompts.FOUND_THOUGHTS`) and copies the answer from it verbatim (a short span, not a sentence); where no document holds it, a guess, or with ``refuse`` a refusal (then ``template`` must state
    the convention: :func:`refusal_template`). No turn copies a title or a sentence: a small policy trained to quote
    looped on the quote's template."""
    if not plan or not (item.answers or refuse):  # an unanswerable question's trajectory ends with a refusal
        return None
    if refuse and REFUSE_MARKER not in template:
        raise ValueError("refusal examples need an instruction that states the refusal convention "
                         "(training.sft.refusal_template)")
    counter = TokenCounter(tokenizer)
    messages = [{"role": "user", "content": user_message(template, item.question)}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    parts: list[tuple[str, int]] = [(prompt, 0)]
    for n, step in enumerate(plan):
        if n == 0:
            think = rng.choice(FIRST_THOUGHTS).format(question=item.question, query=step.query)
        else:
            think = rng.choice(CHECK_THOUGHTS if step.extra else NEXT_THOUGHTS).format(query=step.query)
        parts.append((f"<think>{think}</think>\n<search>{SEARCH_TAGS[step.mode]} {step.query}</search>", 1))
        parts.append((information_block(step.docs, counter, max_information_tokens), 0))
    found = found_answer(item, plan, counter, max_information_tokens=max_information_tokens, k=k)
    if found is not None:
        doc, _, answer = found
        n = next(j for step in plan for j, d in enumerate(step.docs, 1) if d.id == doc.id)
        turn = f"<think>{rng.choice(FOUND_THOUGHTS).format(n=n)}</think>\n<answer> {answer} </answer>"
    elif covers_support(item, plan):  # a comparison's "yes", or an answer no document spells out
        turn = f"<think>{rng.choice(COMBINED_THOUGHTS)}</think>\n<answer> {item.answers[0]} </answer>"
    elif refuse:
        turn = f"<think>{REFUSE_THOUGHT}</think>\n<answer> {REFUSE_MARKER} </answer>"
    else:
        answer = item.answers[0]
        turn = f"<think>{rng.choice(GUESS_THOUGHTS)}</think>\n<answer> {answer} </answer>"
    parts.append((turn, 1))
    ids: list[int] = []
    mask: list[int] = []
    for text, m in parts:
        t = tokenizer.encode(text, add_special_tokens=False)
        ids.extend(t)
        mask.extend([m] * len(t))
    return TokenSequence(ids, mask)


def train_sft(model: Any, tokenizer: Any, examples: Sequence[TokenSequence], out: Path, *, epochs: int = 1,
              lr: float = 2e-4, micro_batch_size: int = 2, accumulate: int = 8, seed: int = 0,
              device: str = "cpu", card: PolicyCard | None = None, save_every: int = 1) -> list[dict[str, float]]:
    """Cross-entropy on the policy's tokens; writes OUT/adapter (or OUT/model) and OUT/sft_metrics.jsonl.

    Resumable: with a ``card``, every ``save_every`` optimiser steps an atomic OUT/checkpoint-N is written, and a rerun
    with the same examples and seed continues from the latest one (the batch order is replayed from the seed, the
    finished steps skipped)."""
    torch.manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "sft_metrics.jsonl"
    done = resume_checkpoint(out, model, opt, device, metrics) if card is not None else 0
    if not done and metrics.exists():  # a fresh run (or one killed before its first checkpoint) starts a new log
        metrics.unlink()
    history = []
    rng = random.Random(seed)
    model.train()
    step = 0
    for epoch in range(epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        batches = micro_batches([examples[i] for i in order], [1.0] * len(order), micro_batch_size,
                                tokenizer.pad_token_id, device)
        rng.shuffle(batches)
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        running = 0.0
        for n, mb in enumerate(batches, 1):
            if step < done:  # finished before a resume: only count it
                if n % accumulate == 0 or n == len(batches):
                    step += 1
                continue
            start = first_loss_position(mb.loss_mask)
            keep = mb.input_ids.shape[1] - start
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, logits_to_keep=keep).logits
            # fused cross-entropy on the kept positions: no vocabulary-wide log-softmax kept for backward
            targets = mb.input_ids[:, start + 1 :]
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                    targets.reshape(-1), reduction="none").view(targets.shape)
            mask = mb.loss_mask[:, start:]
            loss = (nll * mask).sum() / mask.sum().clamp(min=1.0)
            (loss / accumulate).backward()
            running += loss.item()
            if n % accumulate == 0 or n == len(batches):
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                row = {"epoch": epoch, "step": step, "loss": running / (accumulate if n % accumulate == 0 else
                                                                            (n % accumulate)),
                       "elapsed_s": round(time.perf_counter() - t0, 1)}
                running = 0.0
                history.append(row)
                with open(metrics, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                log.info("sft epoch %d step %d loss %.4f", epoch, step, row["loss"])
                if card is not None and step % save_every == 0:
                    save_checkpoint(out, step, model, tokenizer, opt, card, keep_last=2)
    model.eval()
    model.save_pretrained(out / "adapter")
    tokenizer.save_pretrained(out / "adapter")
    return history
