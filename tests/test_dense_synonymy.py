"""The FAISS passage index kinds, and the synonymy invariant behind incremental updates."""

from __future__ import annotations

import numpy as np
import pytest

from graph_index.dense import build_dense_index, gpu_available, maybe_to_gpu
from graph_index.synonymy import select_synonyms, synonym_edges
from graph_index.config import DenseIndexConfig, GraphConfig
from graph_index.embedders import normalize_rows


def unit(rng: np.random.Generator, n: int, d: int = 32) -> np.ndarray:
    return normalize_rows(rng.standard_normal((n, d)).astype(np.float32))


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_each_index_kind_finds_the_query_itself(kind: str) -> None:
    x = unit(np.random.default_rng(0), 3000)
    index = build_dense_index(x, DenseIndexConfig(kind=kind, ivf_nprobe=64))
    _, ids = index.search(x[:50], 1)
    assert (ids[:, 0] == np.arange(50)).mean() >= 0.95


def test_a_flat_index_batch_scanned_in_onnxruntime_equals_faiss() -> None:
    """A batch searched through ONNX Runtime over the flat index's own vectors gives FAISS's ids and scores (up to
    float32 rounding), padded as FAISS pads when k exceeds the index; other kinds, and single queries, stay with
    FAISS."""
    from graph_index.dense import batch_scan, search

    rng = np.random.default_rng(2)
    x = unit(rng, 3000)
    queries = unit(rng, 40)
    index = build_dense_index(x, DenseIndexConfig(kind="flat"))
    scan = batch_scan(index, 2)
    assert scan is not None and np.shares_memory(scan.table, faiss_vectors(index))  # a view, not a copy
    want_s, want_i = index.search(queries, 10)
    got_s, got_i = search(index, queries, 10, blas_from=16, scan=scan)
    assert np.array_equal(got_i, want_i) and np.allclose(got_s, want_s, atol=1e-6)
    small = build_dense_index(x[:7], DenseIndexConfig(kind="flat"))
    want_s, want_i = small.search(queries, 10)
    got_s, got_i = search(small, queries, 10, blas_from=16, scan=batch_scan(small, 2))
    assert np.array_equal(got_i, want_i) and np.allclose(got_s, want_s, atol=1e-6)  # 3 ids of -1, as FAISS gives
    assert batch_scan(build_dense_index(x, DenseIndexConfig(kind="hnsw")), 2) is None
    assert [a.shape for a in scan(queries[:0], 10)] == [(0, 10), (0, 10), (0,), (0,)]
    from graph_index.ort_session import TopScan

    assert scan.rows == TopScan.ROWS  # a small table: the most queries per run
    assert TopScan(np.zeros((1_000_000, 4), np.float32), 1).rows == 16  # a large one: 64 MB score blocks


def test_a_few_queries_through_the_int8_screen_find_what_faiss_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph_index.dense.search with the flat index's int8 screen (small_scan): up to SCREEN_QUERIES queries get
    FAISS's ids and scores (up to float32 rounding), padded as FAISS pads past the index's size; more queries, small
    indexes and other kinds of index are left to FAISS."""
    import faiss

    from graph_index import dense
    from graph_index.dense import SCREEN_QUERIES, search, small_scan

    rng = np.random.default_rng(4)
    index = faiss.IndexFlatIP(32)
    index.add(unit(rng, 3000, 32))
    assert small_scan(index) is None  # 384 KB: FAISS is faster than the screen's fixed cost
    monkeypatch.setattr(dense, "SCREEN_FROM_BYTES", 0)
    q = unit(rng, SCREEN_QUERIES, 32)
    screen = small_scan(index)
    assert screen is not None and screen.owner is index
    want_d, want_i = index.search(q, 10)
    got_d, got_i = search(index, q, 10, blas_from=16, screen=screen)
    assert (got_i == want_i).all() and np.allclose(got_d, want_d, atol=1e-6)
    tiny = faiss.IndexFlatIP(32)
    tiny.add(q[:4])
    pad_d, pad_i = search(tiny, q[:2], 6, screen=small_scan(tiny))
    faiss_d, faiss_i = tiny.search(q[:2], 6)
    assert (pad_i == faiss_i).all() and (pad_i[:, 4:] == -1).all() and np.allclose(pad_d[:, :4], faiss_d[:, :4])
    assert small_scan(faiss.IndexHNSWFlat(32, 8, faiss.METRIC_INNER_PRODUCT)) is None


def faiss_vectors(index) -> np.ndarray:  # noqa: ANN001 - a faiss.IndexFlat
    """The index's own vector storage (a view)."""
    import faiss

    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)


def test_ivf_on_a_tiny_corpus_falls_back_to_flat() -> None:
    x = unit(np.random.default_rng(1), 20)
    index = build_dense_index(x, DenseIndexConfig(kind="ivf"))
    assert index.ntotal == 20 and type(index).__name__ == "IndexFlatIP"


def test_gpu_is_optional() -> None:
    index = build_dense_index(unit(np.random.default_rng(2), 10), DenseIndexConfig())
    if gpu_available():
        pytest.skip("a GPU is present; the CPU-only path is what this checks")
    assert maybe_to_gpu(index, DenseIndexConfig(use_gpu="auto")) is index
    with pytest.raises(RuntimeError, match="gpu extra"):
        maybe_to_gpu(index, DenseIndexConfig(use_gpu="always"))


def clustered(rng: np.random.Generator, n: int) -> np.ndarray:
    """Vectors in tight clusters, so many pairs pass the threshold and the neighbour cap bites."""
    centres = unit(rng, max(n // 6, 1))
    pts = centres[rng.integers(0, len(centres), n)] + 0.12 * rng.standard_normal((n, centres.shape[1]))
    return normalize_rows(pts.astype(np.float32))


@pytest.mark.parametrize("seed", range(5))
def test_incremental_synonyms_equal_a_full_recomputation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cfg = GraphConfig(synonymy_threshold=0.8, synonymy_max_neighbors=3, synonymy_min_alnum=3)
    vecs = clustered(rng, 240)
    names = [f"entity {i:03d}" for i in range(240)] + ["ab"]  # "ab": too short for synonymy
    vecs = np.vstack([vecs, vecs[:1]])
    old = sorted(rng.choice(241, 180, replace=False).tolist())
    new = sorted(set(rng.choice(241, 200, replace=False).tolist()))
    old_keys, new_keys = [names[i] for i in old], [names[i] for i in new]
    prev, _ = select_synonyms(old_keys, vecs[old], cfg)
    full, _ = select_synonyms(new_keys, vecs[new], cfg)
    inc, stats = select_synonyms(new_keys, vecs[new], cfg, previous=prev, previous_keys=set(old_keys))
    assert inc == full
    assert stats.recomputed < len(new_keys)
    assert any(len(v) == 3 for v in full.values())  # the cap was exercised
    assert "ab" not in full


def test_synonym_edge_weight_counts_the_ends_that_keep_it() -> None:
    edges = synonym_edges({"a": [("b", 0.9)], "b": [("a", 0.9)], "c": [("a", 0.85)]})
    assert edges == {("a", "b"): pytest.approx(1.8), ("a", "c"): pytest.approx(0.85)}
