"""The dense passage index: FAISS, exact inner product by default, IVF or HNSW for large corpora, moved to a GPU
when faiss-gpu and a CUDA device are present."""

from __future__ import annotations

import logging
import math

import faiss
import numpy as np

from .config import DenseIndexConfig

log = logging.getLogger(__name__)

_MIN_POINTS_PER_CELL = 39  # FAISS warns below this many training points per IVF centroid


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
