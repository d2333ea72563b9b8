"""The dense passage index: FAISS, exact inner product by default, IVF or HNSW for large corpora, moved to a GPU
when faiss-gpu and a CUDA device are present."""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import faiss
import numpy as np

from .config import DenseIndexConfig
from .ort_session import Int8Screen, TopScan, onnx_available

log = logging.getLogger(__name__)

_MIN_POINTS_PER_CELL = 39  # FAISS warns below this many training points per IVF centroid
SCREEN_QUERIES = 8
"""Most queries :func:`search` sends through an int8 screen (a few queries' scans are bound by reading the table;
more share one float32 GEMM); the fact match uses the same number (``routerag.retrieval.facts.SMALL_BATCH``)."""
SCREEN_FROM_BYTES = 6 << 20
"""Smallest flat index (its float32 vectors) given an int8 screen: below it FAISS reads the vectors in less than the
screen's fixed cost of about 0.2 ms. One PopQA query after its encoding, on the first n passage vectors (100
questions, order alternating): 1,000 rows FAISS 0.083 against the screen's 0.206 ms, 4,000 0.242 against 0.257,
7,594 0.437 against 0.307."""
_BLAS_LOCK = threading.Lock()


def search(index: faiss.Index, queries: np.ndarray, k: int, *, blas_from: int = 0,
           scan: TopScan | None = None, screen: Int8Screen | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``index.search``, with up to ``SCREEN_QUERIES`` queries through ``screen`` (an int8 copy of the flat index's
    vectors, :func:`small_scan`), and batches of at least ``blas_from`` queries (0: never) through ``scan`` (its
    vectors in ONNX Runtime, :func:`batch_scan`) or else FAISS's BLAS kernel. Same (scores, ids) every way: b × k,
    best first, padded with id -1 past the index's size.

    Why the int8 screen: one query reads the whole table, and the int8 copy is a quarter of its bytes. Inside
    PopQA searches the dense stage took 0.28 against FAISS's 0.45 ms (the 7,594-passage flat index). The screen's
    top k are scored again in float32, so they are FAISS's up to float32 rounding: 3 of 500 PopQA questions
    differed, each by the order of two duplicate passages with equal scores.

    Why ONNX Runtime: 500 PopQA questions took 0.017 against 0.049 ms each on the 7,594-passage flat index, the
    same scores up to float32 rounding (3e-7), so passages within that of each other may swap. One query stays with
    FAISS (0.45 against 0.78 ms inside a search).

    Why FAISS's BLAS kernel otherwise: FAISS picks between its own kernel and BLAS by a process-wide threshold
    (``distance_compute_blas_threshold``, 128,000 in faiss-cpu 1.15). On the 7,594-passage flat index, 256 queries
    took 146 ms through the default choice and 25 ms with the threshold at 20 (BLAS), the same ids, scores within
    3e-7; one query stays faster on the default (0.8 against 2.1 ms). The threshold is set only for the call, under
    a lock, and restored.
    """
    if screen is not None and len(queries) <= SCREEN_QUERIES:
        return _padded(*screen(queries, k)[:2], k)
    if not blas_from or len(queries) < blas_from:
        return index.search(queries, k)
    if scan is not None:
        return _padded(*scan(queries, k)[:2], k)
    with _blas_threshold(20):
        return index.search(queries, k)


def _padded(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A scan's b × min(k, rows) result padded to b × k as FAISS pads a short result."""
    short = k - scores.shape[1]
    if short > 0:
        scores = np.pad(scores, ((0, 0), (0, short)), constant_values=-np.finfo(np.float32).max)
        ids = np.pad(ids, ((0, 0), (0, short)), constant_values=-1)
    return scores, ids


def batch_scan(index: faiss.Index, threads: int = 0) -> TopScan | None:
    """An ONNX Runtime scan over a CPU flat inner-product index's own vectors (a view, no copy), for
    :func:`search`; None for other kinds of index (IVF, HNSW, GPU copies: FAISS searches them) or without ONNX
    Runtime."""
    vectors = _flat_vectors(index)
    return None if vectors is None or not onnx_available() else TopScan(vectors, threads, owner=index)


def small_scan(index: faiss.Index, threads: int = 0) -> Int8Screen | None:
    """An int8 screen of a CPU flat inner-product index's vectors for :func:`search`'s few-query calls; None where
    :func:`batch_scan` gives none, below ``SCREEN_FROM_BYTES`` or past the screen's size, or for vectors that are
    not finite."""
    vectors = _flat_vectors(index)
    if vectors is None or vectors.nbytes < SCREEN_FROM_BYTES or not onnx_available() or not Int8Screen.fits(vectors):
        return None
    try:
        return Int8Screen(vectors, threads, owner=index)
    except ValueError as exc:  # NaN or infinity among the vectors: FAISS searches them, as before
        log.warning("the dense index stays on FAISS for a few queries: %s", exc)
        return None


def _flat_vectors(index: faiss.Index) -> np.ndarray | None:
    """A CPU ``IndexFlatIP``'s stored vectors as an array (a view into the index, no copy), else None."""
    if type(index) is not faiss.IndexFlatIP or not index.ntotal:
        return None
    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)


@contextmanager
def _blas_threshold(value: int) -> Iterator[None]:
    with _BLAS_LOCK:
        before = faiss.cvar.distance_compute_blas_threshold
        faiss.cvar.distance_compute_blas_threshold = value
        try:
            yield
        finally:
            faiss.cvar.distance_compute_blas_threshold = before


def build_dense_index(embs: np.ndarray, cfg: DenseIndexConfig) -> faiss.Index:
    """A CPU index over ``embs`` (unit rows, so inner product = cosine). GPU copies are made at load time."""
    n, d = embs.shape
    x = np.ascontiguousarray(embs, dtype=np.float32)
    kind = cfg.kind
    if kind == "ivf":
        nlist = cfg.ivf_nlist or max(1, int(4 * math.sqrt(n)))
        if n < nlist * _MIN_POINTS_PER_CELL:
            nlist = max(1, n // _MIN_POINTS_PER_CELL)
        if nlist < 2:
            log.warning("only %d passages: too few to train an IVF index, using a flat one", n)
            kind = "flat"
        else:
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(x)
            index.add(x)
            index.nprobe = min(cfg.ivf_nprobe, nlist)
            return index
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = cfg.hnsw_ef_search
        index.add(x)
        return index
    index = faiss.IndexFlatIP(d)
    index.add(x)
    return index


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def maybe_to_gpu(index: faiss.Index, cfg: DenseIndexConfig) -> faiss.Index:
    """Copy ``index`` to GPU 0 when asked (``always``) or possible (``auto``)."""
    if cfg.use_gpu == "never":
        return index
    if not gpu_available():
        if cfg.use_gpu == "always":
            raise RuntimeError("use_gpu=always but FAISS has no GPU support or sees no GPU (install the gpu extra)")
        return index
    res = faiss.StandardGpuResources()
    gpu_index = faiss.index_cpu_to_gpu(res, 0, index)
    gpu_index.referenced_resources = res  # keep the resources alive as long as the index
    return gpu_index


def describe(index: faiss.Index) -> str:
    return type(faiss.downcast_index(index)).__name__


def read_mapped(path: Path) -> faiss.Index | None:
    """The FAISS index at ``path`` with its vectors mapped from the file: a flat index's codes
    (``IO_FLAG_MMAP_IFC``), an IVF index's inverted lists (``IO_FLAG_MMAP``); None for a kind faiss reads only into
    memory (HNSW), which the caller then reads."""
    with open(path, "rb") as f:
        fourcc = f.read(4)
    if fourcc in (b"IxFI", b"IxF2", b"IxFl"):  # IndexFlatIP, IndexFlatL2, IndexFlat
        flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    elif fourcc.startswith(b"Iw"):  # the IndexIVF family
        flag = getattr(faiss, "IO_FLAG_MMAP", None)
    else:
        return None
    if flag is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return faiss.read_index(str(path), flag | faiss.IO_FLAG_READ_ONLY)
