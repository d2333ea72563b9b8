"""The compact serving graph (graph_index.csr): the build writes it, a search uses it instead of an igraph object,
and it gives the very numbers the igraph path gives. An index written before it existed is converted on first load
(atomically, into its version), or in memory when it cannot write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from graph_index import csr
from graph_index.atomic import TMP_MARK
from graph_index.graph import ENTITY_PREFIX
from graph_index.layout import CSR_FILES, IndexFormatError
from graph_index.lock import index_lock
from graph_index.store import IndexData
from routerag.config import RetrievalConfig
from routerag.retrieval import Retriever
from routerag.retrieval.ppr import PPRSolver

from .helpers.curie_index import build_curie_index, writable_copy

QUESTIONS = ["Where was Marie Curie born?", "Who discovered polonium?", "Which university did Pierre Curie attend?",
             "radioactivity research in Paris", "Nobel Prize in Chemistry"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, minilm) -> Path:
    return build_curie_index(tmp_path_factory.mktemp("csr"), minilm)


@pytest.fixture
def idx(base: Path, tmp_path: Path) -> Path:
    return writable_copy(base, tmp_path)


def make_old(idx: Path) -> Path:
    """Make the index look written before the compact graph: no files, no records of them."""
    data = IndexData(idx)
    for name in CSR_FILES:
        (data.path / name).unlink()
    mf = data.path / "manifest.json"
    m = json.loads(mf.read_text())
    for name in CSR_FILES:
        del m["files"][name]
    mf.write_text(json.dumps(m))
    return data.path


def fnv1a(name: str) -> int:
    """FNV-1a 64, one byte at a time: the reference the vectorised hash is held to."""
    h = 0xCBF29CE484222325
    for b in name.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def rankings(r: Retriever) -> dict[str, list[list[tuple[str, float]]]]:
    return {mode: [[(d.id, d.score) for d in res.docs] for res in r.search(QUESTIONS, mode=mode, k=8)]
            for mode in ("passage", "graph", "hybrid")}


def test_name_hashes_equal_the_bytewise_reference_and_lookup_survives_collisions(monkeypatch) -> None:
    names = ["", "e:paris", "e:new york city", "p:0", "e:zoë", "e:北京", "e:" + "x" * 300]
    blob, offsets = csr.encode_names(names)
    assert csr.name_hashes(blob, offsets).tolist() == [fnv1a(n) for n in names]
    table = csr.NameTable(blob, offsets, *_sorted(csr.name_hashes(blob, offsets)))
    assert table.lookup(names[1:] + ["e:nowhere"]).tolist() == [1, 2, 3, 4, 5, 6, -1]
    assert [table.name(v) for v in range(len(names))] == names
    # every name hashing alike: the bytes still decide
    monkeypatch.setattr(csr, "name_hashes", lambda blob, offsets: np.zeros(len(offsets) - 1, dtype=np.uint64))
    same = csr.NameTable(blob, offsets, np.zeros(len(names), dtype=np.uint64), np.arange(len(names)))
    assert same.lookup(["e:北京", "e:paris", "e:pari"]).tolist() == [5, 1, -1]


def _sorted(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(hashes, kind="stable")
    return hashes[order], order


def test_the_build_writes_and_records_the_compact_graph_equal_to_the_graphml_one(idx: Path) -> None:
    data = IndexData(idx)
    recorded = data.manifest["files"]
    assert all(name in recorded and (data.path / name).is_file() for name in CSR_FILES)
    g, compact = data.graph, data.compact_graph
    assert compact.vcount() == g.vcount() and compact.ecount() == g.ecount()
    # the same operator, bit for bit, as the one built from the igraph object
    a, b = PPRSolver.from_igraph(g, device="cpu"), PPRSolver(compact.adjacency(), device="cpu")
    for x, y in ((a.S, b.S), (a.M, b.M)):
        assert np.array_equal(x.indptr, y.indptr) and np.array_equal(x.indices, y.indices)
        assert np.array_equal(x.data, y.data)
    assert np.array_equal(a.perm, b.perm)
    # names, passage counts and fact ends as the GraphML graph and the JSONL files give them
    names = g.vs["name"]
    assert [compact.names.name(v) for v in range(g.vcount())] == names
    assert compact.names.lookup(names).tolist() == list(range(g.vcount()))
    vertex = {n[len(ENTITY_PREFIX):]: v for v, n in enumerate(names) if n.startswith(ENTITY_PREFIX)}
    assert data.fact_ends.tolist() == [[vertex.get(s, -1), vertex.get(o, -1)] for s, _, o in data.facts]
    n_pass = len(data.passages)
    assert data.vertex_passage_counts[:n_pass].sum() == 0
    assert data.vertex_passage_counts[n_pass:].tolist() == data.entity_passage_counts.tolist()
    edges = {(min(e.tuple), max(e.tuple)): (e["weight"], e["kinds"]) for e in g.es}
    assert {(u, v): (w, k) for u, v, w, k in compact.edges_within(range(g.vcount()))} == edges
    assert data.verify() == len(recorded)


def test_a_search_holds_no_igraph_object_and_ranks_as_the_igraph_path(idx: Path, minilm) -> None:
    r = Retriever(idx, RetrievalConfig(device="cpu"), embedder=minilm)
    ours = rankings(r)
    assert "graph" not in r.data.__dict__  # the GraphML graph was never read
    ref = Retriever(idx, RetrievalConfig(device="cpu"), embedder=minilm)
    ref._ensure_graph()
    ref.solver = PPRSolver.from_igraph(ref.data.graph, damping=ref.cfg.damping, tol=ref.cfg.ppr_tol, device="cpu")
    assert rankings(ref) == ours  # identical ids and scores
    prpack = Retriever(idx, RetrievalConfig(device="cpu", ppr_backend="igraph"), embedder=minilm)
    for q in QUESTIONS:
        assert r.query_entities(q) == prpack.query_entities(q)
        a, b = r.search([q], mode="graph", k=5)[0], prpack.search([q], mode="graph", k=5)[0]
        assert [d.id for d in a.docs] == [d.id for d in b.docs]


def test_an_old_index_is_converted_on_first_load_into_its_version(idx: Path, minilm) -> None:
    expected = rankings(Retriever(idx, RetrievalConfig(device="cpu"), embedder=minilm))
    before = {name: (IndexData(idx).path / name).read_bytes() for name in CSR_FILES}
    version = make_old(idx)
    r = Retriever(idx, RetrievalConfig(device="cpu"), embedder=minilm)
    assert rankings(r) == expected
    assert {name: (version / name).read_bytes() for name in CSR_FILES} == before  # what the build writes
    assert not [p for p in version.iterdir() if TMP_MARK in p.name]
    assert "graph" not in r.data.__dict__  # the igraph object served the conversion only
    assert IndexData(idx).verify() == 11  # unrecorded: not required, not checked


def test_an_old_index_whose_lock_is_held_or_directory_is_read_only_converts_in_memory(idx: Path, minilm) -> None:
    expected = rankings(Retriever(idx, RetrievalConfig(device="cpu"), embedder=minilm))
    version = make_old(idx)
    with index_lock(idx, timeout=0):
        r = Retriever(idx, RetrievalConfig(device="cpu"), embedder=minilm)
        assert rankings(r) == expected
    assert not any((version / name).exists() for name in CSR_FILES)
    if os.geteuid() == 0:
        return  # root writes through a read-only mode; the lock case above covers the in-memory path
    os.chmod(version, 0o555)
    try:
        assert rankings(Retriever(idx, RetrievalConfig(device="cpu"), embedder=minilm)) == expected
    finally:
        os.chmod(version, 0o755)


def test_a_half_converted_index_is_converted_again(idx: Path, minilm) -> None:
    """A conversion killed before its last file leaves no ``graph.indptr.npy``: the set counts as absent."""
    version = make_old(idx)
    IndexData(idx).compact_graph  # noqa: B018 - converts
    (version / "graph.indptr.npy").unlink()
    (version / "fact_ends.npy").write_bytes(b"partial")
    data = IndexData(idx)
    assert data.compact_graph.fact_ends.shape == (len(data.facts), 2)


def test_a_damaged_compact_file_is_a_located_error(idx: Path) -> None:
    data = IndexData(idx)
    path = data.path / "graph.weights.npy"
    raw = path.read_bytes()
    path.write_bytes(raw[:-8])
    with pytest.raises(IndexFormatError, match="graph.weights.npy"):
        IndexData(idx)  # recorded: its size is checked at open
    mf = data.path / "manifest.json"
    m = json.loads(mf.read_text())
    del m["files"]["graph.weights.npy"]
    mf.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="graph.weights.npy"):
        IndexData(idx).compact_graph  # noqa: B018 - unrecorded: its length is checked against indptr at load


def test_passage_and_fact_rows_read_on_demand_equal_the_parsed_lists(idx: Path) -> None:
    data = IndexData(idx)
    assert list(data.passage_rows) == data.passages and list(data.fact_rows) == data.facts
    assert data.passage_rows[-1] == data.passages[-1] and data.fact_rows[1:3] == data.facts[1:3]
    path = data.path / "facts.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = '["half a row"'
    path.write_text("\n".join(lines) + "\n\n")  # and a blank line at the end, which is no row
    mf = data.path / "manifest.json"
    m = json.loads(mf.read_text())
    del m["files"]["facts.jsonl"]  # unrecorded, so the open does not refuse the changed size
    mf.write_text(json.dumps(m))
    rows = IndexData(idx).fact_rows  # the row count still holds
    assert rows[1] == data.facts[1] and len(rows) == len(data.facts)
    with pytest.raises(IndexFormatError, match=r"facts.jsonl:3: corrupt row"):
        rows[2]  # noqa: B018 - reading it is the check


def test_entities_a_text_names_are_those_the_name_dictionary_gave(idx: Path) -> None:
    """The name table's batch lookup against the dictionary of every entity name the retriever used to hold (the
    same greedy longest-first, non-overlapping match)."""
    from graph_index.normalize import normalize_phrase

    data = IndexData(idx)
    names = data.graph.vs["name"]
    vertex = {n[len(ENTITY_PREFIX):]: v for v, n in enumerate(names) if n.startswith(ENTITY_PREFIX)}
    longest = min(max(len(e.split()) for e in vertex), 8)

    def reference(text: str) -> list[int]:
        words, found = normalize_phrase(text).split(), []
        taken = [False] * len(words)
        for n in range(min(longest, len(words)), 0, -1):
            for i in range(len(words) - n + 1):
                v = vertex.get(" ".join(words[i:i + n]))
                if v is not None and not any(taken[i:i + n]):
                    found.append(v)
                    taken[i:i + n] = [True] * n
        return found

    texts = [*QUESTIONS, " ".join(vertex), "nothing here at all", ""]
    assert any(reference(t) for t in texts)
    assert [data.entities_in(t) for t in texts] == [reference(t) for t in texts]
