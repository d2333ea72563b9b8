"""Batched Personalized PageRank: one sparse computation for a whole batch of queries.

For an undirected weighted graph with adjacency ``A`` and weighted degrees ``D``, PPR with damping ``d`` and reset
``r`` solves ``p = (1-d) r + d A D⁻¹ p``. With ``x = D^-½ p`` this is the symmetric system

    (I - d S) x = (1-d) D^-½ r,      S = D^-½ A D^-½,

whose spectrum lies in [1-d, 1+d]. Chebyshev iteration uses exactly those bounds: no inner products (so a batch of
right-hand sides is one sparse-times-dense product per step), and an error bound known in advance, so the number
of steps follows from the tolerance: about 11 steps for 1e-6 at d = 0.5, where plain power iteration needs 20.

Vertices without edges keep their own reset mass; igraph's prpack sends a dangling vertex's mass back through the
reset distribution, which amounts to normalising the solution to sum 1 — done here, so results match
``Graph.personalized_pagerank(implementation="prpack")``.

Speed (all exact, the same recurrence): vertices are renumbered by reverse Cuthill–McKee so that neighbours sit
close in memory; a batch is processed in column chunks that stay in cache, side by side on single-threaded workers;
the first steps multiply only the rows around the seeds, the rest go through torch's CSR kernels. On CUDA
everything runs in torch.sparse.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Literal

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

Device = Literal["auto", "cpu", "cuda"]

CHUNK = 16
"""Columns per block: narrow blocks stay in cache, wide ones read the matrix fewer times, and 16 float32 columns
are one 64-byte cache line per row. With a batch's chunks on single-threaded workers (``_chunk_pool``), on a
67k-vertex graph and an AVX-512 host, 16 took 0.91-0.99 of 24's time and 0.80-0.82 of 20-22's, whose rows straddle
cache lines (``benchmarks/ppr_steps.py --chunks``, six runs). With chunks one after another on two threads, 24 had
been 6-11% faster than 16."""
LOCAL_NNZ = 0.01
"""Use row-sliced products (the first steps around the seeds) while the rows that may be non-zero hold at most this
share of the matrix's non-zeros. It was a share of rows (2%), but a few hub rows hold most of a neighbourhood's
non-zeros, and a row-sliced step (scipy, one thread) costs more than a whole product (torch, both cores) long before
2% of rows: on the PopQA graph, counting non-zeros made batched solves 11-12% and single ones 4-5% faster (two
runs of eight interleaved passes; scores within 1.1e-7, top-10 identical). On a large graph the seeds' first hops
stay local, and this phase still saves whole products there."""


def chebyshev_steps(damping: float, tol: float) -> int:
    """Steps after which the Chebyshev error bound 2ρᵏ/(1+ρ²ᵏ) falls below ``tol`` (relative)."""
    kappa = (1 + damping) / (1 - damping)
    rho = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)
    if rho <= 0:
        return 1
    return max(1, math.ceil(math.log(tol / 2) / math.log(rho)))


def undirected_adjacency(n: int, sources: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> sp.coo_matrix:
    """The symmetric n × n adjacency of an undirected edge list (each edge once)."""
    w = np.asarray(weights, dtype=np.float64)
    return sp.coo_matrix((np.concatenate([w, w]), (np.concatenate([sources, targets]),
                                                   np.concatenate([targets, sources]))), shape=(n, n))


def igraph_adjacency(graph, weight: str = "weight") -> sp.coo_matrix:  # noqa: ANN001
    """The symmetric adjacency of an undirected igraph graph, weighted by the edge attribute ``weight``."""
    edges = np.asarray(graph.get_edgelist(), dtype=np.int64).reshape(-1, 2)
    weights = np.asarray(graph.es[weight] if graph.ecount() else [], dtype=np.float64)
    return undirected_adjacency(graph.vcount(), edges[:, 0], edges[:, 1], weights)


class PPRSolver:
    """PPR over a fixed graph for many reset vectors at once."""

    def __init__(self, adjacency: sp.spmatrix, *, damping: float = 0.5, tol: float = 1e-5,
                 device: Device = "auto", dtype: type = np.float32, reorder: bool = True) -> None:
        if not 0 < damping < 1:
            raise ValueError("damping must be in (0, 1)")
        a = sp.csr_matrix(adjacency, dtype=np.float64)
        a.sum_duplicates()
        if a.shape[0] != a.shape[1]:
            raise ValueError("adjacency must be square")
        self.n = a.shape[0]
        self.damping = damping
        self.steps = chebyshev_steps(damping, tol)
        # perm[i] = original vertex at internal position i
        self.perm = reverse_cuthill_mckee(a, symmetric_mode=True) if reorder and self.n > 1 else np.arange(self.n)
        self.inv = np.empty_like(self.perm)
        self.inv[self.perm] = np.arange(self.n)
        a = a[self.perm][:, self.perm].tocsr()
        deg = np.asarray(a.sum(axis=1)).ravel()
        safe = np.where(deg > 0, deg, 1.0)
        self.inv_sqrt_deg = (1.0 / np.sqrt(safe)).astype(dtype)
        self.sqrt_deg = np.sqrt(safe).astype(dtype)
        s = sp.diags(1.0 / np.sqrt(safe)) @ a @ sp.diags(1.0 / np.sqrt(safe))
        self.S = sp.csr_matrix(s, dtype=dtype)
        self.S.sort_indices()
        self._row_nnz = np.diff(self.S.indptr)
        self.dtype = dtype
        self.device = _pick_device(device)
        self._resident: dict | None = None
        import warnings

        import torch

        dev = "cuda" if self.device == "cuda" else "cpu"
        # the residual operator M = d S - I as one sparse matrix: r += M s is then a single in-place product, with
        # no separate pass over the dense block to subtract s (the whole-product steps are bound by such passes)
        m = sp.csr_matrix(damping * self.S - sp.identity(self.n, dtype=dtype, format="csr"), dtype=dtype)
        m.sort_indices()
        self.M = m
        # 32-bit indices halve the index traffic of every product (2x faster on the CPU) while nnz allows; on the CPU
        # the tensor shares M's arrays (scipy already holds them as int32), so memory_bytes counts it once
        idx = np.int32 if m.nnz < np.iinfo(np.int32).max else np.int64
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the product we use is stable
            warnings.simplefilter("ignore", UserWarning)
            self._torch_M = torch.sparse_csr_tensor(
                torch.from_numpy(m.indptr.astype(idx, copy=False)),
                torch.from_numpy(m.indices.astype(idx, copy=False)),
                torch.from_numpy(m.data), size=m.shape, device=dev, check_invariants=False)

    @classmethod
    def from_edges(cls, n: int, sources: np.ndarray, targets: np.ndarray, weights: np.ndarray,
                   **kwargs) -> PPRSolver:
        """An undirected graph given by its edge list (each edge once)."""
        return cls(undirected_adjacency(n, sources, targets, weights), **kwargs)

    @classmethod
    def from_igraph(cls, graph, weight: str = "weight", **kwargs) -> PPRSolver:  # noqa: ANN001
        return cls(igraph_adjacency(graph, weight), **kwargs)

    def solve(self, reset: np.ndarray | sp.spmatrix, rows: np.ndarray | None = None, *,
              validate: bool = True) -> np.ndarray:
        """PPR scores for each column of ``reset`` (n × batch, non-negative, dense or scipy.sparse; a 1-D vector
        is one query).

        Each column is normalised to sum 1 first, as igraph does, and so is each result. ``rows`` restricts the
        returned scores to those vertices (e.g. the passage nodes) without changing the normalisation.
        ``validate=False`` skips the check for negative or non-finite entries (for callers that built the reset).
        A sparse reset (a few seeds per query) is expanded one column chunk at a time.
        """
        if sp.issparse(reset):
            r = sp.csc_matrix(reset, dtype=self.dtype)
            single = False
        else:
            r = np.asarray(reset, dtype=self.dtype)
            single = r.ndim == 1
            if single:
                r = r[:, None]
        if r.shape[0] != self.n:
            raise ValueError(f"reset has {r.shape[0]} rows, the graph {self.n} vertices")
        if validate:
            data = r.data if sp.issparse(r) else r
            if not (np.isfinite(data).all() and (data >= 0).all()):
                if sp.issparse(r):
                    r.data = np.where(np.isfinite(r.data) & (r.data > 0), r.data, 0).astype(self.dtype)
                else:
                    r = np.where(np.isfinite(r) & (r > 0), r, 0).astype(self.dtype)
        total = np.asarray(r.sum(axis=0)).ravel()
        if np.any(total <= 0):
            raise ValueError("every reset vector needs some positive mass")
        # the right-hand side in internal vertex order, kept sparse: normalised reset × (1 - d) × D^-1/2
        r = sp.csc_matrix(r)
        r.sum_duplicates()
        col_of = np.repeat(np.arange(r.shape[1]), np.diff(r.indptr))
        internal = self.inv[r.indices]
        values = r.data * ((1 - self.damping) / total)[col_of] * self.inv_sqrt_deg[internal]
        rhs = sp.csc_matrix((values.astype(self.dtype), internal, r.indptr), shape=r.shape)
        out_rows = self.inv[rows] if rows is not None else self.inv
        if self.device == "cuda":
            out = self._solve_resident(rhs, rows, out_rows)
            return out[:, 0] if single else out
        out = np.empty((len(out_rows), r.shape[1]), dtype=self.dtype)

        def solve_chunk(cols: slice) -> None:
            x = self._chebyshev(rhs[:, cols])
            # p = D^1/2 x, normalised to sum 1; only the requested rows are scaled
            totals = self.sqrt_deg @ x
            out[:, cols] = x[out_rows] * (self.sqrt_deg[out_rows, None] / totals[None, :])

        chunks = [slice(start, start + CHUNK) for start in range(0, r.shape[1], CHUNK)]
        workers = _torch_threads() if self.device == "cpu" and len(chunks) > 1 else 1
        if workers > 1:  # chunks are independent: one per single-threaded worker (see _chunk_pool)
            list(_chunk_pool(workers).map(solve_chunk, chunks))
        else:
            for cols in chunks:
                solve_chunk(cols)
        return out[:, 0] if single else out

    def _chebyshev(self, rhs: sp.csc_matrix) -> np.ndarray:
        """Solve (I - d S) x = b for a block of columns (Saad, Iterative Methods, Alg. 12.1).

        Two phases of the same recurrence. While the iterate lives on a few hops around the seeds, only those rows
        are touched (scipy; ``support`` holds the rows where it may be non-zero, so nothing scans the whole
        block). Then whole products: on the CPU in torch on views of the same numpy buffers, whose CSR kernels (on
        the caller's threads, or one per chunk worker) with 32-bit indices beat scipy's at every block width
        (``addmv``/``addmm`` accumulate in place). The whole-product steps are :meth:`_torch_steps`, shared with the
        CUDA path.
        """
        b = rhs.toarray(order="C")  # CSC would default to Fortran order: strided rows defeat the kernels
        d = self.damping
        sigma, rho = 1.0 / d, d  # M = I - d S has eigenvalues in [1 - d, 1 + d]: centre 1, half-width d
        x = np.zeros_like(b)
        res = b
        step = b.copy()
        support = np.unique(rhs.indices)
        k = 0
        while k < self.steps and self._row_nnz[support].sum() <= LOCAL_NNZ * self.S.nnz:  # local phase
            rows = self.S[support]
            reached = np.zeros(self.n, dtype=bool)  # S @ step is zero outside support and its neighbours
            reached[support] = True
            reached[rows.indices] = True
            reach = np.flatnonzero(reached)
            x[support] += step[support]
            s_step = (rows.T @ step[support])[reach]  # (S @ step)[reach]; S is symmetric
            res[reach] += d * s_step - step[reach]  # res -= step - d S step
            rho_next = 1.0 / (2 * sigma - rho)
            step[reach] = (rho_next * rho) * step[reach] + (2 * rho_next / d) * res[reach]
            rho = rho_next
            support = reach
            k += 1
        if k == self.steps:
            return x
        import torch

        one = b.shape[1] == 1
        # torch views share the numpy buffers: the result lands in x
        xt, rt, st = (torch.from_numpy(a[:, 0] if one else a) for a in (x, res, step))
        self._torch_steps(xt, rt, st, rho, k)
        return x

    def _solve_resident(self, rhs: sp.csc_matrix, rows: np.ndarray | None, out_rows: np.ndarray) -> np.ndarray:
        """The whole solve on the operator's device (CUDA): only the seeds go to the GPU and only the requested
        rows come back.

        Why: with the dense right-hand side built, and the solution normalised and cut to ``rows``, on the host,
        one query at 1M passages (8.8M vertices) took 145 ms on an H200, mostly copying and scanning 35 MB
        vectors on the host (``benchmarks/ppr_devices.py``). Columns go in chunks that keep the three n-long
        blocks of the recurrence under about 2 GB.
        """
        import torch

        dev = self._torch_M.device
        if self._resident is None:
            self._resident = {"sqrt_deg": torch.from_numpy(self.sqrt_deg).to(dev)}
        cache = self._resident
        if cache.get("rows_src") is not rows or "rows" not in cache:  # the retriever passes the same array
            cache["rows_src"], cache["rows"] = rows, torch.from_numpy(out_rows.astype(np.int64)).to(dev)
        sqrt_deg, rows_t = cache["sqrt_deg"], cache["rows"]
        width = int(max(1, min(256, 2e9 // (12 * max(self.n, 1)))))
        parts = []
        for start in range(0, rhs.shape[1], width):
            part = rhs[:, start:start + width]
            cols = np.repeat(np.arange(part.shape[1]), np.diff(part.indptr))
            b = torch.zeros((self.n, part.shape[1]), dtype=torch.float32, device=dev)
            b[torch.from_numpy(part.indices.astype(np.int64)).to(dev), torch.from_numpy(cols).to(dev)] = \
                torch.from_numpy(np.asarray(part.data, dtype=np.float32)).to(dev)
            rt = b[:, 0] if part.shape[1] == 1 else b
            st, xt = rt.clone(), torch.zeros_like(rt)
            self._torch_steps(xt, rt, st, self.damping, 0)
            x = xt.reshape(self.n, -1)
            totals = sqrt_deg @ x  # p = D^1/2 x, normalised to sum 1
            parts.append((x[rows_t] * (sqrt_deg[rows_t, None] / totals[None, :])).cpu().numpy())
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def _torch_steps(self, xt, rt, st, rho: float, start: int) -> None:  # noqa: ANN001 - torch tensors
        """Chebyshev steps ``start`` … ``steps - 1`` in place on torch tensors (CPU views or CUDA), from the
        recurrence state ``rho``.

        Three passes over the dense block per step instead of five: the step is kept as ``c · u`` with the scalar
        ``c`` carried aside, so the update s ← a·s + b·r becomes u ← u + (b / (a·c))·r, c ← a·c, and the residual
        update r ← r + d S s − s is one product with M = d S − I (``addmv``/``addmm`` accumulate in place). Same
        recurrence, so the same iterate up to float32 rounding; ``st`` is left scaled by 1/c.
        """
        d = self.damping
        sigma = 1.0 / d
        accumulate = rt.addmv_ if rt.dim() == 1 else rt.addmm_
        c = 1.0
        for _ in range(start, self.steps):
            xt.add_(st, alpha=c)
            accumulate(self._torch_M, st, alpha=c)
            rho_next = 1.0 / (2 * sigma - rho)
            a, b = rho_next * rho, 2 * rho_next / d
            st.add_(rt, alpha=b / (a * c))
            c *= a
            if c < 1e-12:  # u grows as 1/c: fold c back in before float32 could overflow (long solves only)
                st.mul_(c)
                c = 1.0
            rho = rho_next


def igraph_ppr(graph, reset: np.ndarray, damping: float = 0.5, weight: str = "weight") -> np.ndarray:  # noqa: ANN001
    """The per-query reference: igraph's prpack, as HippoRAG 2 calls it."""
    r = np.where(np.isfinite(reset) & (reset > 0), reset, 0)
    return np.asarray(graph.personalized_pagerank(vertices=None, directed=False, damping=damping,
                                                  weights=weight, reset=r.tolist(), implementation="prpack"))


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


_POOL_LOCK = threading.Lock()


@cache
def _chunk_pool(workers: int) -> ThreadPoolExecutor:
    """``workers`` threads whose torch ops run on one thread each, solving a batch's column chunks side by side.

    Why: a chunk's steps on torch's two intra-op threads share every block between the cores, and on this host
    that sharing made the sparse product slower than on one thread in some spells (two threads 1.8 ms against
    one thread 1.2 ms, where in other spells two took 0.7). Chunks share nothing but the matrix, which is only
    read: the same 500 PopQA queries' batched solves took 0.420 against 0.993 ms per query in such a spell and
    0.429 against 0.465 in a quiet one (``benchmarks/ppr_steps.py --chunk-workers``, ten interleaved passes
    each), with identical scores.

    torch keeps a thread's intra-op thread count per thread once its first op has read the process-wide value, so
    each worker reads it, then sets its own to one; that also sets the process-wide value, which is put back once
    every worker has started (under a lock, so only threads whose very first torch op falls in that moment start
    with one thread)."""
    import torch

    with _POOL_LOCK:
        before = torch.get_num_threads()
        started = threading.Barrier(workers)

        def one_thread() -> None:
            torch.get_num_threads()  # this thread's settings from the process-wide value, before changing them
            torch.set_num_threads(1)

        pool = ThreadPoolExecutor(workers, thread_name_prefix="ppr-chunk", initializer=one_thread)
        list(pool.map(lambda _: started.wait(), range(workers)))  # every worker has started and set itself
        torch.set_num_threads(before)
    return pool


os.register_at_fork(after_in_child=_chunk_pool.cache_clear)  # a forked child has none of the parent's threads


def _pick_device(device: Device) -> str:
    if device == "cpu":
        return "cpu"
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        cuda = False
    if device == "cuda" and not cuda:
        raise RuntimeError("device=cuda asked for PPR, but torch sees no CUDA device")
    return "cuda" if cuda else "cpu"
