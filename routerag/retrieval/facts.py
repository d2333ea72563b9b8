"""Query-to-fact matching: the top facts of each query and the min and max of its scores over *all* facts (HippoRAG
2 min-max normalises fact scores over the whole table), exactly as a float32 scan would give them.

A single query is memory-bound: the float32 fact table is read once per query (103 MB for 67k facts × 384
dimensions). So a few queries scan a smaller copy first and rescore in float32 only the facts that could be in the
exact top k or be the exact minimum given a proven error bound on the copy's scores: an int8 copy in ONNX Runtime
(``graph_index.ort_session.Int8Screen``, a quarter of the bytes; 0.41 against 1.39 ms per PopQA question alone)
or, without ONNX Runtime, a float16 copy in torch (half the bytes, :meth:`FactScorer._match_one`). The result
equals the float32 scan's, up to that scan's own rounding: facts whose scores differ by less than float32
resolution may come in either order.

Large batches go through one float32 GEMM instead, where the arithmetic is amortised and bandwidth matters less. It
runs in ONNX Runtime (``graph_index.ort_session.TopScan``) where that is installed, as the query encoder does: a
small graph of the GEMM, ONNX's TopK and the row minimum and maximum, so only k + 2 numbers per query leave it. On
the PopQA index that took 0.14 ms per query against 0.42 for numpy's GEMM with torch's top-k, and 0.24 for the
bfloat16 screen it replaced (exact scores, no bound needed; ``docs/benchmarks.md``).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np

from graph_index.dense import SCREEN_QUERIES

log = logging.getLogger(__name__)

SMALL_BATCH = SCREEN_QUERIES
"""Up to this many queries are screened (all at once in int8, or each in float16) and rescored; beyond, one float32
GEMM. The same crossover as the dense index's (``graph_index.dense.SCREEN_QUERIES``), so a small search screens
both tables or neither."""
_U16 = 2.0**-11
"""Unit roundoff of float16 (rounding to nearest)."""
_U32 = 2.0**-24
BatchScan = Literal["auto", "onnxruntime", "blas"]
SmallBatchScan = Literal["auto", "int8", "float"]


@dataclass(slots=True)
class FactMatches:
    """Per query (rows): the top fact indices best first (ties by index), their exact scores, and the minimum and
    maximum score over all facts."""

    top: np.ndarray
    scores: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


class FactScorer:
    def __init__(self, fact_emb: np.ndarray, half: np.ndarray | None = None, *, blas_threads: int = 0,
                 batch_scan: BatchScan = "auto", small_batch_scan: SmallBatchScan = "auto") -> None:
        """``half``: the float16 copy of ``fact_emb`` when the index has one on disk (mapped, so no copy is made
        here); without it the copy is computed, in memory. ``blas_threads``: threads for a batch's GEMM (0 =
        torch's thread count). ``batch_scan`` (``retrieval.batch_scan``): ``onnxruntime`` runs a batch
        through ``graph_index.ort_session.TopScan``, ``blas`` through numpy's BLAS split over Python threads
        (:meth:`_gemm`) and torch's top-k; ``auto`` is ONNX Runtime where it is installed."""
        import warnings

        import torch

        self.emb = fact_emb  # float32, possibly memory-mapped
        self.n, self.dim = fact_emb.shape
        if half is None:
            half = np.asarray(fact_emb, dtype=np.float16)
        self.half_rows = half  # the array the tensor below shares memory with (a mapping, when given one)
        with warnings.catch_warnings():  # a read-only mapping: torch warns about writes, and none are made
            warnings.simplefilter("ignore", UserWarning)
            self.half = torch.from_numpy(half)
        self.max_norm = float(np.sqrt(np.max(np.einsum("ij,ij->i", fact_emb, fact_emb)))) if self.n else 0.0
        self.blas_threads = blas_threads or torch.get_num_threads()
        if batch_scan == "onnxruntime" and not _onnxruntime():
            raise RuntimeError("retrieval.batch_scan = onnxruntime, but onnxruntime is not installed "
                               "(pip install onnxruntime, or set it to auto or blas)")
        self.scan = None  # graph_index.ort_session.TopScan, for batches
        if batch_scan != "blas" and self.n and _onnxruntime():
            from graph_index.ort_session import TopScan

            self.scan = TopScan(fact_emb, self.blas_threads)
        self.screen = None  # graph_index.ort_session.Int8Screen, for up to SMALL_BATCH queries
        if small_batch_scan != "float" and self.n:
            self.screen = _int8_screen(fact_emb, self.blas_threads, required=small_batch_scan == "int8")

    def bound(self, q_norm: float) -> float:
        """Largest possible |float16 score − float32 score| for a query of this norm: rounding query and fact to
        float16 (≤ u‖q‖‖f‖ each, plus the product of both), float32 accumulation over ``dim`` terms, and the
        rounding of the result to float16 (≤ u |score|); subnormal float16 components add at most dim·2⁻²⁵."""
        qf = q_norm * self.max_norm
        return qf * (3 * _U16 + _U16 * _U16 + self.dim * _U32 * 2) + self.dim * 2.0**-25 * (q_norm + self.max_norm)

    def match(self, q: np.ndarray, k: int) -> FactMatches:
        k = min(k, self.n)
        if q.shape[0] > SMALL_BATCH:
            if self.scan is not None:
                scores, top, lo, hi = self.scan(q, k)
                return FactMatches(top, scores, lo, hi)
            return self._match_gemm(q, k)
        if self.screen is not None:
            scores, top, lo, hi = self.screen(q, k)
            return FactMatches(top, scores, lo, hi)
        rows = [self._match_one(np.ascontiguousarray(v, dtype=np.float32), k) for v in q]
        return FactMatches(*(np.stack(parts) for parts in zip(*rows)))

    def _match_gemm(self, q: np.ndarray, k: int) -> FactMatches:
        raw = self._gemm(np.ascontiguousarray(q, dtype=np.float32))
        top = top_rows(raw, k)
        return FactMatches(top, np.take_along_axis(raw, top, axis=1), raw.min(axis=1), raw.max(axis=1))

    def _gemm(self, q: np.ndarray) -> np.ndarray:
        """q @ factsᵀ, its query rows split over ``blas_threads`` Python threads, each running single-threaded
        BLAS (which releases the GIL). Not OpenBLAS's own threads: they spin after a call and took a core from the
        PageRank that follows (a batch's PageRank went from 1.2 to 1.9 ms per query)."""
        parts = min(self.blas_threads, max(1, q.shape[0] // SMALL_BATCH))
        if parts == 1:
            return q @ self.emb.T
        out = np.empty((q.shape[0], self.n), dtype=np.float32)
        bounds = np.linspace(0, q.shape[0], parts + 1).astype(int)

        def part(i: int) -> None:
            np.matmul(q[bounds[i]:bounds[i + 1]], self.emb.T, out=out[bounds[i]:bounds[i + 1]])

        list(_pool(parts).map(part, range(parts)))
        return out

    def _match_one(self, v: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float, float]:
        import torch

        approx = torch.mv(self.half, torch.from_numpy(v.astype(np.float16))).float()
        margin = 2 * self.bound(float(np.linalg.norm(v)))
        # candidates: every fact whose float16 score is within 2·bound of the k-th best (or of the minimum)
        width = min(self.n, max(4 * k, 32))
        while True:
            best = torch.topk(approx, width).values
            cut = float(best[k - 1]) - margin
            if width == self.n or float(best[-1]) < cut:
                break
            width = min(self.n, width * 4)
        lowest = float(approx.min())
        cand = torch.nonzero((approx >= cut) | (approx <= lowest + margin)).ravel().numpy()
        exact = self.emb[cand] @ v
        order = np.lexsort((cand, -exact))[:k]
        return cand[order], exact[order], float(exact.min()), float(exact.max())


@cache
def _pool(n: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``n`` threads (created once; fact GEMMs of concurrent batches share it)."""
    return ThreadPoolExecutor(n, thread_name_prefix="fact-gemm")


os.register_at_fork(after_in_child=_pool.cache_clear)  # a forked child has none of the parent's threads


def _int8_screen(table: np.ndarray, threads: int, *, required: bool):  # noqa: ANN202 - an Int8Screen or None
    """The int8 screen of ``table``, or None where it cannot be made (no ONNX Runtime, a table past its size or not
    finite) and was not ``required`` (then that is an error)."""
    from graph_index.ort_session import Int8Screen

    why = ("onnxruntime is not installed (pip install onnxruntime)" if not _onnxruntime()
           else None if Int8Screen.fits(table) else f"{table.shape[0]} rows of {table.shape[1]} pass its size limit")
    if why is None:
        try:
            return Int8Screen(table, threads, with_range=True)
        except ValueError as exc:  # NaN or infinity in the table: it stays on the float path, as before
            why = str(exc)
    if required:
        raise RuntimeError(f"retrieval.small_batch_scan = int8, but {why}; set it to auto or float")
    log.info("one query's scans stay in float: %s", why)
    return None


def _onnxruntime() -> bool:
    from graph_index.ort_session import onnx_available

    return onnx_available()


def top_rows(x: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest entries of each row, best first (ties by index).

    torch.topk selects (multi-threaded, several times faster than numpy's argpartition on wide rows); the winners
    are then ordered by (score, index) so ties are deterministic.
    """
    import torch

    k = min(k, x.shape[1])
    _, idx = torch.topk(torch.from_numpy(np.ascontiguousarray(x)), k, dim=1, sorted=False)
    part = idx.numpy()
    vals = np.take_along_axis(x, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)
    return np.take_along_axis(part, order, axis=1)


class FaissFactScorer:
    """Fact matching through an approximate FAISS index: ``retrieval.fact_index = "ann"`` (the scale profile's HNSW
    or inverted-file index written by the build, ``graph_index/ann.py``), or ``"hnsw"`` / ``"ivfpq"`` built in memory when the index
    is opened; for fact tables too large to scan per query (docs/scaling.md).

    HippoRAG 2 min-max normalises a query's fact scores over *all* facts. The maximum is the best hit; the minimum is
    found by the same index, searched with the negated query (min_f q·f = −max_f (−q)·f), so no scan is needed.
    Both are approximate, as the top facts are; ``benchmarks/fact_index.py`` measures the recall of the exact top
    facts and the end-to-end retrieval recall. The facts found (the top ones and the lowest) are rescored exactly from
    the (memory-mapped) float32 rows, so every score used is a true score of some fact.
    """

    def __init__(self, fact_emb: np.ndarray, kind: str, *, index=None, hnsw_m: int = 32,  # noqa: ANN001
                 ef_search: int = 64, nlist: int | None = None, nprobe: int = 16, pq_m: int = 32) -> None:
        import faiss

        self.emb = fact_emb
        self.n, self.dim = fact_emb.shape
        self.kind = kind
        self.params = self.low_params = None
        if kind == "ann":
            from graph_index import ann

            if index is None:
                raise ValueError("fact_index = ann needs the index's facts.ann.faiss")
            self.index = index
            self.params = ann.params(index, ef_search, nprobe)
            self.low_params = ann.params(index, max(16, ef_search // 4), max(1, nprobe // 4))
            return
        vecs = np.ascontiguousarray(fact_emb, dtype=np.float32)
        if kind == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = ef_search
        elif kind == "ivfpq":
            nlist = nlist or max(1, min(4096, int(4 * np.sqrt(self.n))))
            quantizer = faiss.IndexFlatIP(self.dim)
            index = faiss.IndexIVFPQ(quantizer, self.dim, nlist, pq_m if self.dim % pq_m == 0 else 8, 8,
                                     faiss.METRIC_INNER_PRODUCT)
            index.train(vecs[np.random.default_rng(0).permutation(self.n)[:max(nlist * 39, 10_000)]])
            index.nprobe = nprobe
        else:
            raise ValueError(f"unknown fact index {kind!r}: exact, ann, hnsw or ivfpq")
        index.add(vecs)
        self.index = index

    def match(self, q: np.ndarray, k: int) -> FactMatches:
        k = min(k, self.n)
        q = np.ascontiguousarray(q, dtype=np.float32)
        width = max(4 * k, 32)  # candidates, rescored exactly below
        _, top = self.index.search(q, min(width, self.n), params=self.params)
        _, lowest = self.index.search(-q, 1, params=self.low_params)
        tops, scores, lo, hi = [], [], [], []
        for r in range(q.shape[0]):
            cand = np.sort(top[r][top[r] >= 0])  # mapped rows read in file order
            exact = np.asarray(self.emb[cand], dtype=np.float32) @ q[r]
            order = np.lexsort((cand, -exact))[:k]
            tops.append(cand[order])
            scores.append(exact[order])
            hi.append(float(exact.max()))
            # the negated query's best hit, rescored exactly (a PQ code's score is itself approximate)
            low = float(np.asarray(self.emb[lowest[r][0]], dtype=np.float32) @ q[r]) if lowest[r][0] >= 0 else np.inf
            lo.append(min(low, float(exact.min())))
        return FactMatches(np.stack(tops), np.stack(scores), np.asarray(lo), np.asarray(hi))
