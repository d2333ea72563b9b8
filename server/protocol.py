"""The REST API's request and response models, and nothing else (serving logic lives in :mod:`server.service`
and :mod:`server.routers`).

Kept apart from the app, as vLLM's ``entrypoints/openai/protocol.py`` is, so clients, tests and benchmarks can import
the wire format without importing the server. The request models carry only the limits that never change
(``k >= 1``); the configured maxima (question length, budget, k, queries per ``/retrieve``) are bound per app by
:func:`request_models`, which makes subclasses whose field constraints both enforce the limits (HTTP 422 with a
message) and publish them in the OpenAPI schema.

``/retrieve`` speaks Search-R1's retriever protocol (``queries``, ``topk``, ``return_scores`` in; ``result`` out,
each document with ``id``, ``title``, ``text`` and Search-R1's ``contents`` = ``"Title"`` line + text), plus our
``mode`` field and per-query retrieval compute time ``ms``.

The schema states what the server enforces and nothing less: text that must not be blank carries a ``pattern`` (at
least one character Python does not count as whitespace), so a request the schema calls valid is not refused later.
The events of a streamed ``/ask`` have models too (:data:`STREAM_EVENTS`), published in the OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from routerag.config import ServerConfig
from routerag.policy.types import Summary
from routerag.vocabulary import AnsweredBy, AskMode, Finish, Mode


def _valid_text(v: str) -> str:
    """Reject text that later code cannot encode: lone surrogates (legal in JSON escapes, not in UTF-8) would
    otherwise fail deep inside a tokenizer as a server error."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text contains invalid Unicode (a lone surrogate)") from None
    return v


def _non_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must contain non-whitespace characters")
    return v


NON_BLANK_PATTERN = r"[^\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
"""A character that is not whitespace by Python's ``str.isspace`` (what the retriever strips), written so that JSON
Schema (ECMA-262), Python's ``re`` and pydantic's Rust regex read it alike. Published only: the validator below
enforces the same rule with a readable message."""

NonBlank = Annotated[str, Field(json_schema_extra={"pattern": NON_BLANK_PATTERN}), AfterValidator(_valid_text),
                     AfterValidator(_non_blank)]
Question = NonBlank


def bounded_text(max_chars: int | None) -> Any:
    """:data:`NonBlank` with at most ``max_chars`` characters, checked on the string itself, before the validators
    (a bound added after them would be reported as "at most N items")."""
    if not max_chars:
        return NonBlank
    return Annotated[str, Field(max_length=max_chars, json_schema_extra={"pattern": NON_BLANK_PATTERN}),
                     AfterValidator(_valid_text), AfterValidator(_non_blank)]


INDEX_FIELD = "The served index to use (`GET /indexes`); may be omitted when the server serves one."


# -- /ask -------------------------------------------------------------------------------------------------------------


class AskRequest(BaseModel):
    """One question for the routing policy. Unknown fields are rejected so a typo (``top_k``) is not silently
    ignored. Types are strict: ``"3"`` is not a number and ``"true"`` is not a boolean."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: Question = Field(min_length=1, description="The question to answer.")
    budget: int | None = Field(None, ge=0, description="Searches before an answer is forced (server default if null).")
    k: int | None = Field(None, ge=1, description="Documents per search (server default if null).")
    mode: AskMode = Field("learned", description="`learned`: the policy routes each search; `passage`, `graph` or "
                                                 "`hybrid` force that retrieval mode for every search.")
    stream: bool = Field(False, description="Answer with Server-Sent Events (one event per step) instead of JSON.")
    index: str | None = Field(None, description=INDEX_FIELD)


class TokenUsage(BaseModel):
    prompt: int
    completion: int


class CitationOut(BaseModel):
    id: str
    title: str
    sentence: str


class AskResponse(BaseModel):
    """The answer with its full trace: every step's thought, action, retrieval mode, query, documents and timings."""

    answer: str | None = Field(description="The final answer: the one to show (written by `answered_by`).")
    answered_by: AnsweredBy = Field("policy", description=(
        "Who wrote `answer`: `reader` (a reader that read the retrieved documents) or `policy` (its draft, maybe "
        "cut to a span)."))
    draft: str | None = Field(None, description=(
        "The policy's draft: what it wrote in `<answer>` (the `answer` field of the trace's last step). A reader may "
        "replace it, so it can differ from `answer`; show `answer`."))
    trace: list[dict[str, Any]] = Field(description="One object per policy step (see the `Step` fields: index, "
                                                    "action, thought, mode, query, answer (the policy's draft, on "
                                                    "an answer step), doc_ids, doc_titles, retrieval_ms, "
                                                    "generation_ms, tokens).")
    searches: int
    retrieval_ms: float = Field(description="Retrieval compute time of all searches.")
    generation_ms: float = Field(description="Time spent waiting for the policy's generations.")
    total_ms: float = Field(description="Server-side time of the whole request, from parsed body to trajectory.")
    tokens: TokenUsage
    finish: Finish
    refused: bool = Field(False, description=(
        "The policy said that the retrieved documents do not answer the question (`finish` is `refused`); `answer` "
        "then says so in a sentence, and is not an answer to the question."))
    citations: list[CitationOut] = Field(default_factory=list, description=(
        "The retrieved passages that state the answer, each with its first sentence that does (the answer, "
        "normalised as for EM, as a whole-token span of the sentence); empty when no retrieved passage states it."))

    @classmethod
    def from_summary(cls, summary: Summary, total_ms: float) -> AskResponse:
        """The wire form of a finished trajectory's summary (``/ask``, the chat endpoint's ``routerag`` field, MCP)."""
        return cls(**summary.to_json(), total_ms=round(total_ms, 3))


# -- /retrieve --------------------------------------------------------------------------------------------------------


class RetrieveRequest(BaseModel):
    """Search-R1's retriever request plus ``mode``. Unknown fields are rejected, as ``/ask`` rejects them: a
    misspelt ``top_k`` would otherwise be silently answered with the default ``topk``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[NonBlank] = Field(min_length=1, description="Queries, retrieved together in one batch; none may be "
                                                              "empty or blank.")
    topk: int | None = Field(None, ge=1, description="Documents per query (the retrieval default if null).")
    return_scores: bool = Field(False, description="Wrap each document as {document, score}.")
    mode: Mode | None = Field(None, description="passage, graph or hybrid (server default if null).")
    index: str | None = Field(None, description=INDEX_FIELD)


class Document(BaseModel):
    id: str
    title: str
    text: str
    contents: str = Field(description='Search-R1\'s form: `"Title"` on the first line, then the text.')


class ScoredDocument(BaseModel):
    document: Document
    score: float


class ShardStatus(BaseModel):
    url: str
    ok: bool
    ms: float
    error: str | None = None


class RetrieveResponse(BaseModel):
    result: list[list[ScoredDocument]] | list[list[Document]] = Field(
        description="Per query, its documents best first: {document, score} with return_scores, else bare documents.")
    ms: list[float] = Field(description="Per query, its share of the batch's retrieval compute time.")
    mode: Mode
    shards: list[ShardStatus] | None = Field(None, description=(
        "A sharded index (`routerag serve --shards`): how each shard answered; the result merges those that did "
        "(passage by score; graph by PageRank mass from one seeding of all shards, hybrid fusing the two; by "
        "Reciprocal Rank Fusion over shards that do not serve /retrieve/shard)."))


class ShardStageRequest(BaseModel):
    """Between a sharded front server (``routerag serve --shards``) and its shards: the two stages of a graph search
    seeded once for all shards (``routerag/retrieval/shard_seeds.py``). ``seeds``: each shard's raw seeding
    candidates per query; ``rank``: PageRank from the global seeding given, scores comparable across shards."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[NonBlank] = Field(min_length=1, max_length=1024, description="Queries, one batch.")
    stage: Literal["seeds", "rank"]
    seeds: list[dict[str, dict[str, float]]] | None = Field(
        None, description="``rank``: per query {passages: {id: weight}, entities: {name: weight}}.")
    topk: int = Field(10, ge=1, le=1000)
    index: str | None = Field(None, description=INDEX_FIELD)


class ShardStageResponse(BaseModel):
    seeds: list[dict[str, Any]] | None = Field(None, description="``seeds``: per query, this shard's candidates.")
    result: list[list[ScoredDocument]] | None = Field(None, description="``rank``: per query, its documents.")


# -- errors and probes ------------------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    type: str = Field(description="validation_error, invalid_query, authentication_error, request_too_large, "
                                  "unsupported_media_type, overloaded, timeout, backend_error, not_found, "
                                  "method_not_allowed, not_ready or internal_error (and client_disconnected, with "
                                  "status 499, in the logs and metrics of a request whose client left); "
                                  "`invalid_request_error` for a chat request OpenAI's API would refuse.")
    message: str
    param: str | None = Field(None, description="The request field at fault, when one is (OpenAI's `param`).")
    code: str | None = Field(None, description="A finer reason, when there is one (OpenAI's `code`, e.g. "
                                               "`unsupported_parameter`, `unsupported_value`).")


class ErrorResponse(BaseModel):
    """Every error the server returns has this shape."""

    error: ErrorDetail


class StatusResponse(BaseModel):
    status: str


class IndexInfo(BaseModel):
    name: str
    passages: int | None = Field(description="None for a sharded index (its shards report their own).")
    version: str = Field(description="The index version being served (it changes when an ingestion job lands).")
    memory_mb: float = Field(description="Its loaded search structures (vectors, FAISS, facts, PageRank operator, "
                                         "texts), not the shared models.")
    jobs_pending: int = Field(description="Ingestion jobs queued or running on it.")


class IndexList(BaseModel):
    indexes: list[IndexInfo]


class HealthResponse(StatusResponse):
    rss_mb: float = Field(description="The whole process's resident memory.")
    indexes: list[IndexInfo] = Field(default_factory=list,
                                     description="Per served index (only those the caller's key may read).")


# -- ingestion ----------------------------------------------------------------------------------------------------------

JobState = Literal["queued", "running", "done", "failed"]
JobOp = Literal["add", "delete"]


class Job(BaseModel):
    """An ingestion job as ``GET /jobs/{id}`` reports it."""

    id: str
    index: str
    op: JobOp
    state: JobState
    created: float = Field(description="Unix time of acceptance.")
    started: float | None = None
    finished: float | None = None
    counts: dict[str, int] = Field(default_factory=dict, description=(
        "add: records and uploaded (distinct passages in the upload), added, duplicates (already indexed); delete: "
        "requested, deleted; both, once done: passages (in the index after the job)."))
    error: str | None = Field(None, description="Why the job failed; a bad record is named by its line "
                                                "(`body:LINE: reason`).")
    resumed: int = Field(0, description="Times the job was started again after a server restart.")


class DocumentPage(BaseModel):
    """A page of ``GET /documents``."""

    index: str
    total: int = Field(description="Documents matching `q` (all of the index's without it).")
    offset: int
    limit: int
    q: str | None = Field(None, description="The search the page was filtered by, if any.")
    documents: list[Document]


class JobAccepted(BaseModel):
    job: str = Field(description="The job's id: poll `GET /jobs/{job}`.")
    index: str
    state: JobState


class DeleteDocuments(BaseModel):
    """A batch delete: ``POST /documents/delete``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[NonBlank] = Field(min_length=1, max_length=100_000, description="Passage ids to remove.")
    index: str | None = Field(None, description=INDEX_FIELD)


# -- OpenAI-compatible chat ---------------------------------------------------------------------------------------------


class ChatContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ChatContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content if p.type == "text" and p.text)
        return self.content or ""


class ChatStreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request. The routing policy answers the last user message; ``model`` names the
    index. Sampling fields other clients send (temperature, max_tokens, …) are accepted and ignored: the policy runs
    with the server's settings, so every client gets the same answer. Parameters that would change what comes back
    (``n > 1``, ``tools``, ``response_format``, ``logprobs``...) are refused with a 400 naming them, as OpenAI's API
    refuses what a model does not support."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="The index to answer from (`GET /v1/models`).")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: ChatStreamOptions | None = Field(None, description=(
        "With `include_usage`, a last chunk before `[DONE]` carries the request's `usage` (and no choices)."))
    n: int | None = Field(None, description="Only 1: the policy gives one answer per question (else a 400).")
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported: a 400 (the policy calls no tools).")
    tool_choice: Any = Field(None, description="Only `none`, else a 400.")
    response_format: dict[str, Any] | None = Field(None, description="Only `{\"type\": \"text\"}`, else a 400.")
    logprobs: bool | None = Field(None, description="Only false: the answer is read, not sampled (else a 400).")
    top_logprobs: int | None = Field(None, description="Not supported: a 400.")


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = Field(None, description="When the policy refused (the retrieved documents do not answer "
                                                  "the question): why, and `content` is null, as OpenAI signals one.")


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: Literal["stop", "length"] = "stop"


class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    """OpenAI's chat completion, plus ``routerag``: the whole ``/ask`` answer (trace, searches, citations,
    timings), which OpenAI clients ignore and ours read (``completion.model_extra["routerag"]`` in the openai SDK)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    routerag: AskResponse


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = Field(None, description="The policy's thoughts and searches as they happen "
                                                            "(the field reasoning models use, shown by many chat UIs).")
    refusal: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed chat completion; the last one carries ``routerag`` (the whole ``/ask`` answer)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    routerag: AskResponse | None = None
    usage: ChatUsage | None = Field(None, description="Only on the last chunk, when `stream_options.include_usage` "
                                                      "asked for it (its `choices` are then empty).")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "routerag"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- the events of a streamed /ask ------------------------------------------------------------------------------------


class ThinkEvent(BaseModel):
    """The policy's reasoning before its action."""

    type: Literal["think"]
    text: str
    step: int


class SearchEvent(BaseModel):
    """A search the policy chose: its mode (after any forced mode), the mode tags it wrote, and its query."""

    type: Literal["search"]
    mode: Mode
    tags: list[str]
    query: str
    step: int


class EventDocument(BaseModel):
    id: str
    title: str
    text: str
    score: float


class InformationEvent(BaseModel):
    """The documents a search returned, as the policy reads them."""

    type: Literal["information"]
    step: int
    mode: Mode
    retrieval_ms: float
    docs: list[EventDocument]


class DraftEvent(BaseModel):
    """The policy's draft: what it wrote in ``<answer>``, before any reader; ``forced`` when the budget or the
    invalid-turn limit made the policy answer, ``refused`` when it said that the documents do not answer the question.
    The final answer (``answer``) may differ from it."""

    type: Literal["draft"]
    text: str | None
    forced: bool
    refused: bool = False


class AnswerEvent(BaseModel):
    """The final answer, the one to show (``done`` carries it too): the reader's, or the policy's draft (maybe cut to
    a span), as ``answered_by`` says."""

    type: Literal["answer"]
    text: str | None
    answered_by: AnsweredBy
    refused: bool = False


STREAM_EVENTS: dict[str, type[BaseModel]] = {"think": ThinkEvent, "search": SearchEvent,
                                             "information": InformationEvent, "draft": DraftEvent,
                                             "answer": AnswerEvent, "done": AskResponse, "error": ErrorResponse}
"""``/ask`` with ``stream: true``: each SSE event's name and the model of its JSON ``data``. The policy's answer is a
``draft``; ``answer`` is the final one. The stream ends with ``done`` (the whole answer, as the JSON response would
be) or ``error`` (the error object a JSON response would carry, e.g. a timeout or an internal error)."""


# -- /explain --------------------------------------------------------------------------------------------------------

ExplainMode = Literal["graph", "hybrid"]


class ExplainRequest(BaseModel):
    """The evidence subgraph of one graph or hybrid search. The limits bound what is drawn, not what is searched:
    the PageRank always runs over the whole graph."""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: NonBlank = Field(min_length=1, description="The query to search and explain.")
    mode: ExplainMode = Field("graph", description="graph or hybrid (passage search has no graph to explain).")
    k: int | None = Field(None, ge=1, description="Top passages to explain (the retrieval default if null).")
    index: str | None = Field(None, description=INDEX_FIELD)
    max_nodes: int = Field(40, ge=2, le=100, description="Vertices drawn at most.")
    max_seeds: int = Field(8, ge=0, le=50, description="Entity seeds drawn at most, heaviest first.")
    paths_per_passage: int = Field(2, ge=0, le=5, description="Strongest paths per top passage.")
    max_hops: int = Field(4, ge=1, le=8, description="Edges on a path from a seed to a passage.")


class ExplainNode(BaseModel):
    id: int = Field(description="The graph vertex (stable within one index version).")
    kind: Literal["entity", "passage"]
    label: str = Field(description="The entity's normalised name, or the passage's title.")
    mass: float = Field(description="Personalized PageRank mass (all vertices of the graph sum to 1).")
    seed_weight: float = Field(description="Its weight in the PageRank's reset before normalisation; 0 if no seed.")
    seed_from: list[Literal["fact", "query", "dense", "uniform"]] = Field(description=(
        "Why it is a seed: an end of a matched fact, named in the query, a passage's dense score, or the uniform "
        "fallback."))
    rank: int | None = Field(description="1-based rank among the search's results (top passages only).")
    x: float = Field(description="Layout position in [0, 1] (Kamada–Kawai, so drawn distance follows graph "
                                 "distance; the seeds lie left of the top passages on average).")
    y: float


class ExplainEdge(BaseModel):
    source: int
    target: int
    kind: Literal["relation", "synonym", "passage-entity"] = Field(description=(
        "relation: an extracted fact; synonym: entities with similar embeddings; passage-entity: a mention or a "
        "title."))
    kinds: list[str] = Field(description="Every link the edge stands for: fact, mention, title, synonym.")
    weight: float
    relations: list[str] = Field(description="The relations of the facts between its ends.")
    seed_fact: float | None = Field(description="The score of the best seed fact on this edge, if any.")
    on_path: bool = Field(description="On one of the paths listed in `paths`.")


class EvidencePath(BaseModel):
    nodes: list[int] = Field(description="Vertices from an entity seed to the passage.")
    score: float = Field(description="Product of its vertices' PageRank mass relative to the heaviest vertex "
                                     "(what paths are ranked by).")
    weakest: float = Field(description="The smallest PageRank mass on the path.")


class PassagePaths(BaseModel):
    node: int
    title: str
    rank: int
    paths: list[EvidencePath]


class SeedFact(BaseModel):
    subject: str
    relation: str
    object: str
    score: float = Field(description="Min-max normalised match score (1: the best fact).")
    nodes: list[int] = Field(description="The drawn vertices of its subject and object.")


class ExplainLimits(BaseModel):
    max_nodes: int
    max_seeds: int
    paths_per_passage: int
    max_hops: int
    context_nodes: int = Field(description="Heavy neighbours added around the evidence while there is room.")
    candidates: int = Field(description="The heaviest vertices the path search may pass through.")


class ExplainResponse(BaseModel):
    """The search's top passages and the evidence behind them, at most `limits.max_nodes` vertices."""

    query: str
    mode: ExplainMode
    index: str
    docs: list[EventDocument] = Field(description="The search's results, best first (as /retrieve ranks them).")
    facts: list[SeedFact] = Field(description="The facts that matched the query and seeded the PageRank.")
    nodes: list[ExplainNode]
    edges: list[ExplainEdge] = Field(description="Every graph edge between drawn vertices.")
    paths: list[PassagePaths] = Field(description="Per drawn top passage, its strongest paths from the seeds.")
    fallback: str | None = Field(description="Why graph seeding fell back, if it did.")
    truncated: bool = Field(description="Something was left out to stay within the limits (see `omitted`).")
    omitted: dict[str, int] = Field(description="passages, seeds and paths left out by the limits.")
    limits: ExplainLimits
    graph: dict[str, int] = Field(description="The whole graph's nodes and edges, for scale.")
    ms: float


# -- the configured maxima --------------------------------------------------------------------------------------------


def request_models(cfg: ServerConfig, max_query_chars: int | None = None) -> tuple[type[AskRequest],
                                                                                    type[RetrieveRequest]]:
    """Subclasses of the request models whose fields carry ``cfg``'s maxima (enforced with a 422 and shown in the
    OpenAPI schema). ``max_query_chars`` bounds each ``/retrieve`` query (the retriever's own limit)."""
    ask = create_model(
        "AskRequest", __base__=AskRequest, __module__=__name__,
        question=(bounded_text(cfg.max_question_chars), Field(min_length=1,
                                  description=f"The question to answer (at most {cfg.max_question_chars} "
                                              "characters).")),
        budget=(int | None, Field(None, ge=0, le=cfg.max_budget,
                                  description=f"Searches before an answer is forced (0 to {cfg.max_budget}; server "
                                              "default if null).")),
        k=(int | None, Field(None, ge=1, le=cfg.max_k,
                             description=f"Documents per search (1 to {cfg.max_k}; server default if null).")),
    )
    query_t = bounded_text(max_query_chars)
    retrieve = create_model(
        "RetrieveRequest", __base__=RetrieveRequest, __module__=__name__,
        queries=(list[query_t], Field(min_length=1, max_length=cfg.max_queries,  # type: ignore[valid-type]
                                      description=f"Queries (1 to {cfg.max_queries}, none empty or blank), "
                                                  "retrieved together in one batch.")),
        topk=(int | None, Field(None, ge=1, le=cfg.max_k,
                                description=f"Documents per query (1 to {cfg.max_k}; the retrieval default if "
                                            "null).")),
    )
    return ask, retrieve


def shard_stage_model(cfg: ServerConfig, max_query_chars: int | None = None) -> type[ShardStageRequest]:
    """:class:`ShardStageRequest` with ``/retrieve``'s limits (query length and count, ``cfg``'s maximum k): a graph
    search through a sharded front is refused by its shards exactly as ``/retrieve`` would refuse it."""
    return create_model(
        "ShardStageRequest", __base__=ShardStageRequest, __module__=__name__,
        queries=(list[bounded_text(max_query_chars)],  # type: ignore[misc]
                 Field(min_length=1, max_length=cfg.max_queries, description="Queries, one batch.")),
        topk=(int, Field(10, ge=1, le=cfg.max_k, description=f"Documents per query (1 to {cfg.max_k}).")),
    )


def explain_model(cfg: ServerConfig, max_query_chars: int | None = None) -> type[ExplainRequest]:
    """:class:`ExplainRequest` with ``cfg``'s maximum k and the retriever's query length."""
    return create_model(
        "ExplainRequest", __base__=ExplainRequest, __module__=__name__,
        query=(bounded_text(max_query_chars),
               Field(min_length=1, description="The query to search and explain.")),
        k=(int | None, Field(None, ge=1, le=cfg.max_k,
                             description=f"Top passages to explain (1 to {cfg.max_k}; the retrieval default if "
                                         "null).")),
    )
