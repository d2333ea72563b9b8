"""Data that flows through the policy loop: generation requests and results, the finished trajectory, and its
summary (the one view of a trajectory the server, ``routerag ask``, evaluation and the rewards read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from graph_index.llm_clients import UpstreamError as UpstreamError  # defined with the client factory; re-exported here
from ..retrieval.types import RetrievalResult, RetrievedDoc
from ..vocabulary import AnsweredBy, Finish, Mode, SegmentKind, StepAction

if TYPE_CHECKING:
    from .citations import Citation


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
    ``<search>`` or ``<answer>`` tag open, which is what a cut-off stop string looks like. The loop marks ``peek``
    an answer turn it stopped after its first tokens (a reader writes the answer)."""
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
    query_source: str | None = None
    """Where a grounded query came from (``question``, ``question_span``, ``title``, ``entity``, ``noun_chunk``:
    :mod:`.grounding`; the loop's ``bridged_question``: :mod:`.decompose`); None with free queries."""
    query_doc: str | None = None
    """The id of the document a grounded query is a span of (None: the question)."""
    query_generated: str | None = None
    """What the policy wrote, when grounding replaced it."""
    mode_generated: Mode | None = None
    """The mode the policy wrote, when the loop searched the graph instead (``graph_for_nested``)."""
    asked: str | None = None
    """For a ``bridged_question`` search (``decompose_bridges``): the question the reader answered first, whose
    answer stands in this query in place of the description."""
    by_loop: bool = False
    """The loop ran this search, not the policy: the reader had abstained (``search_on_abstain``), or the search is
    for an option of a choice question (``search_options``)."""
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
    """The final answer (from the answer generator when one is configured; for a refusal,
    :data:`~routerag.prompts.REFUSAL_ANSWER`)."""
    policy_answer: str | None = None
    """The policy's draft: what it wrote in ``<answer>`` (differs from ``answer`` only with a reader, a shortened
    answer, or a refusal)."""
    answered_by: AnsweredBy = "policy"
    """Who wrote ``answer``: the reader (extractive or generator) or the policy itself (its draft, maybe shortened)."""
    steps: list[Step] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    finish: Finish = "no_answer"
    retrieved: list[RetrievalResult] = field(default_factory=list)
    """Every search's result, in order (documents with scores and retrieval timings)."""
    answer_generation_ms: float = 0.0
    """Time of the separate answer generator's call (s3), when one is configured; part of ``generation_ms``."""
    citation: Citation | None = None
    """Where the extractive reader read the answer (its document and sentence); None: cited by string match."""

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
    def refused(self) -> bool:
        """The policy said, on its own, that the documents do not answer the question (a forced answer never is)."""
        return self.finish == "refused"

    @property
    def format_ok(self) -> bool:
        """The policy answered (or refused) in the required format on its own, without invalid turns or forcing."""
        return self.finish in ("answer", "refused") and not any(s.action in ("invalid", "truncated", "over_budget")
                                                   for s in self.steps)

    @property
    def text(self) -> str:
        """The whole conversation after the prompt (what a reward sees as the solution)."""
        return "".join(s.text for s in self.segments if s.kind != "prompt")

    def trace(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.steps]

    def summary(self) -> Summary:
        return Summary.from_trajectory(self)


@dataclass(frozen=True, slots=True)
class SearchRecord:
    """One search a trajectory made: its mode and query, what it cost and the titles it brought back."""

    mode: Mode
    query: str
    retrieval_ms: float
    doc_titles: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Summary:
    """What a question's answering came to: the answer, how it ended, every search and document, and the cost.

    Made once from a :class:`Trajectory` (:meth:`from_trajectory`), or directly by a strategy that runs no policy
    (evaluation's naive baselines), and read by every consumer: the server's response and ``routerag ask --json``
    (:meth:`to_json`), evaluation records and the rewards' :class:`~training.rewards.Rollout`."""

    answer: str | None
    finish: Finish
    format_ok: bool | None = None
    """The policy answered in format on its own (no invalid turn, no forcing); None when no policy ran."""
    generation_ms: float = 0.0
    """Time spent waiting for generations, the reader's included."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    searches: list[SearchRecord] = field(default_factory=list)
    documents: list[RetrievedDoc] = field(default_factory=list)
    """Every retrieved document in retrieval order, repeats included."""
    trace: list[dict[str, Any]] = field(default_factory=list)
    """The policy's steps (:meth:`Step.to_json`); empty when no policy ran."""
    citation: Citation | None = None
    """The document and sentence the extractive reader read the answer in; None: cite by string match."""
    draft: str | None = None
    """The policy's own answer (its ``<answer>``), which a reader may have replaced; None when no policy answered."""
    answered_by: AnsweredBy = "policy"
    """Who wrote ``answer``: ``reader`` or ``policy``."""

    @classmethod
    def from_trajectory(cls, traj: Trajectory) -> Summary:
        searches = [SearchRecord(s.mode or "passage", s.query or "", s.retrieval_ms, list(s.doc_titles))
                    for s in traj.steps if s.action == "search"]
        return cls(answer=traj.answer, finish=traj.finish, format_ok=traj.format_ok, searches=searches,
                   documents=[d for res in traj.retrieved for d in res.docs], generation_ms=traj.generation_ms,
                   prompt_tokens=traj.prompt_tokens, completion_tokens=traj.completion_tokens, trace=traj.trace(),
                   citation=traj.citation, draft=traj.policy_answer, answered_by=traj.answered_by)

    @property
    def retrieval_ms(self) -> float:
        return round(sum(s.retrieval_ms for s in self.searches), 3)

    @property
    def refused(self) -> bool:
        """The policy refused: ``answer`` is :data:`~routerag.prompts.REFUSAL_ANSWER`, not an answer to score."""
        return self.finish == "refused"

    def to_json(self) -> dict[str, Any]:
        """The answer with its cost and trace, as ``/ask`` answers it (less the request's total time) and
        ``routerag ask --json`` prints it."""
        return {"answer": self.answer, "answered_by": self.answered_by, "draft": self.draft,
                "finish": self.finish, "refused": self.refused, "searches": len(self.searches),
                "retrieval_ms": self.retrieval_ms, "generation_ms": self.generation_ms,
                "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens},
                "citations": [{"id": c.id, "title": c.title, "sentence": c.sentence} for c in self.citations()],
                "trace": self.trace}

    def citations(self) -> list[Citation]:
        """Where the extractive reader read the answer, else the retrieved passages that state it
        (:func:`~routerag.policy.citations.cite`); none for a refusal."""
        from .citations import cite

        if self.refused:
            return []
        return [self.citation] if self.citation is not None else cite(self.answer, self.documents)
