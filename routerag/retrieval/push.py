"""Local Personalized PageRank for one query: forward push (Andersen, Chung & Lang 2006), a frontier at a time, on the
batched solver's operator or on the graph's mapped adjacency itself (:meth:`PushPPR.on_graph`, the scale profile's,
which then builds no solver). Its cost follows the seeds' neighbourhood, not the graph: the scale profile's PageRank.

The same PageRank as :class:`routerag.retrieval.ppr.PPRSolver`: on an undirected weighted graph with weighted
degrees ``D``, ``p = (1-d) r + d A D⁻¹ p``, normalised to sum 1. Push keeps an estimate ``p`` and a residual ``q``
with the invariant ``p_true = p + PPR(q)`` (PPR is linear in its reset). Pushing vertex ``u`` moves ``(1-d) q[u]``
into ``p[u]`` and spreads ``d q[u] A[v,u] / D[u]`` to each neighbour ``v``. It runs in the solver's scaled variables
``x = D^-½ q`` on its matrix ``S = D^-½ A D^-½`` (the spread is then ``d S[v,u] x[u]``), or scales ``A``'s entries
by ``D^-½`` at both ends as it reads them, so no second copy of the graph is made. Every vertex whose residual is
at least ``eps · D[u]`` is pushed at once (one numpy frontier per round), until none is left above its threshold or
``max_edges`` edges were scanned.

Error bound (what :class:`LocalScores` reports). On an undirected graph ``PPR(e_u)[v] / D[v] = PPR(e_v)[u] / D[u]``,
so when every residual is below ``eps · D[u]``, ``p_true[v] − p[v] < eps · D[v]``: every vertex's (unnormalised)
score is low by less than ``eps`` times its weighted degree, never high. The returned scores add the residual's first
term, ``(1-d) q``, which keeps that bound and makes the L1 error exact: ``d · Σq``, divided by the exact total
``Σp + Σq`` (a vertex with edges passes on all its mass). Stopped by ``max_edges``, the per-vertex bound no longer
holds but the L1 error still does, and it is reported. Seeds are pushed first whatever their mass, so a seed without
edges keeps ``(1-d)`` of its reset and loses the rest, as in the Chebyshev solver (whose normalisation is prpack's
redistribution of that loss).

Why the threshold scales with the degree (hub handling): a hub holds residual from many neighbours, but is pushed only
once that residual reaches ``eps`` times its degree, so its thousands of edges are scanned rarely; the total work is
at most ``1 / ((1-d) eps)`` edge visits whatever the graph's size.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .ppr import PPRSolver


SCRATCH_KEPT = 2
"""Sets of whole-graph work arrays kept between queries (17 bytes a vertex each: 150 MB at 1M passages). Fresh ones
are zero pages the first touch of each page faults in: at 1M synthetic passages a push (p50 of 30, one run) took 22
ms from fresh arrays and 9 ms from kept ones, cleared where the last query touched them. More concurrent queries
than this allocate fresh ones."""


@dataclass(slots=True)
class LocalScores:
    """One query's push result: the vertices it reached (original ids) and their scores, normalised by the exact
    total, so that ``0 ≤ exact − score ≤ eps · D[v] / total`` per vertex (when ``complete``), and
    ``l1_error`` = ``Σ_v (exact − score)``, the exact L1 distance to the exact normalised PageRank."""

    vertices: np.ndarray
    scores: np.ndarray
    l1_error: float
    total: float
    """The unnormalised total the scores were divided by (1 less what seeds without edges lose)."""
    edges: int
    complete: bool


class PushPPR:
    """Forward-push PPR on a :class:`PPRSolver`'s operator; :meth:`solve` takes one sparse reset."""

    def __init__(self, solver: PPRSolver | None, *, eps: float = 1e-6, max_edges: int = 0,
                 adjacency: sp.csr_matrix | None = None, damping: float = 0.5) -> None:
        """On ``solver``'s scaled operator ``S``, or (``solver=None``) on ``adjacency`` itself, the graph's weighted
        adjacency ``A`` (the compact graph's mapped arrays): then no solver is built at all, only the weighted
        degrees, and each pushed edge is scaled on the fly (:meth:`on_graph`)."""
        if eps <= 0:
            raise ValueError("eps must be positive")
        self.eps = eps
        if solver is not None:
            s = solver.S
            self.n, self.damping = solver.n, solver.damping
            self.indptr, self.indices, self.data = s.indptr, s.indices, s.data
            self.sqrt_deg, self.perm, self.inv = solver.sqrt_deg, solver.perm, solver.inv
            self.inv_sqrt_deg = None  # S is already scaled
        else:
            self.n, self.damping = adjacency.shape[0], damping
            self.indptr, self.indices, self.data = adjacency.indptr, adjacency.indices, adjacency.data
            deg = adjacency @ np.ones(self.n)  # float64 sums, as the solver's
            deg = np.where(deg > 0, deg, 1.0)
            self.sqrt_deg = np.sqrt(deg)
            self.inv_sqrt_deg = 1.0 / self.sqrt_deg
            self.perm = self.inv = None  # original vertex order
        self._scratch: queue.SimpleQueue = queue.SimpleQueue()  # work arrays kept for the next query
        self.max_edges = max_edges or int(4 / ((1 - self.damping) * eps))
        """Edge visits after which :meth:`solve` stops (its L1 error still exact); the default is four times the
        work bound, so only rounding-scale overshoot reaches it."""

    @classmethod
    def on_graph(cls, adjacency: sp.csr_matrix, *, damping: float, eps: float, max_edges: int = 0) -> PushPPR:
        """Push on the graph's own adjacency, without a :class:`PPRSolver`. Why: the solver's reordering and its two
        scaled copies of the matrix are for whole-graph products push never makes; at 1M passages (24M edges) they
        took most of a load's time and memory, where the weighted degrees are one pass over the mapped weights."""
        return cls(None, eps=eps, max_edges=max_edges, adjacency=adjacency, damping=damping)

    def degree(self, vertices: np.ndarray) -> np.ndarray:
        """Weighted degrees ``D`` of original vertices (1 for a vertex without edges), as the solver holds them."""
        return self.sqrt_deg[self._internal(vertices)].astype(np.float64) ** 2

    def _internal(self, vertices: np.ndarray) -> np.ndarray:
        return vertices if self.inv is None else self.inv[vertices]

    def _spread(self, frontier: np.ndarray, mass: np.ndarray, offs: np.ndarray, targets: np.ndarray,
                counts: np.ndarray) -> np.ndarray:
        """``d S[v,u] x[u]`` for every edge slot ``offs`` of the frontier: S's entries, or A's scaled here by
        ``D[u]^-1/2 D[v]^-1/2``."""
        coef = self.damping * mass
        if self.inv_sqrt_deg is None:
            return self.data[offs] * np.repeat(coef, counts)
        coef = coef * self.inv_sqrt_deg[frontier]
        return self.data[offs] * np.repeat(coef, counts) * self.inv_sqrt_deg[targets]

    def solve(self, seeds: np.ndarray, weights: np.ndarray) -> LocalScores:
        """PageRank for the reset ``weights`` on original vertices ``seeds`` (normalised to sum 1 first)."""
        w = np.asarray(weights, dtype=np.float64)
        total_w = float(w.sum())
        if not total_w > 0 or (w < 0).any():
            raise ValueError("the reset needs non-negative weights and some positive mass")
        seeds = self._internal(np.asarray(seeds, dtype=np.int64))
        try:
            p, x, seen = self._scratch.get_nowait()
        except queue.Empty:  # the first query, or more at once than are kept
            p, x, seen = self._zeroed()
        touched: list[np.ndarray] = []
        result = self._push(seeds, w / total_w, p, x, seen, touched)  # raised: the arrays are dropped, not kept
        t = np.concatenate(touched)  # only what this query touched is set: clear it, keep the arrays for the next
        p[t], x[t], seen[t] = 0.0, 0.0, False
        if self._scratch.qsize() < SCRATCH_KEPT:
            self._scratch.put((p, x, seen))
        return result

    def _zeroed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Estimate, scaled residual (x = D^-1/2 q) and seen flags, all zero (calloc'd: pages come on touch)."""
        return np.zeros(self.n), np.zeros(self.n), np.zeros(self.n, dtype=bool)

    def _push(self, seeds: np.ndarray, w: np.ndarray, p: np.ndarray, x: np.ndarray, seen: np.ndarray,
              touched: list[np.ndarray]) -> LocalScores:
        d = self.damping
        np.add.at(x, seeds, w / self.sqrt_deg[seeds])
        frontier = np.unique(seeds)
        seen[frontier] = True
        touched.append(frontier)
        indptr, indices, sqrt_deg = self.indptr, self.indices, self.sqrt_deg
        edges = 0
        while frontier.size and edges <= self.max_edges:
            mass = x[frontier]
            x[frontier] = 0.0
            p[frontier] += (1 - d) * sqrt_deg[frontier] * mass
            start = indptr[frontier].astype(np.int64)
            counts = indptr[frontier + 1] - start
            m = int(counts.sum())
            edges += m
            if m == 0:
                break
            # the edge slots of every frontier vertex, concatenated: start[i] .. start[i] + counts[i]
            offs = np.repeat(start - (np.cumsum(counts) - counts), counts) + np.arange(m)
            targets = indices[offs]
            np.add.at(x, targets, self._spread(frontier, mass, offs, targets, counts))
            fresh = targets[~seen[targets]]
            if fresh.size:
                fresh = np.unique(fresh)
                seen[fresh] = True
                touched.append(fresh)
            hot = targets[x[targets] >= self.eps * sqrt_deg[targets]]
            frontier = np.unique(hot)
        t = np.concatenate(touched)
        q = sqrt_deg[t] * x[t]
        residual = float(q.sum())
        total = float(p[t].sum()) + residual
        scores = (p[t] + (1 - d) * q) / total
        vertices = t if self.perm is None else self.perm[t]
        return LocalScores(vertices, scores, d * residual / total, total, edges, not frontier.size)

    def top(self, seeds: np.ndarray, weights: np.ndarray, rows: int, k: int) -> tuple[np.ndarray, np.ndarray, LocalScores]:
        """The ``k`` best of the vertices ``0 … rows-1`` (the passages), best first with ties by index, and their
        scores; vertices the push never reached score 0 and follow in index order, as a whole-graph ranking
        would order them."""
        res = self.solve(seeds, weights)
        keep = res.vertices < rows
        v, s = res.vertices[keep], res.scores[keep]
        order = np.lexsort((v, -s))[:k]
        v, s = v[order], s[order]
        if len(v) < k:  # pad with unreached rows, lowest index first
            reached = np.zeros(rows, dtype=bool)
            reached[v] = True
            extra = np.flatnonzero(~reached)[: k - len(v)]
            v, s = np.concatenate([v, extra]), np.concatenate([s, np.zeros(len(extra))])
        return v, s, res
