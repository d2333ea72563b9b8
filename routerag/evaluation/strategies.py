"""How one question is answered under each evaluated strategy, and what that cost.

* ``learned``: the policy routes every search itself (RouteRAG).
* ``passage`` / ``graph`` / ``hybrid``: the same policy, but every search is forced into that retrieval mode
  (RouteRAG's Table 2 ablations): the loop still decides *whether* and *what* to search.
* ``naive-rag``: one retrieval of the question itself (the settings' retrieval mode, hybrid by default; k documents,
  3 by default), then one answer from those documents by the same reader as the policy's final answer: the
  fixed-pipeline baseline every RAG paper reports. ``naive-passage``, ``naive-graph`` and ``naive-hybrid`` fix the
  mode (one search in each fixed mode).
* ``two-search``: a fixed two-hop pipeline: one search of the question, then one search of the first entity its
  top document names that the question does not (:func:`~routerag.policy.grounding.new_entity`: the bridge), for
  documents not shown yet, both in the settings' retrieval mode; the reader reads both searches' documents.
* ``no-retrieval``: the model answers from its own knowledge (the floor retrieval must beat).

All strategies go through the engine's backends, so concurrent questions share its generation and retrieval
batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, get_args

from graph_index.config import SettingsError

from ..policy.answering import Reader, answer_directly
from ..policy.grounding import new_entity
from ..policy.loop import doc_key, unseen_documents
from ..policy.tokens import TokenCounter
from ..policy.types import Generation, GenerationRequest, Generator, SearchRecord, Summary
from ..prompts import REFUSAL_ANSWER
from ..vocabulary import ASK_MODES, MODES, AskMode, Mode

if TYPE_CHECKING:
    from ..engine import Engine
    from ..retrieval.types import RetrievalResult

Strategy = Literal[AskMode, "naive-rag", "naive-passage", "naive-graph", "naive-hybrid", "two-search",
                   "no-retrieval"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
NAIVE_STRATEGIES: dict[str, Mode | None] = {"naive-rag": None, **{f"naive-{m}": m for m in MODES}}
"""One search of the question itself in a fixed mode (None: the settings' ``retrieval.mode``), then the reader."""
POLICY_STRATEGIES: tuple[Strategy, ...] = ASK_MODES
"""Strategies that run the policy loop (and so have a format to get right)."""
TWO_SEARCH: Strategy = "two-search"
NO_RETRIEVAL: Strategy = "no-retrieval"
"""The strategy that never retrieves (its recall is undefined rather than 0)."""


def parse_strategies(spec: str | list[str] | tuple[str, ...]) -> list[Strategy]:
    """``"learned,naive-rag"`` (or a list) → validated strategies in the given order, without repeats."""
    parts = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in s.split(",")]
    out: list[Strategy] = []
    for p in (p.strip().lower() for p in parts):
        if not p:
            continue
        if p not in STRATEGIES:
            raise SettingsError(f"unknown mode {p!r}; choose from {', '.join(STRATEGIES)}")
        if p not in out:
            out.append(p)  # type: ignore[arg-type]
    if not out:
        raise SettingsError(f"no modes given; choose from {', '.join(STRATEGIES)}")
    return out


class MeteredGenerator:
    """Delegates to a generator and adds up the time and tokens of its calls, because ``answer_from_documents``
    and ``answer_directly`` return only the answer text. One per question, so concurrent questions don't mix."""

    def __init__(self, inner: Generator) -> None:
        self.inner = inner
        self.name = inner.name
        self.tracks_tokens = inner.tracks_tokens
        self.tokenizer = inner.tokenizer
        self._counter = TokenCounter(inner.tokenizer)
        self.generation_ms = 0.0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def render_prompt(self, user_message: str) -> tuple[str, list[int] | None]:
        return self.inner.render_prompt(user_message)

    async def generate(self, request: GenerationRequest) -> Generation:
        t0 = time.perf_counter()
        gen = await self.inner.generate(request)
        self.generation_ms += (time.perf_counter() - t0) * 1000
        # the same accounting as the policy loop: the backend's counts, else count the reply ourselves
        self.prompt_tokens += gen.prompt_tokens
        self.completion_tokens += gen.completion_tokens or self._counter.count(gen.text)
        return gen


async def run_strategy(engine: Engine, question: str, strategy: Strategy, *, budget: int | None = None,
                       k: int | None = None) -> Summary:
    """Answer ``question`` with ``strategy``. ``budget`` and ``k`` override the policy settings (``k`` is also the
    number of documents naive RAG retrieves)."""
    if strategy in POLICY_STRATEGIES:
        traj = await engine.ask(question, mode=strategy, budget=budget, k=k)  # type: ignore[arg-type]
        return traj.summary()
    if strategy in NAIVE_STRATEGIES or strategy == TWO_SEARCH:
        mode: Mode = NAIVE_STRATEGIES.get(strategy) or engine.settings.retrieval.mode
        steps: list[PlanStep] = [(mode, question)] + ([(mode, BRIDGE)] if strategy == TWO_SEARCH else [])
        return await run_plan(engine, question, steps, k=k)
    if strategy == NO_RETRIEVAL:
        # the policy's reader model (the answer generator, the policy's base model, or the policy model itself)
        gen = MeteredGenerator(engine.loop_config.reader.generator or engine.generator)
        answer = await answer_directly(gen, question)
        return Summary(answer, "answer", generation_ms=round(gen.generation_ms, 3), prompt_tokens=gen.prompt_tokens,
                       completion_tokens=gen.completion_tokens)
    raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


BRIDGE = None
"""A plan step's query that is the bridge: the first entity the previous search's top document names that the
question does not (:func:`~routerag.policy.grounding.new_entity`)."""
PlanStep = tuple[Mode, "str | None"]
"""One search of a fixed plan: its mode, and its query (:data:`BRIDGE`: taken from the previous search)."""


async def run_plan(engine: Engine, question: str, steps: Sequence[PlanStep], *, k: int | None = None) -> Summary:
    """A fixed plan of searches (the naive baselines, two-search, and the warm start's candidate plans,
    :mod:`training.outcomes`), then one answer from all their documents by the policy's reader."""
    top_k = k if k is not None else engine.loop_config.k
    results, searches = await fixed_searches(engine, question, steps, top_k)
    return await read_plan(engine, question, results, searches, top_k)


async def read_plan(engine: Engine, question: str, results: list[RetrievalResult], searches: list[SearchRecord],
                    top_k: int) -> Summary:
    """The answer to a fixed plan's searches by the policy's reader (model, prompt, short-answer step), as a
    summary of the plan."""
    reader = engine.loop_config.reader
    gen = MeteredGenerator(reader.generator or engine.generator)
    docs = engine.loop.read_documents(results, replace(engine.loop_config, k=top_k), cut=reader.extractive is None)
    t1 = time.perf_counter()
    read = await Reader(gen, reader.prompt, reader.short_answer, reader.extractive).read_answer(question, docs)
    reader_ms = gen.generation_ms if reader.extractive is None else (time.perf_counter() - t1) * 1000
    # the extractive reader's abstention is a refusal, as in the loop
    return Summary(REFUSAL_ANSWER if read.abstained else read.answer, "refused" if read.abstained else "answer",
                   searches=searches, documents=[d for r in results for d in r.docs],
                   generation_ms=round(reader_ms, 3), prompt_tokens=gen.prompt_tokens,
                   completion_tokens=gen.completion_tokens, citation=read.citation, answered_by="reader")


async def fixed_searches(engine: Engine, question: str, steps: Sequence[PlanStep],
                         top_k: int) -> tuple[list[RetrievalResult], list[SearchRecord]]:
    """The searches of a fixed plan, each showing only documents not shown before (the loop's
    ``fresh_documents``); a bridge step with no previous document, or no new entity in it, ends the plan."""
    results: list[RetrievalResult] = []
    searches: list[SearchRecord] = []
    for mode, query in steps:
        if query is BRIDGE:
            query = new_entity(question, results[-1].docs[0]) if results and results[-1].docs else None
            if query is None:
                break
        shown = {doc_key(d) for r in results for d in r.docs}
        t0 = time.perf_counter()
        res = await engine.search.search(query, mode, top_k + len(shown))
        ms = res.ms if res.timings_ms else (time.perf_counter() - t0) * 1000
        res = replace(res, docs=unseen_documents(res.docs, shown, top_k))
        results.append(res)
        searches.append(SearchRecord(mode, query, round(ms, 3), [d.title for d in res.docs]))
    return results, searches
