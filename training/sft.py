"""Supervised warm start: teach a small model the search format before reinforcement learning (FrugalRAG's recipe).

Each training example is a trajectory the policy *could* have produced, built from a question's gold supporting
passages: one search returning both gold passages, or two searches returning one each (the subject's page, then the
answer's), with the retrieval mode varied across ``[passage]``, ``[graph]`` and both so that no mode is taught as
the default, then the gold answer. The information blocks are formatted by the policy loop itself, and only the
tokens the policy would write are trained on.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from routerag.datasets import QAItem
from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.prompt import DEFAULT_INSTRUCTION, user_message
from routerag.retrieval import RetrievalResult, RetrievedDoc

from .grpo import first_loss_position
from .sequences import TokenSequence, micro_batches

log = logging.getLogger(__name__)

MODE_TAGS = ("[passage]", "[graph]", "[graph][passage]")

# Thoughts vary and carry content (the question, the page found, the answer read from it): with one fixed sentence
# per turn, a 135M model learned to repeat the sentences (even as its answer) instead of reading the documents.
FIRST_THOUGHTS = ("I need to look this up.", "I do not know this; I will search for it.",
                  "Question: {question} I should search.", "Let me search for {query}.")
NEXT_THOUGHTS = ("I found {title}; I need one more search.", "The page {title} helps, but I need one more search.",
                 "Now I search for {query}.")
ANSWER_THOUGHTS = ("The documents say {answer}.", "According to {title}, the answer is {answer}.",
                   "The answer is {answer}.", "I found it: {answer}.")


class _NoGeneration:
    """Lets us borrow :meth:`PolicyLoop.information_block` (one format everywhere) without a real backend."""

    name = "none"
    tracks_tokens = True

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def render_prompt(self, user_message: str) -> tuple[str, list[int]]:  # pragma: no cover - not used
        raise NotImplementedError

    async def generate(self, request: Any) -> Any:  # pragma: no cover - not used
        raise NotImplementedError


def gold_documents(item: QAItem, texts_by_title: dict[str, str]) -> list[RetrievedDoc]:
    docs = []
    for g in item.supporting:
        text = g.text if g.text is not None else texts_by_title.get(g.title)
        if text:
            docs.append(RetrievedDoc(id=g.hash or g.title, title=g.title, text=text, score=1.0))
    return docs


def build_example(item: QAItem, docs: Sequence[RetrievedDoc], tokenizer: Any, rng: random.Random, *,
                  template: str = DEFAULT_INSTRUCTION, max_information_tokens: int = 500) -> TokenSequence | None:
    """One warm-start trajectory as tokens with its loss mask, or None without gold documents or answers."""
    if not docs or not item.answers:
        return None
    loop = PolicyLoop(_NoGeneration(tokenizer), None, LoopConfig(max_information_tokens=max_information_tokens))  # type: ignore[arg-type]
    messages = [{"role": "user", "content": user_message(template, item.question)}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    parts: list[tuple[str, int]] = [(prompt, 0)]
    if len(docs) >= 2 and rng.random() < 0.5:
        plan = [(docs[0].title, [docs[0]]), (item.question, list(docs[1:]))]
    else:
        plan = [(item.question, list(docs))]
    for n, (query, found) in enumerate(plan):
        tag = rng.choice(MODE_TAGS)
        if n == 0:
            think = rng.choice(FIRST_THOUGHTS).format(question=item.question, query=query)
        else:
            think = rng.choice(NEXT_THOUGHTS).format(title=plan[0][1][0].title, query=query)
        parts.append((f"<think>{think}</think>\n<search>{tag} {query}</search>", 1))
        parts.append((loop.information_block(RetrievalResult(query, "passage", found)), 0))
    answer = item.answers[0]
    think = rng.choice(ANSWER_THOUGHTS).format(answer=answer, title=docs[0].title)
    parts.append((f"<think>{think}</think>\n<answer> {answer} </answer>", 1))
    ids: list[int] = []
    mask: list[int] = []
    for text, m in parts:
        t = tokenizer.encode(text, add_special_tokens=False)
        ids.extend(t)
        mask.extend([m] * len(t))
    return TokenSequence(ids, mask)


def train_sft(model: Any, tokenizer: Any, examples: Sequence[TokenSequence], out: Path, *, epochs: int = 1,
              lr: float = 2e-4, micro_batch_size: int = 2, accumulate: int = 8, seed: int = 0,
              device: str = "cpu") -> list[dict[str, float]]:
    """Cross-entropy on the policy's tokens; writes OUT/adapter (or OUT/model) and OUT/sft_metrics.jsonl."""
    torch.manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    out.mkdir(parents=True, exist_ok=True)
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
                with open(out / "sft_metrics.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                log.info("sft epoch %d step %d loss %.4f", epoch, step, row["loss"])
    model.eval()
    model.save_pretrained(out / "adapter")
    tokenizer.save_pretrained(out / "adapter")
    return history
