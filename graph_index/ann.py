"""Approximate indexes for the scale profile: the passage and fact vectors in a FAISS HNSW graph with 8-bit scalar
codes (``HNSW32,SQ8``), written beside the exact files (``passages.ann.faiss``, ``facts.ann.faiss``).

Why HNSW: on the 7,594-passage PopQA index with its real questions, an IVF index with 8-bit codes (4·√N cells) found
0.82 / 0.97 / 0.99 of the exact top 5 passages scanning 32 / 128 / 256 of its 348 cells, and 0.72 / 0.88 / 0.94 of
the top 5 facts (1,034 cells): questions sit far from their passages (cosine ~0.5), so their neighbours spread over
many cells. HNSW found 0.94 / 0.99 / 0.995 (passages) and 0.93 / 0.97 / 0.99 (facts) at efSearch 32 / 128 / 256, in
about the same time per query. The cost: HNSW is read into memory (FAISS does not map it), about 640 bytes per row
(384 of codes, 256 of links); the 8-bit codes are a quarter of the float32 rows. The candidates a search returns are
rescored exactly from the (mapped) float32 rows by :func:`search`, so every score used downstream is a true inner
product.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import faiss
import numpy as np

log = logging.getLogger(__name__)

HNSW_M = 32
"""Links per vertex (64 on the bottom layer)."""
EF_CONSTRUCTION = 64
"""Candidates kept while inserting: FAISS's default is 40; more gives a better graph for a slower build."""
ADD_CHUNK = 65_536
"""Rows added per step: a mapped matrix is read a chunk at a time, and progress is logged."""


def build(vectors: np.ndarray, *, name: str = "rows") -> faiss.Index:
    """An ``HNSW32,SQ8`` inner-product index over ``vectors`` (float32 rows, possibly mapped): the 8-bit codes'
    ranges are trained on a sample, then rows are inserted a chunk at a time (FAISS uses every core)."""
    n, dim = vectors.shape
    t = time.perf_counter()
    index = faiss.index_factory(dim, f"HNSW{HNSW_M},SQ8", faiss.METRIC_INNER_PRODUCT)
    faiss.downcast_index(index).hnsw.efConstruction = EF_CONSTRUCTION
    sample = np.sort(np.random.default_rng(0).choice(n, min(n, 65_536), replace=False))
    index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
    for lo in range(0, n, ADD_CHUNK):
        index.add(np.ascontiguousarray(vectors[lo:lo + ADD_CHUNK], dtype=np.float32))
        if n > 4 * ADD_CHUNK:
            log.info("ann %s: %d of %d rows added (%.0f s)", name, min(lo + ADD_CHUNK, n), n, time.perf_counter() - t)
    log.info("ann %s: %d rows, %.1f s", name, n, time.perf_counter() - t)
    return index


def write(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` (the caller publishes the directory atomically, or writes to a temporary name)."""
    faiss.write_index(index, str(path))


def read(path: Path) -> faiss.Index:
    """The index at ``path`` (read into memory: FAISS maps only flat and IVF indexes)."""
    return faiss.read_index(str(path))


def params(ef_search: int) -> faiss.SearchParametersHNSW:
    """Search parameters: ``ef_search`` candidates kept while walking the graph (the recall / latency knob)."""
    return faiss.SearchParametersHNSW(efSearch=max(1, ef_search))


def search(index: faiss.Index, rows: np.ndarray, q: np.ndarray, k: int, *, ef_search: int,
           width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), b × k best first (ties by id, padded with id -1), of unit queries ``q``: ``width`` candidates
    (default ``max(4k, 32)``) from the approximate index, rescored exactly against ``rows`` (float32, the index's
    rows in order)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    width = min(max(width or 4 * k, 32, k), index.ntotal)
    _, cand = index.search(q, width, params=params(max(ef_search, width)))
    scores = np.full((q.shape[0], k), -np.finfo(np.float32).max, dtype=np.float32)
    ids = np.full((q.shape[0], k), -1, dtype=np.int64)
    for r in range(q.shape[0]):
        c = np.sort(cand[r][cand[r] >= 0])
        exact = np.asarray(rows[c], dtype=np.float32) @ q[r]
        order = np.lexsort((c, -exact))[:k]
        scores[r, :len(order)], ids[r, :len(order)] = exact[order], c[order]
    return scores, ids
