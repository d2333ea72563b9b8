"""The policy loop (RouteRAG, Algorithm 1), written once and used by the server, evaluation and both trainers.

A trajectory is a small state machine, in the style of verl's ``ToolAgentLoop``: one handler per state, each doing
one thing and returning the next state, with everything the trajectory carries in one :class:`_Run`.

* ``GENERATE``: the policy writes a turn. An answer or a refusal ends it (→ ``ANSWER``); a search goes on
  (→ ``SEARCH``); a turn with neither gets a notice and another try (→ ``GENERATE``) until there were too many, when
  an answer is forced (→ ``FORCE_ANSWER``), as it is for a search past the budget.
* ``SEARCH``: retrieve k documents (with ``fresh_documents``, k not shown before) in the mode the policy chose
  (with ``graph_for_nested``, a described-not-named question's first search in graph mode) and append them as
  ``<information>`` (→ ``GENERATE``); a query the retriever refuses is an invalid turn.
* ``FORCE_ANSWER``: a notice opens the ``<answer>`` the policy then completes (→ ``ANSWER``).
* ``ANSWER``: the reader, when one is configured, writes the final answer from the documents; done. A refusal
  stands: its answer is :data:`~routerag.prompts.REFUSAL_ANSWER` whatever the reader. An extractive reader with
  nothing to read (the policy never searched) first gets one search of the question. With ``search_on_abstain``,
  a reader that abstains first gets the documents of one more search, the loop's (the question, in a mode not used);
  with ``search_options``, a choice question's options the documents leave undecided are searched before it reads;
  with ``search_bridge_below``, an answer read from a free span below that score gets one more search, the bridge
  entity of the first search's top document, and the reader reads again (with ``bridge_for_nested``, any free span
  read of a question that describes what it asks about without naming it). With ``decompose_bridges`` such a
  question is first read in two steps instead (:mod:`.decompose`): the description's own question, then the
  question with that answer in its place, searched and read.

A turn past the response's token budget is not generated: the trajectory is cut off without an answer
(→ ``ANSWER``), which an extractive reader still reads (a forced turn that gave no answer, too). Every turn is
traced (thought, mode, query, documents, timings, tokens). When the backend works on tokens, the context is kept as
token ids too and the trajectory records which tokens the policy generated and which were appended, so a trainer can
mask the information out of the loss.
"""

from __future__ import annotations

import enum
import inspect
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..config import Loop
from ..prompts import (BUDGET_NOTICE, BUDGET_NOTICE_TEXT, DEFAULT_INSTRUCTION, INFORMATION_BLOCK, INVALID_NOTICE,
                       REFUSAL_ANSWER, SEARCH_FAILED_NOTICE, format_documents, user_message)
from ..retrieval.types import QueryError, RetrievalResult, RetrievedDoc
from ..vocabulary import Mode, ReaderPrompt, SegmentKind
from .answering import Reader
from .comparisons import undecided_sides
from .decompose import decompose, names_bridge, names_bridge_entity
from .grounding import QuerySource, ground, new_entity, rewrite_search
from .nesting import is_nested
from .parsing import STOP_STRINGS, Action, close_stop, is_refusal, parse_turn
from .tokens import TokenCounter
from .types import Generation, GenerationRequest, Generator, SearchBackend, Segment, Step, Trajectory

if TYPE_CHECKING:
    from ..config import PolicyConfig
    from .card import ResolvedPolicy
    from .extractive import ReaderAnswer

Event = dict[str, Any]
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
ANSWER_OPEN = "<answer>"
_ANSWER_OPEN = re.compile(re.escape(ANSWER_OPEN), re.IGNORECASE)
ANSWER_PEEK_TOKENS = 5
"""Tokens decoded after ``<answer>`` when a reader will write the answer: ``" [refuse]"`` is four."""
EventSink = Callable[[Event], Awaitable[None] | None]
ABSTAIN_MODES: dict[Mode | None, tuple[Mode, ...]] = {
    "passage": ("graph",), "graph": ("passage",), "hybrid": ("passage", "graph"), None: ("graph", "passage")}
"""``search_on_abstain``'s mode after a first search in each mode (None: no search yet)."""
UNSEARCHED_MODE: Mode = "graph"
"""The mode of the loop's search when the policy answered without any: the best single mode pooled
(docs/results.md)."""


@dataclass(frozen=True, slots=True)
class LoopConfig(Loop):
    """One trajectory's rules: the loop settings (:class:`~routerag.config.Loop`, documented with their bounds in
    :class:`~routerag.config.LoopSettings`) and what runs them: the template, the reader, a forced mode."""

    force_mode: Mode | None = None
    """Use this retrieval mode for every search whatever the policy wrote (RouteRAG's Table 2 ablations)."""
    temperature: float | None = None
    template: str = DEFAULT_INSTRUCTION
    answer_generator: Generator | None = None
    """The reader's model, which writes the final answer from the retrieved documents (s3's design): a frozen model,
    or the policy's own base model with its adapter off (``reader = "base"``); None: the policy's ``<answer>``."""
    reader_prompt: ReaderPrompt = "instruct"
    """How the reader is asked (:class:`~routerag.policy.answering.Reader`)."""
    extractive_reader: Any = None
    """The extractive reader (:class:`~routerag.policy.extractive.ExtractiveReader`) when ``reader =
    "extractive"``: it answers instead of ``answer_generator``."""
    short_answer: bool = False
    """Cut the final answer to the span of the retrieved documents it names (:mod:`.short_answer`)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reader(self) -> Reader:
        """The final answer's reader (its model is None when the policy's own answer stands)."""
        return Reader(self.answer_generator, self.reader_prompt, self.short_answer, self.extractive_reader)

    @classmethod
    def from_policy(cls, policy: PolicyConfig, resolved: ResolvedPolicy | None = None, **overrides: Any) -> LoopConfig:
        """The loop the ``[policy]`` settings describe, every unset setting taken from the policy's card (see
        :mod:`routerag.policy.card`; ``resolved``: already looked up): the server's, and, with the trainer's loop
        settings and temperature as ``overrides``, the trainers', so a policy is trained on the prompt template it
        is served with."""
        from .card import resolve_policy

        resolved = resolved or resolve_policy(policy)
        fields: dict[str, Any] = {**resolved.loop, "temperature": policy.generator.temperature,
                                  "template": resolved.template, "reader_prompt": resolved.reader_prompt,
                                  "short_answer": resolved.short_answer}
        if resolved.reader == "extractive" and "extractive_reader" not in overrides:
            from .extractive import load_reader

            fields["extractive_reader"] = load_reader(
                str(policy.extractive_reader) if policy.extractive_reader else None, policy.abstain_below)
        return cls(**{**fields, **overrides})


class State(enum.Enum):
    """Where a trajectory is (see the module's docstring)."""

    GENERATE = "generate"
    SEARCH = "search"
    FORCE_ANSWER = "force_answer"
    ANSWER = "answer"
    DONE = "done"


@dataclass(slots=True)
class _Run:
    """One trajectory while it runs: its rules, its record, and the context the policy has seen so far."""

    cfg: LoopConfig
    traj: Trajectory
    on_event: EventSink | None
    message: str | None
    """What a chat API sends as the user's message (None: the caller brought its own rendered prompt)."""
    prompt_chars: int
    """``text[prompt_chars:]`` is the response so far (a chat API's assistant message)."""
    text: str
    ids: list[int] | None
    """The same context as token ids, when the backend works on tokens (a new list at every append: requests
    already sent keep theirs)."""
    response_tokens: int = 0
    invalid: int = 0
    pending: tuple[Step, Action] | None = None
    """The turn whose search ``SEARCH`` runs."""


def doc_key(doc: RetrievedDoc) -> str:
    """What makes two retrieved documents the same one: the id, or title and text where a backend gives none."""
    return doc.id or f"{doc.title}\n{doc.text}"


def unseen_documents(docs: Sequence[RetrievedDoc], shown: set[str], k: int) -> list[RetrievedDoc]:
    """The first ``k`` of ``docs`` not yet shown (``fresh_documents``): the loop asks the retriever for ``k`` more
    per document already shown, so a repeated search still brings ``k`` new ones where the index has them (the warm
    start builds its second searches with it too)."""
    return [d for d in docs if doc_key(d) not in shown][:k]


def information_block(docs: Sequence[RetrievedDoc], counter: TokenCounter, max_tokens: int) -> str:
    """``<information>Doc i (Title: …) text …</information>``, cut to ``max_tokens`` of the policy's tokens: what a
    search appends to the context (the warm start builds its examples with it too)."""
    return INFORMATION_BLOCK.format(documents=counter.truncate(format_documents(docs), max_tokens))


class PolicyLoop:
    """Runs trajectories. Safe to call concurrently: each call keeps its own state, and concurrent calls share the
    backend's batching (generation) and the search backend's batching (retrieval)."""

    def __init__(self, generator: Generator, search: SearchBackend, config: LoopConfig | None = None) -> None:
        self.generator = generator
        self.search = search
        self.cfg = config or LoopConfig()
        self.counter = TokenCounter(generator.tokenizer)
        self._handlers = {State.GENERATE: self._generate, State.SEARCH: self._search,
                          State.FORCE_ANSWER: self._force_answer, State.ANSWER: self._answer}

    async def run(self, question: str, *, on_event: EventSink | None = None,
                  prompt: tuple[str, list[int] | None] | None = None, **overrides: Any) -> Trajectory:
        """One trajectory for ``question``. ``prompt`` (text, ids) replaces the rendered chat prompt (verl builds its
        own); ``overrides`` replace LoopConfig fields for this call (budget, k, force_mode, temperature)."""
        run = self._start(question, replace(self.cfg, **overrides) if overrides else self.cfg, prompt, on_event)
        state = State.GENERATE
        while state is not State.DONE:
            state = await self._handlers[state](run)
        return run.traj

    def _start(self, question: str, cfg: LoopConfig, prompt: tuple[str, list[int] | None] | None,
               on_event: EventSink | None) -> _Run:
        traj = Trajectory(question=question)
        message = None
        if prompt is None:
            message = user_message(cfg.template, question)
            text, ids = self.generator.render_prompt(message)
        else:
            text, ids = prompt
        track = self.generator.tracks_tokens and ids is not None
        traj.segments.append(Segment("prompt", text, list(ids) if ids is not None else None))
        return _Run(cfg, traj, on_event, message, len(text), text, list(ids) if track and ids is not None else None)

    # -- the states ---------------------------------------------------------------------------------------------------

    async def _generate(self, run: _Run) -> State:
        """The policy's turn: an answer, a refusal, a search, or an invalid turn."""
        turn = await self._turn(run, forced=False)
        if turn is None:
            return State.ANSWER
        text, gen, step = turn
        drafted = gen.finish_reason != "peek" or "</answer>" in text.lower()
        action = parse_turn(text if drafted else text + "</answer>")  # a peeked answer is closed to be read
        step.thought = action.thought
        if action.thought:
            await _emit(run.on_event, {"type": "think", "text": action.thought, "step": step.index})
        if action.kind in ("answer", "refuse"):
            refused = action.kind == "refuse"
            step.action, step.answer = action.kind, action.content if drafted or refused else None
            run.traj.steps.append(step)
            run.traj.policy_answer = step.answer
            run.traj.finish = "refused" if refused else "answer"
            await _emit(run.on_event, {"type": "draft", "text": REFUSAL_ANSWER if refused else step.answer,
                                       "forced": False, "refused": refused})
            return State.ANSWER
        if action.kind == "invalid":
            step.action = "truncated" if gen.finish_reason == "length" else "invalid"
            run.traj.steps.append(step)
            state = self._count_invalid(run)
            if state is State.GENERATE:
                self._inform(run, INVALID_NOTICE)
            return state
        if run.traj.searches >= run.cfg.budget:  # a search past the budget is not run: the answer is forced instead
            step.action, step.query = "over_budget", action.content
            run.traj.steps.append(step)
            return State.FORCE_ANSWER
        if run.cfg.query == "grounded":
            action = self._ground(run, step, text, action)
        if run.cfg.graph_for_nested:
            action = self._route_nested(run, step, action)
        run.pending = (step, action)
        return State.SEARCH

    async def _search(self, run: _Run, *, fresh: bool = False) -> State:
        """The search the last turn asked for, in the mode it chose (or the forced one), appended as information;
        ``fresh`` (the loop's bridge hop): only documents not shown yet, whatever ``fresh_documents`` says."""
        assert run.pending is not None
        (step, action), run.pending = run.pending, None
        mode = run.cfg.force_mode or action.mode or "passage"
        step.action, step.query, step.mode, step.mode_tags = "search", action.content, mode, list(action.mode_tags)
        await _emit(run.on_event, {"type": "search", "mode": mode, "tags": list(action.mode_tags),
                                   "query": action.content, "step": step.index, "by_loop": step.by_loop})
        fresh = fresh or run.cfg.fresh_documents
        shown = {doc_key(d) for r in run.traj.retrieved for d in r.docs} if fresh else set()
        t0 = time.perf_counter()
        try:
            result = await self.search.search(action.content, mode, run.cfg.k + len(shown))
        except QueryError as exc:  # the policy wrote a query the retriever refuses: its turn, not the caller's
            step.action = "invalid"
            run.traj.steps.append(step)
            self._inform(run, SEARCH_FAILED_NOTICE.format(error=exc))
            return self._count_invalid(run)
        step.retrieval_ms = round(result.ms if result.timings_ms else (time.perf_counter() - t0) * 1000, 3)
        if shown:
            result = replace(result, docs=unseen_documents(result.docs, shown, run.cfg.k))
        step.doc_ids = [d.id for d in result.docs]
        step.doc_titles = [d.title for d in result.docs]
        run.traj.retrieved.append(result)
        info = information_block(result.docs, self.counter, run.cfg.max_information_tokens)
        step.information_tokens = self.counter.count(info)
        run.traj.steps.append(step)
        await _emit(run.on_event, {"type": "information", "step": step.index, "mode": mode, "retrieval_ms":
                                   step.retrieval_ms, "docs": [d.to_json() for d in result.docs]})
        self._append(run, "information", info)
        run.response_tokens += step.information_tokens
        return State.GENERATE

    async def _force_answer(self, run: _Run) -> State:
        """Prime the answer (a notice, then an opened ``<answer>`` tag) and let the policy complete it."""
        self._inform(run, BUDGET_NOTICE)
        turn = await self._turn(run, forced=True)
        if turn is None:
            return State.ANSWER
        text, _, step = turn
        # a model that writes a new turn instead of continuing (a chat server that cannot continue a message) opens
        # the <answer> tag again: the answer follows the last one
        body = _THINK_BLOCK.sub(" ", text.split("</answer>")[0])
        answer = " ".join(_ANSWER_OPEN.split(body)[-1].split())
        step.action, step.thought = "forced_answer", parse_turn(text).thought
        run.traj.steps.append(step)
        # a small model may just echo the notice; a forced refusal is no answer (only the policy's own choice refuses)
        if answer and answer.lower() not in BUDGET_NOTICE_TEXT and not is_refusal(answer):
            step.answer = run.traj.policy_answer = answer
            run.traj.finish = "forced_answer"
        else:
            run.traj.finish = "no_answer"
        await _emit(run.on_event, {"type": "draft", "text": step.answer, "forced": True, "refused": False})
        return State.ANSWER

    async def _answer(self, run: _Run) -> State:
        """The final answer: the reader's when one is configured, else the policy's (cut to a span when asked). A
        refusal stands over a reader that cannot refuse (a generator always writes something); a reader that abstains
        on its own (the extractive one) decides instead, as it does for an answer: measured on held-out sets, the
        135M router refused 21-48% of questions, many of them with the answer in its documents
        (docs/research/2026-11-27-router-outcomes.md). It also reads a trajectory cut off without an answer (a
        forced turn that gave none): the policy's draft is never its answer, so a missing draft loses nothing the
        documents hold (7 of 787 training trajectories,
        docs/research/2026-11-29-refusal-rules-on-the-routers-own-trajectories.md)."""
        traj, reader = run.traj, run.cfg.reader
        traj.answer = traj.policy_answer
        if traj.refused and reader.extractive is None:
            traj.answer = REFUSAL_ANSWER
        elif reader.reads and (traj.finish != "no_answer" or reader.extractive is not None):
            if reader.extractive is not None:
                await self._search_unsearched(run)
                await self._search_options(run)
            read = await self._read_bridged(run) or await self._read_with_hops(run)
            if read.abstained:  # a refusal, as the harness counts it; the policy's answer is not used
                traj.answer, traj.finish = REFUSAL_ANSWER, "refused"
            else:
                traj.answer, traj.citation = read.answer, read.citation
                if traj.finish == "refused":  # the policy's draft was a refusal (its step says so); the reader answered
                    traj.finish = "answer"
                elif traj.finish == "no_answer":  # cut off without a draft: the answer was forced, the reader's
                    traj.finish = "forced_answer"
        elif traj.answer:
            traj.answer = reader.shorten(traj.question, traj.answer, self.read_documents(traj.retrieved, run.cfg))
        # the one answer a caller gets, labelled: the policy's draft (its `draft` event) may differ from it
        await _emit(run.on_event, {"type": "answer", "text": traj.answer, "answered_by": traj.answered_by,
                                   "refused": traj.refused})
        await _emit(run.on_event, {"type": "done", "answer": traj.answer, "searches": traj.searches,
                                   "finish": traj.finish})
        return State.DONE

    async def _read_with_hops(self, run: _Run) -> ReaderAnswer:
        """The reader's answer to the question, after the loop's own searches the settings ask for
        (``search_on_abstain``, ``search_bridge_below``)."""
        read = await self._read(run)
        if read.abstained and await self._search_on_abstain(run):
            read = await self._read(run)
        if await self._search_bridge(run, read):
            read = await self._read(run)
        return read

    async def _read_bridged(self, run: _Run) -> ReaderAnswer | None:
        """``decompose_bridges``: a question describing what it asks about is read in two steps
        (:mod:`.decompose`): the description, asked as a question, from the documents so far; then, when that gave
        a name, the question with the name in its place, searched in the first search's mode and read from that
        search's documents. That answer stands only when the page it was read from names the found entity (a word of
        it): else it was read off a page about someone else, and the whole question is read from the documents before
        the second search. None when the question has no description, the first read gave no name, or the budget or
        the search leaves nothing to read: the question is then read as usual."""
        traj, cfg = run.traj, run.cfg
        first = next((s for s in traj.steps if s.action == "search"), None)
        if not cfg.decompose_bridges or cfg.reader.extractive is None or first is None or first.mode is None \
                or traj.searches >= cfg.budget or not traj.retrieved:
            return None
        parts = decompose(traj.question)
        if parts is None:
            return None
        bridge = await self._read(run, parts.inner)
        if bridge.abstained or bridge.kind != "span" or not names_bridge(bridge.answer or "", traj.question):
            return None
        before = len(traj.retrieved)
        await self._search_by_loop(run, parts.outer(bridge.answer or ""), first.mode, "bridged_question",
                                   doc=bridge.citation.id if bridge.citation else None)
        if len(traj.retrieved) == before or not traj.retrieved[-1].docs:
            return None
        traj.steps[-1].asked = parts.inner
        read = await self._read(run, traj.steps[-1].query, traj.retrieved[-1:])
        if read.abstained or names_bridge_entity(read, traj.retrieved[-1].docs, bridge.answer or ""):
            return read
        return await self._read(run, None, traj.retrieved[:-1])  # read from a page about someone else: read whole

    async def _read(self, run: _Run, question: str | None = None,
                    results: list[RetrievalResult] | None = None) -> ReaderAnswer:
        """The reader's answer to ``question`` (the trajectory's) from the documents of ``results`` (every search
        so far); the extractive reader reads whole documents: it is cheap, and a cut can drop the answer."""
        traj, reader = run.traj, run.cfg.reader
        t0 = time.perf_counter()
        docs = self.read_documents(traj.retrieved if results is None else results, run.cfg,
                                   cut=reader.extractive is None)
        read = await reader.read_answer(question or traj.question, docs)
        traj.answer_generation_ms = round(traj.answer_generation_ms + (time.perf_counter() - t0) * 1000, 3)
        traj.answered_by = "reader"
        return read

    async def _search_by_loop(self, run: _Run, query: str, mode: Mode, source: QuerySource, *,
                              doc: str | None = None, fresh: bool = False) -> None:
        """One search the loop makes, not the policy: traced as ``by_loop``, with where its query came from (``doc``:
        the document it is a span of); ``fresh``: it shows only documents not shown yet."""
        step = Step(len(run.traj.steps), "search", query_source=source, query_doc=doc, by_loop=True)
        run.pending = (step, Action("search", "", query, mode))
        await self._search(run, fresh=fresh)

    async def _search_unsearched(self, run: _Run) -> None:
        """The extractive reader only reads documents: when the policy answered without any search (a refusal the
        reader cannot make for want of anything to read), the loop searches the question first, in
        :data:`UNSEARCHED_MODE` (a forced mode stays forced), if the budget allows."""
        if run.traj.retrieved or run.traj.searches >= run.cfg.budget:
            return
        await self._search_by_loop(run, run.traj.question, UNSEARCHED_MODE, "question")

    async def _search_on_abstain(self, run: _Run) -> bool:
        """``search_on_abstain``: search the question in a mode not used yet, if the budget allows; True when the
        search brought documents the reader has not read."""
        if not run.cfg.search_on_abstain or run.cfg.force_mode or run.traj.searches >= run.cfg.budget:
            return False  # a forced mode has no other mode to try
        used = [s.mode for s in run.traj.steps if s.action == "search"]
        mode = next((m for m in ABSTAIN_MODES[used[0] if used else None] if m not in used), None)
        if mode is None:
            return False
        before = len(run.traj.retrieved)
        await self._search_by_loop(run, run.traj.question, mode, "question")
        return len(run.traj.retrieved) > before and bool(run.traj.retrieved[-1].docs)

    async def _search_bridge(self, run: _Run, read: ReaderAnswer) -> bool:
        """``search_bridge_below``: when the extractive reader answers with a free span scoring below it, search the
        bridge, the first entity the first search's top document names that the question does not
        (:func:`~routerag.policy.grounding.new_entity`), in that search's mode, for documents not shown yet, if the
        budget allows; True when that brought documents to read. Why: a multi-hop question's answer is often on the
        page of an entity its first documents name, and the reader is unsure exactly there; a sure answer is not
        searched again, so single-hop questions keep their one search. Not after an abstention: hopping from those
        turned right refusals of unanswerable questions into answers on the training draws
        (docs/research/2026-11-29-a-bridge-hop-when-the-reader-is-unsure.md; ``search_on_abstain`` is for those).
        ``bridge_for_nested``: a question that describes what it asks about without naming it hops after any free
        span read, abstentions included: it is a bridge by its form, whatever the reader's score."""
        retrieved = run.traj.retrieved
        if run.cfg.reader.extractive is None or read.kind != "span":
            return False
        unsure = not read.abstained and read.score < run.cfg.search_bridge_below
        if not (unsure or run.cfg.bridge_for_nested and is_nested(run.traj.question)):  # the parse only when needed
            return False
        first = next((s for s in run.traj.steps if s.action == "search"), None)
        if first is None or first.mode is None or not retrieved or not retrieved[0].docs \
                or run.traj.searches >= run.cfg.budget:
            return False
        top = retrieved[0].docs[0]
        bridge = new_entity(run.traj.question, top)
        if bridge is None:
            return False
        before = len(retrieved)
        await self._search_by_loop(run, bridge, first.mode, "title" if bridge == top.title else "entity", doc=top.id,
                                   fresh=True)
        return len(retrieved) > before and bool(retrieved[-1].docs)

    async def _search_options(self, run: _Run) -> None:
        """``search_options``: search each option of a choice question the documents leave undecided (undated, or
        unmentioned), or with a reader that compares values each side of a comparison (a yes/no one too) they give
        no value for, in the mode of the first search (a forced mode stays forced), while the budget allows; not
        when the policy answered without searching."""
        used = [s.mode for s in run.traj.steps if s.action == "search"]
        if not run.cfg.search_options or not used:
            return
        docs = [d for r in run.traj.retrieved for d in r.docs]
        searched = {s.query for s in run.traj.steps if s.action == "search"}
        compare_values = bool(getattr(run.cfg.reader.extractive, "compare_values", False))  # the reader's card says
        for option in undecided_sides(run.traj.question, docs, compare_values):
            if run.traj.searches >= run.cfg.budget:
                return
            if option in searched:  # searched already, in the same mode: the same documents again
                continue
            await self._search_by_loop(run, option, used[0], "question_span")

    # -- one turn of the policy ----------------------------------------------------------------------------------------

    async def _turn(self, run: _Run, *, forced: bool) -> tuple[str, Generation, Step] | None:
        """Generate one turn and append it; None (with a ``truncated`` step) when the response has no tokens left."""
        cfg = run.cfg
        remaining = cfg.max_total_tokens - run.response_tokens
        if remaining <= 0:
            run.traj.steps.append(Step(len(run.traj.steps), "truncated"))
            run.traj.finish = "no_answer"
            return None
        t0 = time.perf_counter()
        cut = not forced and cfg.reader.reads and run.ids is not None
        limit = min(cfg.max_turn_tokens, remaining)
        gen = await self.generator.generate(GenerationRequest(
            prompt_text=run.text, prompt_ids=run.ids, max_tokens=limit,
            stop=("</answer>",) if forced else STOP_STRINGS + ((ANSWER_OPEN,) if cut else ()),
            temperature=cfg.temperature, user_message=run.message, response_text=run.text[run.prompt_chars:]))
        if cut and gen.token_ids is not None and gen.text.endswith(ANSWER_OPEN):
            gen = await self._peek_answer(run, gen, limit - len(gen.token_ids))
        gen_ms = (time.perf_counter() - t0) * 1000
        text = gen.text
        if gen.token_ids is None and gen.finish_reason == "stop":
            # a completions server cut the stop string that fired: put the closing tag back
            text = close_stop(text)
            if forced and "</answer>" not in text:
                text += "</answer>"  # its opening tag was in the notice, where close_stop cannot see it
        self._append_generation(run, text, gen)
        completion = gen.completion_tokens or self.counter.count(text)
        run.response_tokens += completion
        return text, gen, Step(len(run.traj.steps), "invalid", generation_ms=round(gen_ms, 3),
                               prompt_tokens=gen.prompt_tokens, completion_tokens=completion)

    async def _peek_answer(self, run: _Run, gen: Generation, room: int) -> Generation:
        """The first tokens of an answer the reader will replace: enough to tell a refusal (which stands) from an
        answer (whose draft nobody reads). Why: the draft is a whole turn of decoding, most of the policy's time per
        question once a fast reader answers."""
        assert run.ids is not None and gen.token_ids is not None
        if room <= 0:
            return gen
        peek = await self.generator.generate(GenerationRequest(
            prompt_text=run.text + gen.text, prompt_ids=run.ids + list(gen.token_ids),
            max_tokens=min(ANSWER_PEEK_TOKENS, room), stop=("</answer>", "]"), temperature=run.cfg.temperature,
            user_message=run.message, response_text=run.text[run.prompt_chars:] + gen.text))
        logprobs = (list(gen.logprobs) + list(peek.logprobs)) if gen.logprobs and peek.logprobs else None
        return Generation(gen.text + peek.text, list(gen.token_ids) + list(peek.token_ids or []), logprobs,
                          "peek", gen.prompt_tokens,
                          (gen.completion_tokens or len(gen.token_ids)) + (peek.completion_tokens or 0))

    def _ground(self, run: _Run, step: Step, text: str, action: Action) -> Action:
        """Keep the query if it is grounded, else search the closest allowed one and write that into the turn, so the
        context shows what was searched (the turn's token ids are re-encoded and its log-probabilities dropped:
        the policy did not write the replacement)."""
        shown = [d for res in run.traj.retrieved for d in res.docs]
        g = ground(action.content, run.traj.question, shown)
        step.query_source, step.query_doc, step.query_generated = g.source, g.doc_id, g.generated
        if not g.replaced:
            return action
        self._replace_last_generation(run, text, rewrite_search(text, g.query))
        return replace(action, content=g.query)

    def _route_nested(self, run: _Run, step: Step, action: Action) -> Action:
        """``graph_for_nested``: the first search of a question that describes what it asks about without naming
        it goes to the graph, and the turn is rewritten to say so (see the setting's docstring for why)."""
        if run.traj.searches or run.cfg.force_mode or action.mode == "graph" or not is_nested(run.traj.question):
            return action
        old = run.traj.segments[-1].text
        self._replace_last_generation(run, old, rewrite_search(old, action.content, ("graph",)))
        step.mode_generated = action.mode or "passage"
        return replace(action, mode="graph", mode_tags=("graph",))

    def _replace_last_generation(self, run: _Run, old: str, new: str) -> None:
        seg = run.traj.segments[-1]
        assert seg.kind == "policy" and run.text.endswith(old)
        run.text = run.text[: len(run.text) - len(old)] + new
        seg.text, seg.logprobs = new, None
        if run.ids is not None and seg.token_ids is not None:
            ids = self.counter.encode(new)
            run.ids = run.ids[: len(run.ids) - len(seg.token_ids)] + ids
            seg.token_ids = ids

    def _count_invalid(self, run: _Run) -> State:
        """One more invalid turn: past ``max_invalid`` the answer is forced, else the policy tries again."""
        run.invalid += 1
        return State.FORCE_ANSWER if run.invalid > run.cfg.max_invalid else State.GENERATE

    # -- context bookkeeping ----------------------------------------------------------------------------------------

    def information_block(self, result: RetrievalResult) -> str:
        """A search's ``<information>`` block under this loop's settings (:func:`information_block`)."""
        return information_block(result.docs, self.counter, self.cfg.max_information_tokens)

    def read_documents(self, results: list[RetrievalResult], cfg: LoopConfig | None = None, *,
                       cut: bool = True) -> list[RetrievedDoc]:
        """The documents a reader gets: every distinct document the searches returned, in retrieval order, each cut
        (unless ``cut`` is False) to its share of an information block (``max_information_tokens / k``), so the
        reader reads about what the policy read, and a 1,000-token page does not make every prompt of a padded
        batch 1,000 tokens longer."""
        cfg = cfg or self.cfg
        share = max(cfg.max_information_tokens // max(cfg.k, 1), 16)
        seen: set[str] = set()
        out = []
        for res in results:
            for d in res.docs:
                key = doc_key(d)
                if key not in seen:
                    seen.add(key)
                    out.append(RetrievedDoc(d.id, d.title, self.counter.truncate(d.text, share) if cut else d.text,
                                            d.score))
        return out

    def _inform(self, run: _Run, text: str) -> None:
        """Append what the loop (not the policy) writes, and count it against the response's tokens."""
        self._append(run, "information", text)
        run.response_tokens += self.counter.count(text)

    def _append(self, run: _Run, kind: SegmentKind, text: str) -> None:
        ids = self.counter.encode(text) if run.ids is not None else None
        run.traj.segments.append(Segment(kind, text, ids))
        run.text += text
        if run.ids is not None and ids is not None:
            run.ids = run.ids + ids

    def _append_generation(self, run: _Run, text: str, gen: Generation) -> None:
        logprobs = list(gen.logprobs) if gen.logprobs else None
        if run.ids is not None:
            ids = list(gen.token_ids) if gen.token_ids is not None else self.counter.encode(text)
            run.traj.segments.append(Segment("policy", text, ids, logprobs))
            run.ids = run.ids + ids
        else:
            run.traj.segments.append(Segment("policy", text, None, logprobs))
        run.text += text


async def _emit(sink: EventSink | None, event: Event) -> None:
    if sink is None:
        return
    res = sink(event)
    if inspect.isawaitable(res):
        await res
