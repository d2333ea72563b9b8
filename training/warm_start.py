"""The warm start as a pipeline (``routerag train-sft``, or any other caller: a notebook, a job runner).

:func:`prepare_warm_start` turns questions into supervised trajectories: the loop the policy will run with
(:func:`~routerag.policy.card.training_policy`, so the examples are formatted for the ``k`` and information limit
it will be served with), a plan per question (gold passages, real retrieval per mode, or measured plans), and one
example per plan. :func:`train_warm_start` trains on them and writes the adapter with its policy card and the loss
curve; :func:`write_examples` writes them for reading instead (a dry run).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from routerag.config import Settings
from routerag.datasets import QAItem
from routerag.policy.card import ResolvedPolicy, card_for, training_policy, write_card
from routerag.policy.tokens import TokenCounter
from routerag.vocabulary import MODES

from .data import load_training_items, routing_labels
from .sft import PlannedSearch, build_example, gold_documents, gold_plan, refusal_template, retrieval_plan, unanswered
from .sequences import TokenSequence

log = logging.getLogger(__name__)

EXAMPLES_FILE = "warm_start_examples.jsonl"


@dataclass(slots=True)
class WarmStartOptions:
    """How the trajectories are built (``routerag train-sft``'s flags)."""

    plan: Literal["gold", "retrieval"] = "gold"
    """``gold``: the gold passages as if retrieved, random modes (format only); ``retrieval``: what the retriever
    returns, in the labelled mode or a random one. Any of the options below implies ``retrieval``."""
    routes_from: list[Path] = field(default_factory=list)
    """``routerag eval`` folders with the naive modes of these questions: routing labels."""
    plans_from: list[Path] = field(default_factory=list)
    """``routerag plan-outcomes`` files: each question's cheapest best measured plan."""
    refusals: bool = False
    """A question whose answer no retrieved document holds ends with a refusal."""
    extra_searches: float = 0.0
    """Share of questions that search again although the first search found what they need."""
    limit: int | None = None
    """Only the first N questions of each file."""

    def effective_plan(self) -> Literal["gold", "retrieval"]:
        if self.plan not in ("gold", "retrieval"):
            raise ValueError("--plan must be gold or retrieval")
        return "retrieval" if self.routes_from or self.plans_from or self.refusals or self.extra_searches \
            else self.plan


@dataclass(slots=True)
class WarmStartData:
    """The examples and what they were built from (what the CLI reports and the card records)."""

    policy: ResolvedPolicy
    plan: Literal["gold", "retrieval"]
    items: list[QAItem]
    plans: list[list[PlannedSearch]]
    built: list[tuple[QAItem, list[PlannedSearch], TokenSequence]]
    labels: int
    refused: int
    """Examples that end with a refusal (with ``refusals``)."""
    refusals: bool
    measured: bool

    @property
    def examples(self) -> list[TokenSequence]:
        return [ex for _, _, ex in self.built]

    def summary(self) -> str:
        """One line: examples, the plan, the modes of the first and second searches, labels and refusals."""
        first = [pl[0].mode for pl in self.plans if pl]
        second = [pl[1].mode for pl in self.plans if len(pl) > 1]
        return (f"{len(self.built)} warm-start examples from {len(self.items)} questions ({self.plan} plan; first "
                "searches: " + ", ".join(f"{m} {first.count(m)}" for m in MODES)
                + "; second searches: " + ", ".join(f"{m} {second.count(m)}" for m in MODES)
                + (f"; {self.labels} routing labels" if self.labels else "")
                + (f"; {sum(1 for p in self.plans if p)} measured plans" if self.measured else "")
                + (f"; {self.refused} end with a refusal" if self.refusals else "") + ")")


def warm_start_policy(settings: Settings, refusals: bool) -> ResolvedPolicy:
    """The loop (and prompt) the policy will run with, recorded in its card; with refusals the instruction states
    the convention, so the card carries that instruction."""
    policy = training_policy(settings)
    return dataclasses.replace(policy, template=refusal_template(policy.template)) if refusals else policy


def prepare_warm_start(settings: Settings, index: Path, questions: Sequence[Path], opts: WarmStartOptions,
                       tokenizer: Any) -> WarmStartData:
    """Plans and examples for every question (raises ValueError when none is usable)."""
    plan = opts.effective_plan()
    policy = warm_start_policy(settings, opts.refusals)
    labels = {qid: mode for folder in opts.routes_from for qid, mode in routing_labels(folder).items()}
    items = [it for q in questions for it in load_training_items(q, limit=opts.limit)]
    rng = random.Random(settings.train.seed)
    if plan == "gold":
        plans = _gold_plans(items, index, rng)
    elif opts.plans_from:
        plans = _measured_plans(items, index, opts.plans_from)
    else:
        plans = _retrieval_plans(items, index, settings, policy, labels, rng, opts.extra_searches)
    loop = policy.loop
    built = [(it, pl, ex) for it, pl in zip(items, plans)
             if (ex := build_example(it, pl, tokenizer, rng, template=policy.template, k=loop.k,
                                     max_information_tokens=loop.max_information_tokens, refuse=opts.refusals))]
    if not built:
        raise ValueError("no usable examples: the questions need answers (and, for --plan gold, supporting passages "
                         "found in the index)")
    counter = TokenCounter(tokenizer)
    refused = (sum(1 for it, pl in zip(items, plans)
                   if pl and unanswered(it, pl, counter, max_information_tokens=loop.max_information_tokens, k=loop.k))
               if opts.refusals else 0)
    return WarmStartData(policy=policy, plan=plan, items=items, plans=plans, built=built, labels=len(labels),
                         refused=refused, refusals=opts.refusals, measured=bool(opts.plans_from))


def _gold_plans(items: Sequence[QAItem], index: Path, rng: random.Random) -> list[list[PlannedSearch]]:
    """The gold passages (by title, from the index) as if retrieved, in random modes."""
    from graph_index.store import IndexData

    texts: dict[str, str] = {}
    for p in IndexData(index).passages:
        texts.setdefault(p.title, p.text)
    return [gold_plan(it, gold_documents(it, texts), rng) if gold_documents(it, texts) else [] for it in items]


def _measured_plans(items: Sequence[QAItem], index: Path, files: Sequence[Path]) -> list[list[PlannedSearch]]:
    """Each question's measured plan, its documents read back from the index each row was measured over (else
    ``index``)."""
    from contextlib import ExitStack

    from graph_index.store import IndexData

    from .outcomes import labelled_plans, read_outcomes

    rows = [r for f in files for r in read_outcomes(f)]
    folders = dict.fromkeys([index, *(Path(r["index"]) for r in rows if r.get("index"))])
    with ExitStack() as stack:
        passages = [p for f in folders for p in stack.enter_context(IndexData(f)).passages]
        plans = labelled_plans(items, rows, passages)
    log.info("%d of %d questions have a measured plan", sum(1 for p in plans if p), len(items))
    return plans


def _retrieval_plans(items: Sequence[QAItem], index: Path, settings: Settings, policy: ResolvedPolicy,
                     labels: dict[str, str], rng: random.Random, extra_searches: float) -> list[list[PlannedSearch]]:
    """What the retriever returns for each question in every mode, planned in its labelled mode or a random one."""
    from routerag.retrieval import Retriever

    loop = policy.loop
    retriever = Retriever(index, settings.retrieval)
    asked = [it.question for it in items]
    results = {m: retriever.search(asked, mode=m, k=loop.k) for m in MODES}
    # the loop's fresh_documents: a second search asks for k more and leaves the first k out
    again = {m: retriever.search(asked, mode=m, k=2 * loop.k) for m in MODES} if loop.fresh_documents else None
    # its own generator: the plans' and examples' draws stay what they were without extra searches
    draw = random.Random(f"extra-searches-{settings.train.seed}")
    extra = [extra_searches > 0 and draw.random() < extra_searches for _ in items]
    return [retrieval_plan(it, {m: results[m][i] for m in MODES}, rng, labels.get(it.id), k=loop.k,
                           again={m: again[m][i] for m in MODES} if again else None, budget=loop.budget,
                           extra=extra[i])
            for i, it in enumerate(items)]


def write_examples(data: WarmStartData, tokenizer: Any, out: Path) -> Path:
    """The examples as JSON lines (id, question type, searches, the decoded text), to read before training."""
    from graph_index.atomic import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    path = out / EXAMPLES_FILE
    write_text_atomic(path, "".join(
        json.dumps({"id": it.id, "type": it.meta.get("type") or it.meta.get("prop"),
                    "searches": [[p.mode, p.query] for p in pl], "text": tokenizer.decode(ex.ids)}) + "\n"
        for it, pl, ex in data.built))
    return path


def train_warm_start(data: WarmStartData, model: Any, tokenizer: Any, settings: Settings, out: Path, opts:
                     WarmStartOptions, *, epochs: int = 1, lr: float = 2e-4) -> tuple[Path, list[dict[str, Any]]]:
    """Train the adapter on ``data``'s examples; write OUT/adapter with its policy card and OUT/sft_loss.png.
    Returns the adapter folder and the loss history."""
    from .plots import plot_sft
    from .sft import train_sft

    card = card_for(data.policy, {"by": "routerag train-sft", "model": settings.train.model, "plan": data.plan,
                                  "routes_from": [str(p) for p in opts.routes_from] or None,
                                  "plans_from": [str(p) for p in opts.plans_from] or None,
                                  "refusals": opts.refusals, "refusal_examples": data.refused,
                                  "extra_searches": opts.extra_searches, "examples": len(data.built),
                                  "epochs": epochs, "lr": lr})
    hist = train_sft(model, tokenizer, data.examples, out, epochs=epochs, lr=lr, card=card, seed=settings.train.seed)
    folder = out / "adapter"
    write_card(folder, card)
    plot_sft(out / "sft_metrics.jsonl", out / "sft_loss.png")
    return folder, hist
