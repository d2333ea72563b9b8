"""Local Personalized PageRank for one query: forward push (Andersen, Chung & Lang 2006), a frontier at a time.

The same PageRank as :mod:`routerag.retrieval.ppr`: on an undirected weighted graph with weighted degrees ``D``,
``p = (1-d) r + d A D⁻¹ p``, normalised to sum 1 (igraph's prpack). Push keeps an estimate ``p`` and a residual
``q`` with the invariant  ``p_true = p + PPR(q)``  (PPR is linear in its reset). Pushing vertex ``u`` moves
``(1-d) q[u]`` into ``p[u]`` and spreads ``d q[u] A[v,u] / D[u]`` to each neighbour ``v``. Every vertex whose
residual is at least ``eps · D[u]`` is pushed at once (one frontier per round: a few numpy calls instead of a loop
over vertices), until no vertex is left above its threshold. Only the seeds' neighbourhood is ever touched.

Error bound: when it stops every residual is below ``eps · D[u]``, and on an undirected graph
``PPR(e_u)[v] / D[v] = PPR(e_v)[u] / D[u]``, so ``p_true[v] − p[v] = Σ_u q[u] PPR(e_u)[v] < eps · D[v]``: each
vertex's (unnormalised) score is low by less than ``eps`` times its weighted degree, never high. The total is
exact: a vertex with edges passes on all its mass, so the unnormalised PageRank sums to ``Σp + Σq`` and that is the
divisor. A vertex without edges (possible only as a seed) keeps ``(1-d)`` of its reset and loses the rest, as in the
Chebyshev solver; prpack's redistribution of that loss is the normalisation.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .ppr import igraph_adjacency


class PushPPR:
    """Forward-push PPR on a fixed graph; :meth:`solve` takes one sparse reset."""

    def __init__(self, adjacency: sp.spmatrix, *, damping: float = 0.5, eps: float = 1e-7,
                 max_pushes: int | None = None) -> None:
        a = sp.csr_matrix(adjacency, dtype=np.float64)
        a.sum_duplicates()
        self.n = a.shape[0]
        self.damping = damping
        self.eps = eps
        self.deg = np.asarray(a.sum(axis=1)).ravel()
        safe = np.where(self.deg > 0, self.deg, 1.0)
        # row u: the share A[u,v] / D[u] of u's residual each neighbour v receives (A is symmetric)
        self.indptr = a.indptr.astype(np.int64)
        self.indices = a.indices.astype(np.int32)
        self.share = a.data * np.repeat(1.0 / safe, np.diff(a.indptr))
        self.threshold = eps * self.deg
        self.max_pushes = max_pushes or 50 * max(a.nnz, 1)
        """Work bound (edges scanned) after which :meth:`solve` gives up and says so (the caller falls back)."""

    @classmethod
    def from_igraph(cls, graph, weight: str = "weight", **kwargs) -> PushPPR:  # noqa: ANN001
        return cls(igraph_adjacency(graph, weight), **kwargs)

    def solve(self, seeds: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, float] | None:
        """Unnormalised estimate ``p`` (length n) and the exact total it is to be divided by, for the reset
        ``weights`` on vertices ``seeds`` (normalised to sum 1 first); None when the work bound was reached."""
        d = self.damping
        w = np.asarray(weights, dtype=np.float64)
        total_w = float(w.sum())
        if total_w <= 0:
            raise ValueError("the reset needs some positive mass")
        p = np.zeros(self.n)
        q = np.zeros(self.n)
        np.add.at(q, np.asarray(seeds, dtype=np.int64), w / total_w)
        frontier = np.unique(np.asarray(seeds, dtype=np.int64))
        frontier = frontier[q[frontier] >= self.threshold[frontier]]
        work = 0
        indptr, indices, share = self.indptr, self.indices, self.share
        while frontier.size:
            mass = q[frontier]
            q[frontier] = 0.0
            p[frontier] += (1 - d) * mass
            start, stop = indptr[frontier], indptr[frontier + 1]
            counts = stop - start
            m = int(counts.sum())
            work += m
            if work > self.max_pushes:
                return None
            if m == 0:
                break
            # the edge slots of every frontier vertex, concatenated: start[i] .. stop[i]
            offs = np.repeat(start - np.cumsum(counts) + counts, counts) + np.arange(m)
            targets = indices[offs]
            spread = share[offs] * np.repeat(d * mass, counts)
            if m < 64:
                np.add.at(q, targets, spread)
            else:
                _scatter_add(q, targets, spread)
            cand = np.unique(targets)
            frontier = cand[q[cand] >= self.threshold[cand]]
        return p, float(p.sum() + q.sum())


def _scatter_add(out: np.ndarray, idx: np.ndarray, vals: np.ndarray) -> None:
    """``out[idx] += vals`` with repeated indices summed (bincount over the touched range beats np.add.at)."""
    lo = int(idx.min())
    out[lo: int(idx.max()) + 1] += np.bincount(idx - lo, weights=vals)
