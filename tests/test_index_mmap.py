"""Loading an index maps its embedding matrices instead of copying them: the ``.npy`` arrays, the flat FAISS index
and the float16 fact copy exact fact matching screens with. An index written before the float16 file existed gets
it on first load (atomically, checked by ``--verify`` only when recorded), or keeps the copy in memory when it
cannot write."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graph_index.atomic import TMP_MARK
from graph_index.lock import index_lock
from graph_index.store import IndexData
from routerag.config import RetrievalConfig
from routerag.retrieval import Retriever

from .helpers.curie_index import build_curie_index, writable_copy

ROOT = Path(__file__).resolve().parents[1]


def mapped(a: np.ndarray) -> bool:
    """The array's memory is a file mapping (np.memmap or a view of one), not data it owns."""
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


@pytest.fixture(scope="module")
def base(tmp_path_factory, minilm) -> Path:
    return build_curie_index(tmp_path_factory.mktemp("mmap"), minilm)


@pytest.fixture
def idx(base: Path, tmp_path: Path) -> Path:
    return writable_copy(base, tmp_path)


def half_mapped(scorer) -> bool:  # noqa: ANN001
    """The float16 tensor exact matching screens with is the mapped file's memory itself."""
    return mapped(scorer.half_rows) and scorer.half.data_ptr() == scorer.half_rows.ctypes.data


def make_old(idx: Path) -> Path:
    """Make the index look written before the float16 file: no file, no record of it."""
    data = IndexData(idx)
    (data.path / "fact_embeddings.f16.npy").unlink()
    mf = data.path / "manifest.json"
    m = json.loads(mf.read_text())
    del m["files"]["fact_embeddings.f16.npy"]
    mf.write_text(json.dumps(m))
    return data.path


def test_a_loaded_retriever_maps_every_matrix(idx: Path, minilm) -> None:
    r = Retriever(idx, RetrievalConfig(), embedder=minilm)
    r.search(["Where was Marie Curie born?"], mode="hybrid", k=2)
    assert mapped(r.passage_emb) and mapped(r.fact_scorer.emb) and half_mapped(r.fact_scorer)
    assert r.data.dense_mapped
    assert np.array_equal(np.asarray(r.fact_scorer.half_rows), np.asarray(r.data.fact_emb, dtype=np.float16))


def test_an_old_index_gets_the_float16_file_on_first_load(idx: Path, minilm) -> None:
    version = make_old(idx)
    r = Retriever(idx, RetrievalConfig(), embedder=minilm)
    res = r.search(["Where was Marie Curie born?"], mode="graph", k=2)
    assert res[0].docs and half_mapped(r.fact_scorer)
    f16 = np.load(version / "fact_embeddings.f16.npy")
    assert np.array_equal(f16, np.asarray(np.load(version / "fact_embeddings.npy"), dtype=np.float16))
    assert not [p for p in version.iterdir() if TMP_MARK in p.name]
    assert IndexData(idx).verify() == 20  # unrecorded: not required, not checked


def test_an_old_index_whose_lock_is_held_keeps_the_copy_in_memory(idx: Path, minilm) -> None:
    version = make_old(idx)
    with index_lock(idx, timeout=0):
        r = Retriever(idx, RetrievalConfig(), embedder=minilm)
        r.search(["Where was Marie Curie born?"], mode="graph", k=2)
    assert not half_mapped(r.fact_scorer)
    assert not (version / "fact_embeddings.f16.npy").exists()


def test_verify_checks_the_recorded_float16_file(idx: Path) -> None:
    data = IndexData(idx)
    assert data.verify() == 21
    path = data.path / "fact_embeddings.f16.npy"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="fact_embeddings.f16.npy: sha256"):
        IndexData(idx).verify()


PROBE = r"""
import sys
from graph_index.store import IndexData

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

data = IndexData(sys.argv[1])
data.passage_emb, data.fact_emb, data.dense  # import and warm the code paths on the small arrays first
big = IndexData(sys.argv[2])
before = anon_kb()
arrays = [big.passage_emb, big.entity_emb, big.fact_emb, big.fact_emb_f16]
total = sum(a.nbytes for a in arrays)
index = big.dense
for a in arrays:  # touch every page, as searches do
    float(a.sum(dtype="float64"))
q = arrays[0][:4].copy()
index.search(q, 3)
print(before, anon_kb(), total)
"""


def test_loading_and_reading_the_matrices_does_not_grow_anonymous_memory(idx: Path, tmp_path: Path) -> None:
    """A subprocess opens an index whose matrices are 128 MB, reads every byte of them and searches the FAISS index:
    its anonymous memory (what copies would occupy; mapped file pages are RssFile) grows by far less."""
    import faiss

    from graph_index.store import write_f16

    big = tmp_path / "big"
    shutil.copytree(IndexData(idx).path, big)
    rng = np.random.default_rng(0)
    m = json.loads((big / "manifest.json").read_text())
    n = 20_000
    x = rng.standard_normal((n, 384), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for name in ("passage_embeddings.npy", "entity_embeddings.npy", "fact_embeddings.npy"):
        np.save(big / name, x)
    write_f16(big / "fact_embeddings.npy", big / "fact_embeddings.f16.npy")
    dense = faiss.IndexFlatIP(384)
    dense.add(x)
    faiss.write_index(dense, str(big / "passages.faiss"))
    m.pop("files")
    m["counts"].update(passages=n, entities=n, facts=n)
    (big / "manifest.json").write_text(json.dumps(m))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(idx), str(big)], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    before, after, total = (int(v) for v in out)
    grown = (after - before) * 1024
    assert total > 100e6
    assert grown < total / 10, f"anonymous memory grew by {grown / 2**20:.0f} MB for {total / 2**20:.0f} MB of matrices"


def test_an_ivf_index_is_read_with_its_lists_mapped(tmp_path: Path) -> None:
    import faiss

    from graph_index.dense import read_mapped

    x = np.random.default_rng(0).standard_normal((2000, 16), dtype=np.float32)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(16), 16, 8, faiss.METRIC_INNER_PRODUCT)
    ivf.train(x)
    ivf.add(x)
    faiss.write_index(ivf, str(tmp_path / "ivf.faiss"))
    got = read_mapped(tmp_path / "ivf.faiss")
    assert got is not None and got.ntotal == 2000
    assert np.array_equal(got.search(x[:3], 4)[1], ivf.search(x[:3], 4)[1])
    hnsw = faiss.IndexHNSWFlat(16, 8)
    hnsw.add(x)
    faiss.write_index(hnsw, str(tmp_path / "hnsw.faiss"))
    assert read_mapped(tmp_path / "hnsw.faiss") is None
