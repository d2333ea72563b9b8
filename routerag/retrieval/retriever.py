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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from graph_index.dense import maybe_to_gpu
from graph_index.graph import ENTITY_PREFIX
from graph_index.normalize import normalize_phrase
from graph_index.store import IndexData
from routerag.config import DenseIndexConfig, EmbedderConfig, RetrievalConfig
from routerag.embedders import Embedder, make_embedder

from .fusion import reciprocal_rank_fusion
from .ppr import PPRSolver, igraph_ppr

log = logging.getLogger(__name__)

Mode = Literal["passage", "graph", "hybrid"]
MODES: tuple[Mode, ...] = ("passage", "graph", "hybrid")


class QueryError(ValueError):
    """A query the retriever cannot take (empty, too long, unknown mode)."""


@dataclass(slots=True)
class RetrievedDoc:
    id: str
    title: str
    text: str
    score: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text, "score": round(self.score, 6)}


@dataclass(slots=True)
class RetrievalResult:
    query: str
    mode: Mode
    docs: list[RetrievedDoc]
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Per stage; in a batch each stage's time is shared equally by its queries."""
    facts: list[tuple[tuple[str, str, str], float]] = field(default_factory=list)
    """Graph and hybrid modes: the facts that seeded the PageRank, with their normalised scores."""
    fallback: str | None = None
    """Why graph seeding fell back, if it did (e.g. no fact links to an entity)."""

    @property
    def ms(self) -> float:
        return round(sum(self.timings_ms.values()), 3)

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "mode": self.mode, "docs": [d.to_json() for d in self.docs], "ms": self.ms}


class Retriever:
    def __init__(self, index: IndexData | str | Path, cfg: RetrievalConfig | None = None, *,
                 embedder: Embedder | None = None) -> None:
        self.data = index if isinstance(index, IndexData) else IndexData(Path(index))
        self.cfg = cfg or RetrievalConfig()
        m = self.data.manifest
        saved = m["config"]
        self.embedder = embedder or make_embedder(EmbedderConfig.model_validate(saved["embedder"]))
        if self.embedder.identity != m["embedder"]["identity"]:
            raise ValueError(f"index {self.data.path} was embedded with {m['embedder']['identity']}, "
                             f"not {self.embedder.identity}")
        dense_cfg = DenseIndexConfig.model_validate(saved["dense"])
        if self.cfg.device == "cpu":
            dense_cfg = dense_cfg.model_copy(update={"use_gpu": "never"})
        self.passages = self.data.passages
        self.n_passages = len(self.passages)
        self.dense = maybe_to_gpu(self.data.dense, dense_cfg)
        self.passage_emb = np.ascontiguousarray(self.data.passage_emb)
        self.fact_emb = np.ascontiguousarray(self.data.fact_emb)
        self.facts = self.data.facts
        self._graph_ready = False

    # -- loading the graph part lazily: passage-only users never pay for it -------------------------------------

    def _ensure_graph(self) -> None:
        if self._graph_ready:
            return
        g = self.data.graph
        names = g.vs["name"]
        vertex = {n: i for i, n in enumerate(names)}
        ends = np.full((len(self.facts), 2), -1, dtype=np.int64)
        for j, (s, _, o) in enumerate(self.facts):
            ends[j, 0] = vertex.get(ENTITY_PREFIX + s, -1)
            ends[j, 1] = vertex.get(ENTITY_PREFIX + o, -1)
        self.fact_ends = ends
        counts = np.zeros(g.vcount(), dtype=np.float64)
        counts[self.n_passages:] = self.data.entity_passage_counts
        self.entity_passages = counts
        self.n_nodes = g.vcount()
        self.entity_vertex = {n[len(ENTITY_PREFIX):]: i for i, n in enumerate(names) if n.startswith(ENTITY_PREFIX)}
        self.max_entity_words = min(max((len(e.split()) for e in self.entity_vertex), default=1), 8)
        if self.cfg.ppr_backend == "batched":
            self.solver = PPRSolver.from_igraph(g, damping=self.cfg.damping, tol=self.cfg.ppr_tol,
                                                device=self.cfg.device)
        self._graph_ready = True

    # -- public API -----------------------------------------------------------------------------------------------

    def search(self, queries: Sequence[str], mode: Mode | None = None, k: int | None = None) -> list[RetrievalResult]:
        """Retrieve ``k`` passages for each query (a batch shares every computation)."""
        mode = mode or self.cfg.mode
        k = k or self.cfg.top_k
        if mode not in MODES:
            raise QueryError(f"unknown mode {mode!r}; choose passage, graph or hybrid")
        if k < 1:
            raise QueryError("k must be at least 1")
        clean = [self._check(q) for q in queries]
        out: list[RetrievalResult] = []
        for start in range(0, len(clean), self.cfg.batch_size):
            out.extend(self._search_batch(clean[start : start + self.cfg.batch_size], mode, k))
        return out

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

    def _search_batch(self, queries: list[str], mode: Mode, k: int) -> list[RetrievalResult]:
        b = len(queries)
        timings: dict[str, float] = {}
        t = time.perf_counter()
        q = self.embedder.encode_queries(queries)
        timings["embed"] = _ms(t)
        depth = min(k * self.cfg.rrf_depth if mode == "hybrid" else k, self.n_passages)
        passage_lists: list[list[tuple[int, float]]] = []
        graph_lists: list[list[tuple[int, float]]] = []
        facts: list[list[tuple[tuple[str, str, str], float]]] = [[] for _ in range(b)]
        fallbacks: list[str | None] = [None] * b
        if mode in ("passage", "hybrid"):
            t = time.perf_counter()
            scores, ids = self.dense.search(q, depth)
            passage_lists = [[(int(i), float(s)) for i, s in zip(ids[r], scores[r]) if i >= 0] for r in range(b)]
            timings["dense"] = _ms(t)
        if mode in ("graph", "hybrid"):
            graph_lists, facts, fallbacks = self._graph_batch(q, queries, depth, timings)
        t = time.perf_counter()
        if mode == "passage":
            ranked = passage_lists
        elif mode == "graph":
            ranked = graph_lists
        else:
            ranked = []
            for pl, gl in zip(passage_lists, graph_lists):
                fused = reciprocal_rank_fusion([[i for i, _ in pl], [i for i, _ in gl]], k=self.cfg.rrf_k)
                ranked.append([(int(i), s) for i, s in fused[:k]])
        timings["fuse"] = _ms(t)
        per_query = {name: round(v / b, 3) for name, v in timings.items()}
        results = []
        for r in range(b):
            docs = [RetrievedDoc(self.passages[i].id, self.passages[i].title, self.passages[i].text, s)
                    for i, s in ranked[r][:k]]
            results.append(RetrievalResult(queries[r], mode, docs, dict(per_query), facts[r], fallbacks[r]))
        return results

    def _graph_batch(self, q: np.ndarray, queries: list[str], depth: int, timings: dict[str, float]):
        self._ensure_graph()
        cfg = self.cfg
        b = q.shape[0]
        t = time.perf_counter()
        dense_all = self._dense_seed_scores(q)  # b × P, min-max normalised
        timings["graph_dense"] = _ms(t)
        t = time.perf_counter()
        reset = np.zeros((self.n_nodes, b), dtype=np.float32)
        reset[: self.n_passages] = (dense_all * cfg.passage_node_weight).T
        facts: list[list[tuple[tuple[str, str, str], float]]] = [[] for _ in range(b)]
        fallbacks: list[str | None] = [None] * b
        if len(self.facts) and cfg.fact_top_k > 0:
            fact_scores = _minmax_rows(q @ self.fact_emb.T)
            top = _top_rows(fact_scores, cfg.fact_top_k)
            for r in range(b):
                chosen = [(int(j), float(fact_scores[r, j])) for j in top[r]]
                facts[r] = [(self.facts[j], s) for j, s in chosen]
                for v, w in self._entity_seeds(chosen).items():
                    reset[v, r] += w
        if cfg.query_entity_weight > 0:
            for r, query in enumerate(queries):
                for v in self.query_entities(query):
                    reset[v, r] += cfg.query_entity_weight / max(self.entity_passages[v], 1.0)
        for r in range(b):
            if not reset[self.n_passages :, r].any():
                fallbacks[r] = "the query links to no entity node; dense seeds only"
        dead = reset.sum(axis=0) <= 0
        if dead.any():  # all dense scores equal and no entity: seed uniformly over passages
            reset[: self.n_passages, dead] = 1.0
            for r in np.flatnonzero(dead):
                fallbacks[r] = "no usable seed; uniform over passages"
        timings["seeds"] = _ms(t)
        t = time.perf_counter()
        if cfg.ppr_backend == "igraph":
            g = self.data.graph
            scores = np.stack([igraph_ppr(g, reset[:, r], cfg.damping)[: self.n_passages] for r in range(b)], axis=1)
        else:
            scores = self.solver.solve(reset, rows=np.arange(self.n_passages))  # P × b
        timings["ppr"] = _ms(t)
        t = time.perf_counter()
        top = _top_rows(scores.T, depth)
        lists = [[(int(i), float(scores[i, r])) for i in top[r]] for r in range(b)]
        timings["rank"] = _ms(t)
        return lists, facts, fallbacks

    def query_entities(self, query: str) -> list[int]:
        """Entity vertices the query names verbatim: its longest normalised n-grams that are entity nodes, not
        overlapping (so "new york city" does not also seed "york")."""
        self._ensure_graph()
        words = normalize_phrase(query).split()
        taken = [False] * len(words)
        found: list[int] = []
        for n in range(min(self.max_entity_words, len(words)), 0, -1):
            for i in range(len(words) - n + 1):
                if any(taken[i : i + n]):
                    continue
                v = self.entity_vertex.get(" ".join(words[i : i + n]))
                if v is not None:
                    found.append(v)
                    taken[i : i + n] = [True] * n
        return found

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

    def _dense_seed_scores(self, q: np.ndarray) -> np.ndarray:
        n = self.cfg.dense_seed_passages
        if n == 0 or n >= self.n_passages:
            return _minmax_rows(q @ self.passage_emb.T)
        scores, ids = self.dense.search(q, n)
        out = np.zeros((q.shape[0], self.n_passages), dtype=np.float32)
        norm = _minmax_rows(scores)
        for r in range(q.shape[0]):
            ok = ids[r] >= 0
            out[r, ids[r][ok]] = norm[r][ok]
        return out


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _minmax_rows(x: np.ndarray) -> np.ndarray:
    lo = x.min(axis=1, keepdims=True)
    hi = x.max(axis=1, keepdims=True)
    span = hi - lo
    return np.divide(x - lo, span, out=np.zeros_like(x, dtype=np.float32), where=span > 0).astype(np.float32)


def _top_rows(x: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest entries of each row, best first (ties by index)."""
    k = min(k, x.shape[1])
    if k == x.shape[1]:
        part = np.tile(np.arange(x.shape[1]), (x.shape[0], 1))
    else:
        part = np.argpartition(-x, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(x, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)
    return np.take_along_axis(part, order, axis=1)
