"""Warm-start labels from measured outcomes (``routerag plan-outcomes``): every question answered by each candidate
plan of searches, with the same retriever and reader the router is served with, and each plan's EM, F1 and answer
recall recorded, so the warm start can teach, per question, the cheapest plan that got the best outcome.

Why: routing labels from one search per mode (:func:`training.data.routing_labels`) can only teach *which mode*;
on multi-hop questions the best mode per question is 10-12 answer-recall points above the best fixed mode, and a
second search for the right entity adds more (issue #36). A label is only worth teaching if a fixed plan reached it,
so plans are measured, not guessed.

Candidate plans (:func:`candidate_plans`), each searched and read as
:func:`routerag.evaluation.strategies.run_plan` does for the naive baselines and ``two-search`` (its
``fixed_searches`` and ``read_plan``; the reader runs once per distinct set of documents), with the policy's reader:

* ``single``: one search of the question in each mode (``passage``, ``graph``, ``hybrid``);
* ``bridge``: a search of the question, then a search of the first entity its top document names that the question
  does not (:func:`~routerag.policy.grounding.new_entity`), in every pair of modes;
* ``entities``: where the question names two or more entities (a comparison), one search per entity
  (:func:`~routerag.policy.grounding.question_entities`, the first two), in each mode.

Every query is the question or a grounded span (a span of the question, a title or entity of a document shown), so
the warm start only teaches queries the grounded loop keeps.

A plan's outcome is (EM, F1, answer recall) of its answer and documents, scored by
:func:`routerag.evaluation.records.score` (an unanswerable question scores 1 when the reader abstains). The label
(:func:`best_plan`) is the plan with the best outcome; among ties, the fewest searches, then the plan that did best
over all the questions of its type (a per-question tie is noise the policy cannot predict from the question), then
the cheapest modes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from routerag.datasets import QAItem
from routerag.evaluation.records import ResultsLog, question_type, read_records, score
from routerag.evaluation.strategies import BRIDGE, PlanStep, fixed_searches, read_plan
from routerag.policy.types import Summary
from routerag.policy.grounding import question_entities
from routerag.vocabulary import MODES, Mode

if TYPE_CHECKING:
    from routerag.engine import Engine

log = logging.getLogger(__name__)

MODE_COST: dict[Mode, int] = {"passage": 0, "graph": 1, "hybrid": 2}
"""The order of the modes' costs per search (docs/training.md): dense, then PageRank, then both."""


@dataclass(frozen=True, slots=True)
class CandidatePlan:
    name: str
    """``graph``, ``graph>passage`` (a bridge plan: the first search's mode, then the second's),
    ``entities:hybrid``."""
    kind: str
    """``single``, ``bridge`` or ``entities``."""
    steps: tuple[PlanStep, ...]


def candidate_plans(question: str, *, second_modes: Sequence[Mode] = MODES) -> list[CandidatePlan]:
    """The plans measured for ``question`` (see the module docstring), cheapest kinds first."""
    plans = [CandidatePlan(m, "single", ((m, question),)) for m in MODES]
    plans += [CandidatePlan(f"{a}>{b}", "bridge", ((a, question), (b, BRIDGE))) for a in MODES for b in second_modes]
    entities = question_entities(question)[:2]
    if len(entities) == 2:
        plans += [CandidatePlan(f"entities:{m}", "entities", tuple((m, e) for e in entities)) for m in MODES]
    return plans


async def measure(engine: Engine, item: QAItem, plans: Sequence[CandidatePlan], *,
                  k: int | None = None) -> dict[str, Any]:
    """One question's row: each plan's searches (mode, query, documents shown) and outcome, and the index searched
    (where ``train-sft --plans-from`` reads the documents back)."""
    rows = []
    top_k = k if k is not None else engine.loop_config.k
    read: dict[tuple[str, ...], Summary] = {}  # plans that showed the same documents get the same answer
    for plan in plans:
        results, searches = await fixed_searches(engine, item.question, plan.steps, top_k)
        shown = tuple(d.id for r in results for d in r.docs)
        if shown not in read:
            read[shown] = await read_plan(engine, item.question, results, searches, top_k)
        summary = replace(read[shown], searches=searches)
        rec = score(item, plan.name, summary, 0.0)
        rows.append({"name": plan.name, "kind": plan.kind,
                     "steps": [[s.mode, s.query] for s in summary.searches],
                     "docs": [[d.id for d in res_docs] for res_docs in _docs_per_search(summary)],
                     "em": rec["em"], "f1": rec["f1"], "answer_recall": rec["answer_recall"],
                     "refused": rec["refused"], "prediction": rec["prediction"]})
    return {"id": item.id, "question": item.question, "type": question_type(item), "answers": item.answers,
            "answerable": item.answerable, "index": str(engine.index) if engine.index is not None else None,
            "plans": rows}


def _docs_per_search(summary: Any) -> list[list[Any]]:
    """The documents each search of a fixed plan showed (its record keeps their titles; the summary keeps them in
    order)."""
    out, at = [], 0
    for s in summary.searches:
        out.append(summary.documents[at: at + len(s.doc_titles)])
        at += len(s.doc_titles)
    return out


async def measure_all(engine: Engine, items: Sequence[QAItem], out: Path, *, k: int | None = None,
                      concurrency: int = 8, second_modes: Sequence[Mode] = MODES) -> list[dict[str, Any]]:
    """Every question's row, appended to ``out`` as it finishes (a rerun measures only the missing questions)."""
    results = ResultsLog(out)
    done = results.load()
    todo = [it for it in items if it.id not in done or done[it.id].get("question") != it.question]
    sem = asyncio.Semaphore(concurrency)
    finished = 0

    async def one(item: QAItem) -> None:
        nonlocal finished
        async with sem:
            row = await measure(engine, item, candidate_plans(item.question, second_modes=second_modes), k=k)
        results.append(row)
        done[item.id] = row
        finished += 1
        if finished % 25 == 0 or finished == len(todo):
            log.info("plan outcomes: %d of %d questions measured (%d resumed)", finished, len(todo),
                     len(items) - len(todo))

    try:
        await asyncio.gather(*(one(it) for it in todo))
    finally:
        results.close()
    return [done[it.id] for it in items]


def read_outcomes(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``plan-outcomes`` file (a torn last line dropped)."""
    return list(read_records(path, required=("id", "question", "plans")))


def outcome(plan: dict[str, Any]) -> tuple[float, float, float]:
    return float(plan["em"]), float(plan["f1"]), float(plan.get("answer_recall") or 0.0)


def plan_cost(plan: dict[str, Any]) -> tuple[int, int]:
    return len(plan["steps"]), sum(MODE_COST.get(m, 0) for m, _ in plan["steps"])


def plan_means(rows: Iterable[dict[str, Any]]) -> dict[tuple[str | None, str], tuple[float, float, float]]:
    """Each (question type, plan name)'s mean outcome: the tie-break that follows what works for a kind of
    question."""
    sums: dict[tuple[str | None, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for row in rows:
        for p in row["plans"]:
            acc = sums[(row.get("type"), p["name"])]
            for i, v in enumerate(outcome(p)):
                acc[i] += v
            acc[3] += 1
    return {key: (a / n, b / n, c / n) for key, (a, b, c, n) in sums.items()}


def best_plan(row: dict[str, Any], means: dict[tuple[str | None, str], tuple[float, float, float]]) -> dict[str, Any]:
    """The plan to teach for this question: the best outcome; among ties the fewest searches, then the best mean
    outcome over the question's type, then the cheapest modes. A question no plan answered gets the single search
    that does best over its type (its trajectory then ends with a refusal or a guess)."""
    # a two-search plan cut to one search (no bridge in its top document) is its single search again
    plans = [p for p in row["plans"] if p["steps"] and (p["kind"] == "single" or len(p["steps"]) > 1)]
    top = max(outcome(p) for p in plans)
    if top == (0.0, 0.0, 0.0):
        plans = [p for p in plans if p["kind"] == "single"] or plans
    tied = [p for p in plans if outcome(p) == top] if top != (0.0, 0.0, 0.0) else plans
    return min(tied, key=lambda p: (len(p["steps"]), tuple(-x for x in means.get((row.get("type"), p["name"]),
                                                                                  (0.0, 0.0, 0.0))), plan_cost(p)))


def labels(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(id, question) → the plan to teach (:func:`best_plan`)."""
    means = plan_means(rows)
    return {(str(r["id"]), r["question"]): best_plan(r, means) for r in rows}


def headroom(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per question type (then ``all``): the best fixed single mode's mean EM and answer recall (the best by EM,
    then answer recall; answer recall over the answerable questions), the same with the best mode chosen per
    question (oracle over modes) and with the best plan per question (oracle over every plan), and how the labels split over plan kinds: how much a router could win
    over one fixed search."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[str(r.get("type"))].append(r)
    groups["all"] = list(rows)
    chosen = labels(rows)
    return [_headroom_row(kind, group, chosen) for kind, group in groups.items()]


def _headroom_row(kind: str, group: list[dict[str, Any]],
                  chosen: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    def mean(values: list[float]) -> float | None:
        return round(100 * sum(values) / len(values), 1) if values else None

    def best_of(r: dict[str, Any], single: bool, i: int) -> float:
        return max((outcome(p)[i] for p in r["plans"] if not single or p["kind"] == "single"), default=0.0)

    answerable = [r for r in group if r.get("answerable", True)]
    fixed = {m: (mean([outcome(_plan(r, m))[0] for r in group]) or 0.0,
                 mean([outcome(_plan(r, m))[2] for r in answerable])) for m in MODES}
    mode = max(fixed, key=lambda m: (fixed[m][0], fixed[m][1] or 0.0))  # EM, then answer recall
    picks = [chosen[(str(r["id"]), r["question"])] for r in group]
    return {"type": kind, "n": len(group), "best_fixed_mode": mode, "fixed_em": fixed[mode][0],
            "fixed_answer_recall": fixed[mode][1],
            "oracle_mode_em": mean([best_of(r, True, 0) for r in group]),
            "oracle_mode_answer_recall": mean([best_of(r, True, 2) for r in answerable]),
            "oracle_plan_em": mean([best_of(r, False, 0) for r in group]),
            "oracle_plan_answer_recall": mean([best_of(r, False, 2) for r in answerable]),
            "labels": {k: sum(1 for p in picks if p["kind"] == k) for k in ("single", "bridge", "entities")},
            "label_searches": round(sum(len(p["steps"]) for p in picks) / len(picks), 2)}


def _plan(row: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in row["plans"] if p["name"] == name)


def labelled_plans(items: Sequence[QAItem], rows: Sequence[dict[str, Any]],
                   passages: Iterable[Any]) -> list[list[Any]]:
    """Each item's warm-start plan (:class:`training.sft.PlannedSearch` steps: the labelled plan's modes, queries and
    the documents its searches showed, read back from the index by id); an empty plan for an item that has no
    outcome row (or whose documents are no longer in the index)."""
    from routerag.retrieval.types import RetrievedDoc

    from .sft import PlannedSearch

    by_id = {p.id: p for p in passages}
    chosen = labels(rows)
    out: list[list[Any]] = []
    for it in items:
        plan = chosen.get((it.id, it.question))
        ids = [i for step in plan["docs"] for i in step] if plan else []
        if plan is None or any(i not in by_id for i in ids):
            out.append([])
            continue
        out.append([PlannedSearch(mode, query, [RetrievedDoc(i, by_id[i].title, by_id[i].text, 1.0) for i in docs])
                    for (mode, query), docs in zip(plan["steps"], plan["docs"])])
    return out
