"""One retriever for every caller: a batch of queries, a mode and k in; ranked passages with scores and per-stage
timings out.

* ``passage``: dense top-k from the FAISS index.
* ``graph``: HippoRAG 2 — match the query to fact embeddings; seed the subject and object entities of the top facts
  with the fact score divided by the number of passages linked to the entity (averaged over facts); also seed the
  entities the query names verbatim (weighted the same way); seed every passage node with its
  min-max-normalised dense score × ``passage_node_weight``; run Personalized PageRank (damping 0.5); rank passage
  nodes.
* ``hybrid``: Reciprocal Rank Fusion of the passage and graph lists, each taken to ``rrf_depth × k``.

A whole batch shares one embedding call, one matrix product per score table and one batched PPR solve.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from graph_index import ann
from graph_index.dense import batch_scan, small_scan
from graph_index.dense import search as dense_search
from graph_index.embedders import Embedder, make_embedder
from graph_index.llm_clients import resolve_api_key
from graph_index.store import IndexData, release_freed_memory
from routerag.config import RetrievalConfig
from routerag.runtime import single_threaded_after_fork
from routerag.vocabulary import MODES, Mode

from .fact_filter import LLMFactFilter
from .facts import FactScorer, FaissFactScorer, top_rows
from .fusion import reciprocal_rank_fusion
from .ppr import PPRSolver, igraph_ppr
from .push import PushPPR
from .types import QueryError, RetrievalResult, RetrievedDoc

__all__ = ["QueryError", "RetrievalResult", "RetrievedDoc", "Retriever"]  # the value types are re-exported for
# code written when they lived here (they are defined in .types, which imports nothing heavy)

log = logging.getLogger(__name__)

single_threaded_after_fork()  # a forked child of a process that searched must not wait on the parent's thread teams


@dataclass(frozen=True, slots=True)
class Profile:
    """What each part of a search runs, ``retrieval.profile`` and the parts' own settings resolved for one index."""

    name: str
    """``exact`` or ``scale``: what ``profile`` resolved to."""
    passage_index: str
    fact_index: str
    ppr_backend: str


def resolve_profile(cfg: RetrievalConfig, passages: int, scale_from: int) -> Profile:
    """``cfg.profile`` for an index of ``passages`` passages (``auto``: ``scale`` from ``scale_from``), then each
    part's own setting where it is not ``auto``."""
    name = cfg.profile if cfg.profile != "auto" else ("scale" if passages >= scale_from else "exact")
    scale = name == "scale"
    return Profile(
        name,
        cfg.passage_index if cfg.passage_index != "auto" else ("ann" if scale else "index"),
        cfg.fact_index if cfg.fact_index != "auto" else ("ann" if scale else "exact"),
        cfg.ppr_backend if cfg.ppr_backend != "auto" else ("push" if scale else "batched"))


@dataclass(slots=True)
class Seeds:
    """One query's PageRank reset: vertex → mass, and (when asked) where each vertex's mass came from."""

    weights: dict[int, float] = field(default_factory=dict)
    origins: dict[int, list[str]] | None = None
    """``fact`` (an end of a matched fact), ``query`` (named by the query), ``dense`` (a passage's dense score) or
    ``uniform`` (the last resort)."""

    def add(self, v: int, w: float, origin: str) -> None:
        if w <= 0:
            return
        v = int(v)  # fact ends are numpy integers
        self.weights[v] = self.weights.get(v, 0.0) + w
        if self.origins is not None:
            kinds = self.origins.setdefault(v, [])
            if origin not in kinds:
                kinds.append(origin)


class Retriever:
    def __init__(self, index: IndexData | str | Path, cfg: RetrievalConfig | None = None, *,
                 embedder: Embedder | None = None) -> None:
        self.data = index if isinstance(index, IndexData) else IndexData(Path(index))
        self.cfg = cfg or RetrievalConfig()
        m = self.data.manifest
        self.embedder = embedder or make_embedder(self.data.config.embedder, runtime=self.cfg.query_encoder)
        if self.embedder.identity != m["embedder"]["identity"]:
            raise ValueError(f"index {self.data.path} was embedded with {m['embedder']['identity']}, "
                             f"not {self.embedder.identity}")
        self.passages = self.data.passage_rows  # parsed when read: no Python object per passage in memory
        self.n_passages = len(self.passages)
        self.profile = resolve_profile(self.cfg, self.n_passages, self.data.config.ann.from_passages)
        self.dense = self.data.search_index(self.cfg.device)
        exact_dense = self.profile.passage_index == "index"  # the scans below are copies or views of a flat index
        self._dense_scan = batch_scan(self.dense) if exact_dense and self.cfg.batch_scan != "blas" else None
        self._dense_screen = small_scan(self.dense) if exact_dense and self.cfg.small_batch_scan != "float" else None
        self._passage_ann = self.data.ann("passages") if not exact_dense else None
        self.passage_emb = np.ascontiguousarray(self.data.passage_emb)
        self.facts = self.data.fact_rows
        self.milvus = self._open_milvus()
        self._milvus_dense = None if self.milvus is None else self.milvus.dense(self.passage_emb)
        self._graph_ready = False
        self._graph_lock = threading.Lock()
        self.fact_filter = None
        if self.cfg.fact_filter:
            self.fact_filter = LLMFactFilter(self.cfg.fact_filter_base_url, self.cfg.fact_filter_model,  # type: ignore[arg-type]
                                             api_key=resolve_api_key(self.cfg.fact_filter_api_key))

    def _open_milvus(self):  # noqa: ANN202
        """With ``retrieval.vector_store = "milvus"``, the index's vectors in Milvus (:mod:`.vector_store`)."""
        if self.cfg.vector_store != "milvus":
            return None
        from .vector_store import MilvusVectors, content_key

        if not self.cfg.milvus_uri:
            raise ValueError("retrieval.vector_store = 'milvus' needs retrieval.milvus_uri: a local file (Milvus "
                             "Lite) or http://host:19530")
        token = self.cfg.milvus_token.get_secret_value() if self.cfg.milvus_token else None
        return MilvusVectors(self.cfg.milvus_uri, token, content_key(self.data.manifest))

    # -- loading the graph part lazily: passage-only users never pay for it -------------------------------------

    def _ensure_graph(self) -> None:
        if self._graph_ready:
            return
        with self._graph_lock:  # concurrent first searches must not load the graph twice
            if not self._graph_ready:
                self._load_graph()

    def warm_up(self) -> None:
        """Load the graph and run one query through every mode, so the first real request pays nothing extra."""
        self._ensure_graph()
        self.search(["warm up"], mode="hybrid", k=1)

    def _load_graph(self) -> None:
        graph = self.data.compact_graph  # mapped arrays: no igraph object, no Python object per vertex
        self.fact_ends = graph.fact_ends
        fact_emb = np.ascontiguousarray(self.data.fact_emb)
        self.fact_scorer = self._fact_scorer(fact_emb)
        self.entity_passages = graph.vertex_passage_counts
        self.n_nodes = graph.vcount()
        self._passage_rows = self.data.passage_vertices
        self.push = self.solver = None
        if self.profile.ppr_backend == "batched":
            self.solver = PPRSolver(graph.adjacency(), damping=self.cfg.damping, tol=self.cfg.ppr_tol,
                                    device=self.cfg.device)
        if self.profile.ppr_backend == "push":  # on the mapped graph itself: no solver, no copy of the matrix
            self.push = PushPPR.on_graph(graph.adjacency(), damping=self.cfg.damping, eps=self.cfg.push_eps,
                                         max_edges=self.cfg.push_max_edges)
        release_freed_memory()  # the solver's temporary matrices
        self._graph_ready = True

    def _fact_scorer(self, fact_emb: np.ndarray) -> FactScorer | FaissFactScorer:
        if self.milvus is not None:  # retrieval.vector_store = "milvus": the facts are matched in Milvus
            return self.milvus.facts(fact_emb)
        kind = self.profile.fact_index
        if kind == "exact":
            return FactScorer(fact_emb, self.data.fact_emb_f16, blas_threads=self.cfg.fact_blas_threads,
                              batch_scan=self.cfg.batch_scan, small_batch_scan=self.cfg.small_batch_scan)
        if kind == "ann":
            return FaissFactScorer(fact_emb, kind, index=self.data.ann("facts"), ef_search=self.cfg.ann_ef_search,
                                   nprobe=self.cfg.ann_nprobe)
        return FaissFactScorer(fact_emb, kind)

    # -- public API -----------------------------------------------------------------------------------------------

    def search(self, queries: Sequence[str], mode: Mode | None = None, k: int | None = None, *,
               query_vectors: np.ndarray | None = None) -> list[RetrievalResult]:
        """Retrieve ``k`` passages for each query (a batch shares every computation).

        ``query_vectors`` (one unit row per query, from :meth:`embed`) skips the query encoder, so a caller can
        batch encoding across requests or reuse vectors.
        """
        mode = mode or self.cfg.mode
        k = k or self.cfg.k
        if mode not in MODES:
            raise QueryError(f"unknown mode {mode!r}; choose passage, graph or hybrid")
        if k < 1:
            raise QueryError("k must be at least 1")
        clean = [self._check(q) for q in queries]
        if query_vectors is not None and query_vectors.shape != (len(clean), self.embedder.dim):
            raise QueryError(f"query_vectors must have shape ({len(clean)}, {self.embedder.dim})")
        out: list[RetrievalResult] = []
        for start in range(0, len(clean), self.cfg.batch_size):
            end = start + self.cfg.batch_size
            vecs = None if query_vectors is None else query_vectors[start:end]
            out.extend(self._search_batch(clean[start:end], mode, k, vecs))
        return out

    def search_each(self, queries: Sequence[str], mode: Mode | None = None,
                    k: int | None = None) -> list[RetrievalResult | QueryError]:
        """As :meth:`search`, but a query the retriever refuses gets its :class:`QueryError` in its own place while
        the others are searched: the queries of one batch may come from unrelated callers (the loop's micro-batched
        searches), and one caller's bad query must not fail its neighbours."""
        checked: list[str | QueryError] = []
        for q in queries:
            try:
                checked.append(self._check(q))
            except QueryError as exc:
                checked.append(exc)
        valid = [(i, c) for i, c in enumerate(checked) if isinstance(c, str)]
        out: list[RetrievalResult | QueryError | None] = [c if isinstance(c, QueryError) else None for c in checked]
        if valid:
            for (i, _), res in zip(valid, self.search([c for _, c in valid], mode, k)):
                out[i] = res
        return out  # type: ignore[return-value]

    def memory_bytes(self) -> int:
        """The bytes of this index's loaded search structures: dense vectors and FAISS index (its vector storage),
        fact matrix (float32, and the int8 screen's copy or else the float16 one), the PageRank operator and the
        passage texts; not the shared query encoder. Memory-mapped matrices count in full (what they occupy once
        touched). For ``/health``, where several indexes share one process and its RSS says nothing per index."""
        arrays: list[Any] = [self.passage_emb]
        total = self.data.passage_rows.bounds[-1]  # the passages' JSONL, mapped: the texts, and their ids and titles
        ntotal, dim = getattr(self.dense, "ntotal", 0), getattr(self.dense, "d", 0)
        total += int(ntotal) * int(dim) * 4  # the FAISS index's own copy of the vectors (exact for a flat index)
        if self._dense_screen is not None:
            total += self._dense_screen.memory_bytes()
        if self._graph_ready:
            arrays.append(self.fact_scorer.emb)
            screen = getattr(self.fact_scorer, "screen", None)
            half = getattr(self.fact_scorer, "half", None)
            if screen is not None:  # the float16 copy stays mapped but unread
                total += screen.memory_bytes()
            elif half is not None:
                arrays.append(half.numpy())
            solver = getattr(self, "solver", None)
            if solver is not None:
                arrays += [solver.S.data, solver.S.indices, solver.S.indptr, solver.M.data, solver.M.indices,
                           solver.M.indptr, solver.perm, solver.inv, solver.sqrt_deg, solver.inv_sqrt_deg]
            elif self.push is not None:  # push on the mapped graph: the weighted degrees are all it computed
                arrays += [self.push.sqrt_deg, self.push.inv_sqrt_deg]
        return int(total) + sum(int(a.nbytes) for a in arrays)

    def dense_hits(self, q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), each b × n best first, of the dense index for unit query rows ``q``, as every search
        finds them (a few queries through the int8 screen, batches through the batch scan)."""
        if self._milvus_dense is not None:
            return self._milvus_dense.search(q, n)
        if self._passage_ann is not None:
            return ann.search(self._passage_ann, self.passage_emb, q, n, ef_search=self.cfg.ann_ef_search,
                              nprobe=self.cfg.ann_nprobe)
        return dense_search(self.dense, q, n, blas_from=self.cfg.dense_blas_from, scan=self._dense_scan,
                            screen=self._dense_screen)

    def embed(self, queries: Sequence[str]) -> np.ndarray:
        """Unit query vectors, as :meth:`search` would compute them."""
        return self.embedder.encode_queries([self._check(q) for q in queries])

    def _check(self, query: str) -> str:
        if not isinstance(query, str):
            raise QueryError("a query must be a string")
        q = " ".join(query.split())
        if not q:
            raise QueryError("empty query")
        if len(q) > self.cfg.max_query_chars:
            raise QueryError(f"query longer than {self.cfg.max_query_chars} characters")
        return q

    # -- one batch ----------------------------------------------------------------------------------------------

    def _search_batch(self, queries: list[str], mode: Mode, k: int, vecs: np.ndarray | None) -> list[RetrievalResult]:
        b = len(queries)
        timings: dict[str, float] = {}
        if vecs is None:
            t = time.perf_counter()
            q = self.embedder.encode_queries(queries)
            timings["embed"] = _ms(t)
        else:
            q = np.ascontiguousarray(vecs, dtype=np.float32)
        depth = min(k * self.cfg.rrf_depth if mode == "hybrid" else k, self.n_passages)
        passage_lists: list[list[tuple[int, float]]] = []
        graph_lists: list[list[tuple[int, float]]] = []
        facts: list[list[tuple[tuple[str, str, str], float]]] = [[] for _ in range(b)]
        fallbacks: list[str | None] = [None] * b
        # one FAISS search serves both the passage list and the graph's dense seeds
        seed_n = self.cfg.dense_seed_passages if mode != "passage" and 0 < self.cfg.dense_seed_passages else 0
        search_n = max(depth if mode != "graph" else 0, min(seed_n, self.n_passages))
        scores = ids = None
        if search_n:
            t = time.perf_counter()
            scores, ids = self.dense_hits(q, search_n)
            timings["dense"] = _ms(t)
        if mode in ("passage", "hybrid"):
            passage_lists = [[(int(i), float(s)) for i, s in zip(ids[r][:depth], scores[r][:depth]) if i >= 0]
                             for r in range(b)]
        if mode in ("graph", "hybrid"):
            seeds = (scores[:, :seed_n], ids[:, :seed_n]) if seed_n else None
            graph_lists, facts, fallbacks = self._graph_batch(q, queries, depth, timings, seeds)
        t = time.perf_counter()
        if mode == "passage":
            ranked = passage_lists
        elif mode == "graph":
            ranked = graph_lists
        else:
            ranked = []
            for pl, gl in zip(passage_lists, graph_lists):
                fused = reciprocal_rank_fusion([[i for i, _ in pl], [i for i, _ in gl]], rrf_k=self.cfg.rrf_k)
                ranked.append([(int(i), s) for i, s in fused[:k]])
        timings["fuse"] = _ms(t)
        per_query = {name: round(v / b, 3) for name, v in timings.items()}
        results = []
        for r in range(b):
            docs = [RetrievedDoc(self.passages[i].id, self.passages[i].title, self.passages[i].text, s)
                    for i, s in ranked[r][:k]]
            results.append(RetrievalResult(queries[r], mode, docs, dict(per_query), facts[r], fallbacks[r]))
        return results

    def _graph_batch(self, q: np.ndarray, queries: list[str], depth: int, timings: dict[str, float],
                     dense_hits: tuple[np.ndarray, np.ndarray] | None):
        self._ensure_graph()
        cfg = self.cfg
        b = q.shape[0]
        seeds, facts, fallbacks = self.graph_seeds(q, queries, dense_hits, timings)
        if self.push is not None:
            return self._push_batch(seeds, depth, timings), facts, fallbacks
        t = time.perf_counter()
        rows_i = [v for sd in seeds for v in sd.weights]
        cols_i = [r for r, sd in enumerate(seeds) for _ in sd.weights]
        vals = [w for sd in seeds for w in sd.weights.values()]
        reset = sp.csc_matrix((np.asarray(vals, dtype=np.float32), (rows_i, cols_i)), shape=(self.n_nodes, b))
        timings["seeds"] += _ms(t)
        t = time.perf_counter()
        if self.profile.ppr_backend == "igraph":
            g = self.data.graph
            dense_reset = reset.toarray()
            scores = np.stack([igraph_ppr(g, dense_reset[:, r], cfg.damping)[: self.n_passages] for r in range(b)],
                              axis=1)
        else:
            scores = self.solver.solve(reset, rows=self._passage_rows, validate=False)  # P × b
        timings["ppr"] = _ms(t)
        t = time.perf_counter()
        top = top_rows(scores.T, depth)
        lists = [[(int(i), float(scores[i, r])) for i in top[r]] for r in range(b)]
        timings["rank"] = _ms(t)
        return lists, facts, fallbacks

    def _push_batch(self, seeds: list[Seeds], depth: int, timings: dict[str, float]) -> list[list[tuple[int, float]]]:
        """Each query's passages by forward push from its own seeds (the scale profile: no whole-graph pass)."""
        t = time.perf_counter()
        lists = []
        for sd in seeds:
            v, s, _ = self.push.top(np.fromiter(sd.weights, np.int64, len(sd.weights)),  # type: ignore[union-attr]
                                    np.fromiter(sd.weights.values(), np.float64, len(sd.weights)),
                                    self.n_passages, depth)
            lists.append([(int(i), float(x)) for i, x in zip(v, s)])
        timings["ppr"] = _ms(t)
        timings["rank"] = 0.0
        return lists

    def graph_seeds(self, q: np.ndarray, queries: list[str], dense_hits: tuple[np.ndarray, np.ndarray] | None,
                    timings: dict[str, float] | None = None, *, origins: bool = False
                    ) -> tuple[list[Seeds], list[list[tuple[tuple[str, str, str], float]]], list[str | None]]:
        """The PageRank reset of each query (vertex → mass; HippoRAG 2's seeding, see the module docstring), the
        facts that seeded it and why seeding fell back. ``origins`` also records where each vertex's mass came from
        (``fact``, ``query``, ``dense``): the explanation of a search shows it, the search itself need not pay."""
        self._ensure_graph()
        cfg = self.cfg
        b = q.shape[0]
        timings = {} if timings is None else timings
        t = time.perf_counter()
        seeds = [Seeds(origins={} if origins else None) for _ in range(b)]
        if dense_hits is None:  # every passage seeds (HippoRAG 2): its min-max-normalised dense score
            norm_all = _minmax_rows(q @ self.passage_emb.T) * cfg.passage_node_weight
            for r in range(b):
                for v in np.flatnonzero(norm_all[r]):
                    seeds[r].add(int(v), float(norm_all[r, v]), "dense")
        else:  # the FAISS top N seed, min-max-normalised over them
            scores, ids = dense_hits
            norm = _minmax_rows(scores) * cfg.passage_node_weight
            for r in range(b):
                for v, w in zip(ids[r], norm[r]):
                    if v >= 0:
                        seeds[r].add(int(v), float(w), "dense")
        facts: list[list[tuple[tuple[str, str, str], float]]] = [[] for _ in range(b)]
        fallbacks: list[str | None] = [None] * b
        linked = [False] * b
        if len(self.facts) and cfg.fact_top_k > 0:
            m = self.fact_scorer.match(q, cfg.fact_top_k)
            # min-max normalisation over all facts (HippoRAG 2), applied only to the winners
            span = np.where(m.hi > m.lo, m.hi - m.lo, 1.0)
            chosen = [[(int(j), float((x - m.lo[r]) / span[r])) for j, x in zip(m.top[r], m.scores[r])]
                      for r in range(b)]
            timings["facts"] = _ms(t)
            if self.fact_filter is not None:
                t = time.perf_counter()
                kept = self.fact_filter.keep(queries, [[self.facts[j] for j, _ in c] for c in chosen])
                for r, keep in enumerate(kept):
                    if keep is not None:
                        chosen[r] = [chosen[r][i] for i in keep]
                        if not keep:
                            fallbacks[r] = "the fact filter kept no fact"
                timings["filter"] = _ms(t)
            t = time.perf_counter()
            for r in range(b):
                facts[r] = [(self.facts[j], s) for j, s in chosen[r]]
                for v, w in self._entity_seeds(chosen[r]).items():
                    seeds[r].add(v, w, "fact")
                    linked[r] = True
        if cfg.query_entity_weight > 0:
            for r, query in enumerate(queries):
                for v in self.query_entities(query):
                    seeds[r].add(v, cfg.query_entity_weight / max(self.entity_passages[v], 1.0), "query")
                    linked[r] = True
        for r in range(b):
            if not linked[r]:
                why = fallbacks[r] + " and" if fallbacks[r] else "the query links to no entity node;"
                fallbacks[r] = f"{why} dense seeds only"
            if not seeds[r].weights:  # all dense scores equal and no entity: seed uniformly over passages
                for v in range(self.n_passages):
                    seeds[r].add(v, 1.0, "uniform")
                fallbacks[r] = "no usable seed; uniform over passages"
        timings["seeds"] = _ms(t)
        return seeds, facts, fallbacks

    def query_seeds(self, query: str, vector: np.ndarray | None = None
                    ) -> tuple[Seeds, list[tuple[tuple[str, str, str], float]], str | None]:
        """One query's graph seeds with their origins, its seed facts and any fallback, computed as a graph search
        computes them (the same dense seeds, facts and named entities); ``vector`` (from :meth:`embed`) skips the
        encoder."""
        clean = self._check(query)
        q = self.embedder.encode_queries([clean]) if vector is None else np.ascontiguousarray(vector, dtype=np.float32)
        seed_n = min(max(self.cfg.dense_seed_passages, 0), self.n_passages)
        hits = self.dense_hits(q, seed_n) if seed_n else None
        seeds, facts, fallbacks = self.graph_seeds(q, [clean], hits, origins=True)
        return seeds[0], facts[0], fallbacks[0]

    def ppr(self, reset: dict[int, float]) -> np.ndarray:
        """PageRank mass of every vertex for one reset (vertex → weight), normalised to sum 1: what the graph
        search ranks passages by, over the whole graph (an explanation reads the entities' mass too)."""
        self._ensure_graph()
        vec = np.zeros(self.n_nodes, dtype=np.float64)
        for v, w in reset.items():
            vec[v] += w
        if self.profile.ppr_backend == "igraph":
            return igraph_ppr(self.data.graph, vec, self.cfg.damping)
        if self.push is not None:
            res = self.push.solve(np.flatnonzero(vec), vec[vec != 0])
            out = np.zeros(self.n_nodes, dtype=np.float64)
            out[res.vertices] = res.scores
            return out
        return np.asarray(self.solver.solve(vec.astype(np.float32)), dtype=np.float64)

    def query_entities(self, query: str) -> list[int]:
        """Entity vertices the query names verbatim (:meth:`~graph_index.store.IndexData.entities_in`)."""
        self._ensure_graph()
        return self.data.entities_in(query)

    def _entity_seeds(self, chosen: list[tuple[int, float]]) -> dict[int, float]:
        """HippoRAG 2's phrase weights: each end entity of a chosen fact gets the fact score / its passage count,
        averaged over the facts it appears in; the ``entity_seed_top_k`` heaviest are kept (0: all)."""
        total: dict[int, float] = {}
        count: dict[int, int] = {}
        for j, score in chosen:
            for v in self.fact_ends[j]:
                if v < 0:
                    continue
                n = self.entity_passages[v]
                total[v] = total.get(v, 0.0) + (score / n if n > 0 else score)
                count[v] = count.get(v, 0) + 1
        weights = {v: total[v] / count[v] for v in total}
        kept = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))
        if self.cfg.entity_seed_top_k:
            kept = kept[: self.cfg.entity_seed_top_k]
        return {v: w for v, w in kept if w > 0}


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _minmax_rows(x: np.ndarray) -> np.ndarray:
    lo = x.min(axis=1, keepdims=True)
    hi = x.max(axis=1, keepdims=True)
    span = hi - lo
    return np.divide(x - lo, span, out=np.zeros_like(x, dtype=np.float32), where=span > 0).astype(np.float32)
