"""The policy loop (RouteRAG, Algorithm 1), written once and used by the server, evaluation and both trainers.

Generate until ``</search>``, ``</answer>`` or the end of the sequence; on a search, retrieve k documents in the mode
the policy chose and append them as ``<information>``; after the search budget, force an answer. Every turn is traced
(thought, mode, query, documents, timings, tokens). When the backend works on tokens, the context is kept as token
ids too and the trajectory records which tokens the policy generated and which were appended, so a trainer can
mask the information out of the loss.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import LOOP_DEFAULTS
from ..retrieval import QueryError, RetrievalResult, RetrievedDoc
from ..vocabulary import Mode, ReaderPrompt
from .answering import Reader, format_documents
from .parsing import STOP_STRINGS, close_stop, parse_turn
from .prompt import DEFAULT_INSTRUCTION, user_message
from .tokens import TokenCounter
from .types import Generation, GenerationRequest, Generator, SearchBackend, Segment, Step, Trajectory

if TYPE_CHECKING:
    from ..config import PolicyConfig
    from .card import ResolvedPolicy

Event = dict[str, Any]
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
EventSink = Callable[[Event], Awaitable[None] | None]

INVALID_NOTICE = ("\nMy previous action is invalid. To search, I should put the query between <search> and "
                  "</search>. To give the final answer, I should put it between <answer> and </answer>. "
                  "Let me try again.\n")
BUDGET_NOTICE = "\n\n<information>The search budget is used up. I must answer now.</information>\n\n<answer>"
_NOTICE_TEXT = "the search budget is used up. i must answer now."


@dataclass(slots=True)
class LoopConfig:
    """One trajectory's rules. The six loop settings are documented, and their defaults set, once, in
    :class:`routerag.config.LoopSettings` / :data:`~routerag.config.LOOP_DEFAULTS`."""

    budget: int = LOOP_DEFAULTS["budget"]
    k: int = LOOP_DEFAULTS["k"]
    max_information_tokens: int = LOOP_DEFAULTS["max_information_tokens"]
    max_turn_tokens: int = LOOP_DEFAULTS["max_turn_tokens"]
    max_total_tokens: int = LOOP_DEFAULTS["max_total_tokens"]
    max_invalid: int = LOOP_DEFAULTS["max_invalid"]
    force_mode: Mode | None = None
    """Use this retrieval mode for every search whatever the policy wrote (RouteRAG's Table 2 ablations)."""
    temperature: float | None = None
    template: str = DEFAULT_INSTRUCTION
    answer_generator: Generator | None = None
    """The reader's model, which writes the final answer from the retrieved documents (s3's design): a frozen model,
    or the policy's own base model with its adapter off (``reader = "base"``); None: the policy's ``<answer>``."""
    reader_prompt: ReaderPrompt = "instruct"
    """How the reader is asked (:class:`~routerag.policy.answering.Reader`)."""
    short_answer: bool = False
    """Cut the final answer to the span of the retrieved documents it names (:mod:`.short_answer`)."""

    @property
    def reader(self) -> Reader:
        """The final answer's reader (its model is None when the policy's own answer stands)."""
        return Reader(self.answer_generator, self.reader_prompt, self.short_answer)
    extra: dict[str, Any] = field(default_factory=dict)

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
        return cls(**{**fields, **overrides})


class PolicyLoop:
    """Runs trajectories. Safe to call concurrently: each call keeps its own state, and concurrent calls share the
    backend's batching (generation) and the search backend's batching (retrieval)."""

    def __init__(self, generator: Generator, search: SearchBackend, config: LoopConfig | None = None) -> None:
        self.generator = generator
        self.search = search
        self.cfg = config or LoopConfig()
        self.counter = TokenCounter(generator.tokenizer)

    async def run(self, question: str, *, on_event: EventSink | None = None,
                  prompt: tuple[str, list[int] | None] | None = None, **overrides: Any) -> Trajectory:
        """One trajectory for ``question``. ``prompt`` (text, ids) replaces the rendered chat prompt (verl builds its
        own); ``overrides`` replace LoopConfig fields for this call (budget, k, force_mode, temperature)."""
        cfg = self.cfg
        if overrides:
            from dataclasses import replace

            cfg = replace(cfg, **overrides)
        traj = Trajectory(question=question)
        message: str | None = None  # what a chat API sends as the user's message (None: the caller's own prompt)
        if prompt is None:
            message = user_message(cfg.template, question)
            text, ids = self.generator.render_prompt(message)
        else:
            text, ids = prompt
        prompt_chars = len(text)  # ctx_text[prompt_chars:] is the response so far (a chat API's assistant message)
        track = self.generator.tracks_tokens and ids is not None
        ctx_text, ctx_ids = text, (list(ids) if track and ids is not None else None)
        traj.segments.append(Segment("prompt", text, list(ids) if ids is not None else None))
        response_tokens = 0
        forced = False
        must_answer = False
        invalid = 0
        while True:
            if must_answer and not forced:
                # prime the answer: a notice, then an opened <answer> tag the policy completes
                forced = True
                appended = BUDGET_NOTICE
                ctx_text, ctx_ids = self._append(traj, "information", appended, ctx_text, ctx_ids)
                response_tokens += self.counter.count(appended)
            remaining = cfg.max_total_tokens - response_tokens
            if remaining <= 0:
                traj.steps.append(Step(len(traj.steps), "truncated"))
                traj.finish = "no_answer"
                break
            t0 = time.perf_counter()
            gen = await self.generator.generate(GenerationRequest(
                prompt_text=ctx_text, prompt_ids=ctx_ids, max_tokens=min(cfg.max_turn_tokens, remaining),
                stop=("</answer>",) if forced else STOP_STRINGS, temperature=cfg.temperature,
                user_message=message, response_text=ctx_text[prompt_chars:]))
            gen_ms = (time.perf_counter() - t0) * 1000
            out_text = gen.text
            if gen.token_ids is None and gen.finish_reason == "stop":
                # a completions server cut the stop string that fired: put the closing tag back
                out_text = close_stop(out_text)
                if forced and "</answer>" not in out_text:
                    out_text += "</answer>"  # its opening tag was in the notice, where close_stop cannot see it
            ctx_text, ctx_ids = self._append_generation(traj, out_text, gen, ctx_text, ctx_ids)
            response_tokens += gen.completion_tokens or self.counter.count(out_text)
            step = Step(len(traj.steps), "invalid", generation_ms=round(gen_ms, 3), prompt_tokens=gen.prompt_tokens,
                        completion_tokens=gen.completion_tokens or self.counter.count(out_text))
            if forced:
                # the <answer> tag was opened in the notice; a model that writes a new turn instead of continuing
                # (a chat server that cannot continue a message) opens it again: the answer follows the last one
                body = _THINK_BLOCK.sub(" ", out_text.split("</answer>")[0])
                answer = " ".join(_ANSWER_OPEN.split(body)[-1].split())
                step.action, step.thought = "forced_answer", parse_turn(out_text).thought
                traj.steps.append(step)
                if answer and answer.lower() not in _NOTICE_TEXT:  # a small model may just echo the notice
                    step.answer = traj.policy_answer = answer
                    traj.finish = "forced_answer"
                else:
                    traj.finish = "no_answer"
                await _emit(on_event, {"type": "answer", "text": step.answer, "forced": True})
                break
            action = parse_turn(out_text)
            step.thought = action.thought
            if action.thought:
                await _emit(on_event, {"type": "think", "text": action.thought, "step": step.index})
            if action.kind == "answer":
                step.action, step.answer = "answer", action.content
                traj.steps.append(step)
                traj.policy_answer = action.content
                traj.finish = "answer"
                await _emit(on_event, {"type": "answer", "text": action.content, "forced": False})
                break
            if action.kind == "invalid":
                step.action = "truncated" if gen.finish_reason == "length" else "invalid"
                traj.steps.append(step)
                invalid += 1
                if invalid > cfg.max_invalid:
                    must_answer = True
                    continue
                ctx_text, ctx_ids = self._append(traj, "information", INVALID_NOTICE, ctx_text, ctx_ids)
                response_tokens += self.counter.count(INVALID_NOTICE)
                continue
            if traj.searches >= cfg.budget:  # a search past the budget is not run: the answer is forced instead
                step.action, step.query = "over_budget", action.content
                traj.steps.append(step)
                must_answer = True
                continue
            mode = cfg.force_mode or action.mode or "passage"
            step.action, step.query, step.mode, step.mode_tags = "search", action.content, mode, list(action.mode_tags)
            await _emit(on_event, {"type": "search", "mode": mode, "tags": list(action.mode_tags),
                                   "query": action.content, "step": step.index})
            t1 = time.perf_counter()
            try:
                result = await self.search.search(action.content, mode, cfg.k)
            except QueryError as exc:  # the policy wrote a query the retriever refuses: its turn, not the caller's
                step.action = "invalid"
                traj.steps.append(step)
                invalid += 1
                notice = f"\n\n<information>That search failed: {exc}.</information>\n\n"
                ctx_text, ctx_ids = self._append(traj, "information", notice, ctx_text, ctx_ids)
                response_tokens += self.counter.count(notice)
                if invalid > cfg.max_invalid:
                    must_answer = True
                continue
            step.retrieval_ms = round(result.ms if result.timings_ms else (time.perf_counter() - t1) * 1000, 3)
            step.doc_ids = [d.id for d in result.docs]
            step.doc_titles = [d.title for d in result.docs]
            traj.retrieved.append(result)
            info = self.information_block(result)
            step.information_tokens = self.counter.count(info)
            traj.steps.append(step)
            await _emit(on_event, {"type": "information", "step": step.index, "mode": mode, "retrieval_ms":
                                   step.retrieval_ms, "docs": [d.to_json() for d in result.docs]})
            ctx_text, ctx_ids = self._append(traj, "information", info, ctx_text, ctx_ids)
            response_tokens += step.information_tokens
        traj.answer = traj.policy_answer
        reader = cfg.reader
        docs = self.read_documents(traj.retrieved, cfg)
        if reader.generator is not None and traj.finish != "no_answer":
            t0 = time.perf_counter()
            traj.answer = await reader.read(traj.question, docs)
            traj.answer_generation_ms = round((time.perf_counter() - t0) * 1000, 3)
        elif traj.answer:
            traj.answer = reader.shorten(traj.question, traj.answer, docs)
        await _emit(on_event, {"type": "done", "answer": traj.answer, "searches": traj.searches,
                               "finish": traj.finish})
        return traj

    # -- context bookkeeping ----------------------------------------------------------------------------------------

    def information_block(self, result: RetrievalResult) -> str:
        """``<information>Doc i (Title: …) text …</information>``, cut to ``max_information_tokens``."""
        body = self.counter.truncate(format_documents(result.docs), self.cfg.max_information_tokens)
        return f"\n\n<information>{body}</information>\n\n"

    def read_documents(self, results: list[RetrievalResult], cfg: LoopConfig | None = None) -> list[RetrievedDoc]:
        """The documents a reader gets: every distinct document the searches returned, in retrieval order, each cut
        to its share of an information block (``max_information_tokens / k``), so the reader reads about what the
        policy read, and a 1,000-token page does not make every prompt of a padded batch 1,000 tokens longer."""
        cfg = cfg or self.cfg
        share = max(cfg.max_information_tokens // max(cfg.k, 1), 16)
        seen: set[str] = set()
        out = []
        for res in results:
            for d in res.docs:
                key = d.id or f"{d.title}\n{d.text}"
                if key not in seen:
                    seen.add(key)
                    out.append(RetrievedDoc(d.id, d.title, self.counter.truncate(d.text, share), d.score))
        return out

    def _append(self, traj: Trajectory, kind: str, text: str, ctx_text: str,
                ctx_ids: list[int] | None) -> tuple[str, list[int] | None]:
        ids = self.counter.encode(text) if ctx_ids is not None else None
        traj.segments.append(Segment(kind, text, ids))  # type: ignore[arg-type]
        return ctx_text + text, (ctx_ids + ids if ctx_ids is not None and ids is not None else ctx_ids)

    def _append_generation(self, traj: Trajectory, text: str, gen: Generation, ctx_text: str,
                           ctx_ids: list[int] | None) -> tuple[str, list[int] | None]:
        if ctx_ids is not None:
            ids = list(gen.token_ids) if gen.token_ids is not None else self.counter.encode(text)
            traj.segments.append(Segment("policy", text, ids, list(gen.logprobs) if gen.logprobs else None))
            return ctx_text + text, ctx_ids + ids
        traj.segments.append(Segment("policy", text, None, list(gen.logprobs) if gen.logprobs else None))
        return ctx_text + text, None


async def _emit(sink: EventSink | None, event: Event) -> None:
    if sink is None:
        return
    res = sink(event)
    if inspect.isawaitable(res):
        await res
