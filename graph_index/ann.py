"""Approximate indexes for the scale profile: the passage and fact vectors in a FAISS HNSW graph with 8-bit scalar
codes (``HNSW32,SQ8``), or from ``ann.ivf_from_rows`` rows in an inverted file with the same codes (``IVF`` cells
found through an HNSW graph of their centroids), written beside the exact files (``passages.ann.faiss``,
``facts.ann.faiss``).

Why HNSW: on the 7,594-passage PopQA index with its real questions, an IVF index with 8-bit codes (4·√N cells) found
0.82 / 0.97 / 0.99 of the exact top 5 passages scanning 32 / 128 / 256 of its 348 cells, and 0.72 / 0.88 / 0.94 of
the top 5 facts (1,034 cells): questions sit far from their passages (cosine ~0.5), so their neighbours spread over
many cells. HNSW found 0.94 / 0.99 / 0.995 (passages) and 0.93 / 0.97 / 0.99 (facts) at efSearch 32 / 128 / 256, in
about the same time per query. The cost: HNSW is read into memory (FAISS does not map it), about 640 bytes per row
(384 of codes, 256 of links); the 8-bit codes are a quarter of the float32 rows. The candidates a search returns are
rescored exactly from the (mapped) float32 rows by :func:`search`, so every score used downstream is a true inner
product.

Why IVF for the largest tables: HNSW's insert is the slow part of a build (100k rows took 262 s on 2 busy cores,
≈6 h at that rate for the 8.8M facts of a million passages), and FAISS reads HNSW into anonymous memory (5.6 GB
there). An inverted file is trained on a sample and fills its cells at about 40 s per million rows on the same 2
cores, and FAISS maps its cells from the file, so it costs no anonymous memory. Its recall per unit of time is lower on
real questions (above), which is why it is kept for sizes HNSW cannot reach.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import faiss
import numpy as np

from .dense import read_mapped

log = logging.getLogger(__name__)

HNSW_M = 32
"""Links per vertex (64 on the bottom layer)."""
EF_CONSTRUCTION = 64
"""Candidates kept while inserting: FAISS's default is 40; more gives a better graph for a slower build."""
ADD_CHUNK = 65_536
"""Rows added per step: a mapped matrix is read a chunk at a time, and progress is logged."""
IVF_TRAIN_PER_CELL = 20
"""Training rows per IVF cell (k-means, 10 iterations): FAISS asks for 39 and warns below; 20 halves the k-means
work, and the cells only route the search (its candidates are rescored exactly)."""


def build(vectors: np.ndarray, *, name: str = "rows", ivf_from_rows: int = 0) -> faiss.Index:
    """The approximate inner-product index over ``vectors`` (float32 rows, possibly mapped): HNSW below
    ``ivf_from_rows`` rows (0: always HNSW), an inverted file from there. The 8-bit codes' ranges (and the IVF
    cells) are trained on a sample, then rows are inserted a chunk at a time (FAISS uses every core)."""
    n, dim = vectors.shape
    t = time.perf_counter()
    ivf = 0 < ivf_from_rows <= n
    index = _empty_ivf(dim, n) if ivf else faiss.index_factory(dim, f"HNSW{HNSW_M},SQ8", faiss.METRIC_INNER_PRODUCT)
    if not ivf:
        faiss.downcast_index(index).hnsw.efConstruction = EF_CONSTRUCTION
    want = faiss.extract_index_ivf(index).nlist * IVF_TRAIN_PER_CELL if ivf else 65_536
    sample = np.sort(np.random.default_rng(0).choice(n, min(n, max(want, 65_536)), replace=False))
    index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
    log.info("ann %s: trained on %d rows (%.0f s)", name, len(sample), time.perf_counter() - t)
    for lo in range(0, n, ADD_CHUNK):
        index.add(np.ascontiguousarray(vectors[lo:lo + ADD_CHUNK], dtype=np.float32))
        if n > 4 * ADD_CHUNK:
            log.info("ann %s: %d of %d rows added (%.0f s)", name, min(lo + ADD_CHUNK, n), n, time.perf_counter() - t)
    log.info("ann %s: %d rows (%s), %.1f s", name, n, "IVF" if ivf else "HNSW", time.perf_counter() - t)
    return index


def _empty_ivf(dim: int, n: int) -> faiss.Index:
    """An untrained ``IVF{nlist}_HNSW32,SQ8`` index: 4·√n cells rounded to a power of two (8,192 for 8.8M rows; at
    most n), the cells' centroids searched through their own HNSW graph so that inserting is not a scan of all
    centroids."""
    nlist = 1 << min(max(4, round(math.log2(4 * math.sqrt(n)))), int(math.log2(max(n, 1))))  # k-means needs n ≥ nlist
    index = faiss.index_factory(dim, f"IVF{nlist}_HNSW32,SQ8", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.niter = 10
    ivf.cp.max_points_per_centroid = IVF_TRAIN_PER_CELL
    ivf.cp.min_points_per_centroid = 1  # the sample is deliberately small: no warning for it
    return index


def write(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` (the caller publishes the directory atomically, or writes to a temporary name)."""
    faiss.write_index(index, str(path))


def read(path: Path) -> faiss.Index:
    """The index at ``path``: an inverted file's cells mapped from the file, HNSW read into memory (FAISS cannot
    map it).

    A mapped file is also read ahead into the page cache (``POSIX_FADV_WILLNEED``, in the background; file pages,
    not anonymous memory): a query's cells lie scattered over the file, and read cold from disk they cost the
    first queries at 1M passages 212 ms of fact matching against 18-22 ms cached (measured, docs/scale-profile.md)."""
    index = read_mapped(path)
    if index is None:
        return faiss.read_index(str(path))
    if hasattr(os, "posix_fadvise"):
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
    return index


def params(index: faiss.Index, ef_search: int, nprobe: int) -> faiss.SearchParameters:
    """Search parameters, the recall / latency knob of each kind: HNSW keeps ``ef_search`` candidates while walking
    its graph; an inverted file scans its ``nprobe`` cells nearest the query."""
    if isinstance(faiss.downcast_index(index), faiss.IndexIVF):
        # the cells are found through an HNSW graph of their centroids, whose default efSearch (16) misses some of
        # the nearest cells once nprobe is larger: on PopQA questions 0.87 of the exact top 5 facts with every
        # cell "scanned" (nprobe = nlist), 1.0 with efSearch 1024
        cells = faiss.SearchParametersHNSW(efSearch=max(64, 2 * nprobe))
        return faiss.SearchParametersIVF(nprobe=max(1, nprobe), quantizer_params=cells)
    return faiss.SearchParametersHNSW(efSearch=max(1, ef_search))


def search(index: faiss.Index, rows: np.ndarray, q: np.ndarray, k: int, *, ef_search: int, nprobe: int = 256,
           width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), b × k best first (ties by id, padded with id -1), of unit queries ``q``: ``width`` candidates
    (default ``max(4k, 32)``) from the approximate index, rescored exactly against ``rows`` (float32, the index's
    rows in order)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    width = min(max(width or 4 * k, 32, k), index.ntotal)
    _, cand = index.search(q, width, params=params(index, max(ef_search, width), nprobe))
    scores = np.full((q.shape[0], k), -np.finfo(np.float32).max, dtype=np.float32)
    ids = np.full((q.shape[0], k), -1, dtype=np.int64)
    for r in range(q.shape[0]):
        c = np.sort(cand[r][cand[r] >= 0])
        exact = np.asarray(rows[c], dtype=np.float32) @ q[r]
        order = np.lexsort((c, -exact))[:k]
        scores[r, :len(order)], ids[r, :len(order)] = exact[order], c[order]
    return scores, ids
