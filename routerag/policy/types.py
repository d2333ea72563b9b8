"""Data that flows through the policy loop: generation requests and results, and the finished trajectory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from graph_index.llm_clients import UpstreamError as UpstreamError  # defined with the client factory; re-exported here
from ..retrieval import RetrievalResult
from ..vocabulary import Finish, Mode, SegmentKind, StepAction


@dataclass(slots=True)
class GenerationRequest:
    prompt_text: str
    """The whole context so far, as text (what a completions endpoint receives)."""
    prompt_ids: list[int] | None
    """The same context as token ids, for backends that work on tokens (exact, no re-tokenisation drift)."""
    max_tokens: int
    stop: tuple[str, ...]
    temperature: float | None = None
    """None: the backend's configured temperature."""
    user_message: str | None = None
    """The user message ``prompt_text`` was rendered from, for chat APIs, which take messages and apply the
    template themselves; None when the caller brought its own rendered prompt (verl)."""
    response_text: str = ""
    """The running response after the rendered prompt (the policy's turns and the appended information): what a
    chat API gets as the assistant message to continue. ``prompt_text`` is the rendered prompt plus this."""
    adapter: bool = True
    """False: generate with the model's LoRA adapter switched off, i.e. its base weights (the in-process transformers
    backend; the policy's base model as a reader shares the router's weights)."""
    logprobs: bool = False
    """Return each generated token's log-probability (costs a vocabulary-wide score per step and sequence: with
    500-token turns in a batch of 16 that is gigabytes, so only callers that use them ask)."""


@dataclass(slots=True)
class Generation:
    text: str
    """The generated text, including the stop string when one fired."""
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    """``stop`` (one of the request's stop strings fired), ``eos`` (end of sequence) or ``length`` (max tokens).
    Backends that cannot tell a stop string from the end of sequence report ``stop`` only when the text leaves a
    ``<search>`` or ``<answer>`` tag open, which is what a cut-off stop string looks like."""
    prompt_tokens: int = 0
    completion_tokens: int = 0


@runtime_checkable
class Generator(Protocol):
    """A policy backend. ``tokenizer`` (a Hugging Face tokenizer or None) lets the loop count and, for training,
    tokenise the information it appends; ``tracks_tokens`` says whether it honours ``prompt_ids`` and returns
    ``token_ids``."""

    name: str
    tracks_tokens: bool
    tokenizer: Any

    def render_prompt(self, user_message: str) -> tuple[str, list[int] | None]:
        """Apply the chat template: the text (and ids) after which the assistant writes."""
        ...

    async def generate(self, request: GenerationRequest) -> Generation: ...


@runtime_checkable
class SearchBackend(Protocol):
    """Where the loop's searches go: the in-process retriever (batched) or a remote ``/retrieve`` server."""

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult: ...


@dataclass(slots=True)
class Segment:
    kind: SegmentKind
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


@dataclass(slots=True)
class Step:
    """One turn: what the policy thought and did, and what it cost."""

    index: int
    action: StepAction
    thought: str = ""
    mode: Mode | None = None
    mode_tags: list[str] = field(default_factory=list)
    query: str | None = None
    answer: str | None = None
    doc_ids: list[str] = field(default_factory=list)
    doc_titles: list[str] = field(default_factory=list)
    retrieval_ms: float = 0.0
    generation_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    information_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        # a shallow copy: the fields are plain values and lists of strings (asdict deep-copies recursively)
        return {f: (list(v) if isinstance(v, list) else v) for f in self.__dataclass_fields__
                for v in (getattr(self, f),)}


@dataclass(slots=True)
class Trajectory:
    question: str
    answer: str | None = None
    """The final answer (from the answer generator when one is configured)."""
    policy_answer: str | None = None
    """What the policy itself wrote in ``<answer>`` (differs from ``answer`` only with an answer generator)."""
    steps: list[Step] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    finish: Finish = "no_answer"
    retrieved: list[RetrievalResult] = field(default_factory=list)
    """Every search's result, in order (documents with scores and retrieval timings)."""
    answer_generation_ms: float = 0.0
    """Time of the separate answer generator's call (s3), when one is configured; part of ``generation_ms``."""

    @property
    def searches(self) -> int:
        return sum(1 for s in self.steps if s.action == "search")

    @property
    def retrieval_ms(self) -> float:
        return round(sum(s.retrieval_ms for s in self.steps), 3)

    @property
    def generation_ms(self) -> float:
        return round(sum(s.generation_ms for s in self.steps) + self.answer_generation_ms, 3)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.steps)

    @property
    def queries(self) -> list[tuple[str, Mode]]:
        return [(s.query, s.mode) for s in self.steps if s.action == "search" and s.query and s.mode]

    @property
    def format_ok(self) -> bool:
        """The policy answered in the required format on its own, without invalid turns or forcing."""
        return self.finish == "answer" and not any(s.action in ("invalid", "truncated", "over_budget")
                                                   for s in self.steps)

    @property
    def text(self) -> str:
        """The whole conversation after the prompt (what a reward sees as the solution)."""
        return "".join(s.text for s in self.segments if s.kind != "prompt")

    def trace(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.steps]
