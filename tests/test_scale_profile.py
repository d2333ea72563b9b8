"""The scale profile (docs/scaling.md): ``auto`` keeps the exact searches below ``ann.from_passages`` and writes
nothing; a build with ``ann.write = always`` writes and records the approximate indexes; the scale profile's top k on
a small built index equals the exact one's, and its PageRank is within push's stated bound of the exact solve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graph_index.builder import Components, build_index
from graph_index.layout import FACT_ANN, PASSAGE_ANN
from graph_index.store import IndexData
from routerag.config import RetrievalConfig, Settings
from routerag.retrieval import Retriever
from routerag.retrieval.facts import FactScorer, FaissFactScorer
from routerag.retrieval.retriever import resolve_profile

FIX = Path(__file__).parent / "fixtures"
QUESTIONS = ["What country is the Veld Institute in?", "Who founded the glass works?", "river near the observatory",
             "Which city hosts the annual festival?"]


@pytest.fixture(scope="module")
def ann_index(tmp_path_factory, minilm, spacy_extractor) -> Path:
    out = tmp_path_factory.mktemp("scale") / "idx"
    cfg = Settings(cache_dir=out.parent / "cache", ann={"write": "always"})
    build_index([FIX / "twohop.jsonl"], out, cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return out


@pytest.fixture(scope="module")
def ivf_index(tmp_path_factory, minilm, spacy_extractor) -> Path:
    """The same corpus with both approximate indexes as inverted files (``ann.ivf_from_rows`` = 1)."""
    out = tmp_path_factory.mktemp("scale-ivf") / "idx"
    cfg = Settings(cache_dir=out.parent / "cache", ann={"write": "always", "ivf_from_rows": 1})
    build_index([FIX / "twohop.jsonl"], out, cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return out


def test_auto_resolves_by_index_size_and_each_part_overrides() -> None:
    cfg = RetrievalConfig()
    assert resolve_profile(cfg, 199_999, 200_000).name == "exact"
    big = resolve_profile(cfg, 200_000, 200_000)
    assert (big.name, big.passage_index, big.fact_index, big.ppr_backend) == ("scale", "ann", "ann", "push")
    mixed = resolve_profile(RetrievalConfig(profile="scale", fact_index="exact", ppr_backend="batched"), 10, 200_000)
    assert (mixed.passage_index, mixed.fact_index, mixed.ppr_backend) == ("ann", "exact", "batched")
    small = resolve_profile(RetrievalConfig(), 7_594, 200_000)
    assert (small.passage_index, small.fact_index, small.ppr_backend) == ("index", "exact", "batched")


def test_the_default_on_a_small_index_is_exact_and_writes_nothing(index: Path, minilm) -> None:
    default = Retriever(index, RetrievalConfig(), embedder=minilm)
    exact = Retriever(index, RetrievalConfig(profile="exact", passage_index="index", fact_index="exact",
                                             ppr_backend="batched"), embedder=minilm)
    for mode in ("passage", "graph", "hybrid"):
        a, b = default.search(QUESTIONS, mode=mode, k=5), exact.search(QUESTIONS, mode=mode, k=5)
        assert [[(d.id, d.score) for d in r.docs] for r in a] == [[(d.id, d.score) for d in r.docs] for r in b]
    assert default.profile.name == "exact" and isinstance(default.fact_scorer, FactScorer)
    assert default.push is None and default._passage_ann is None
    version = IndexData(index).path
    assert not (version / PASSAGE_ANN).exists() and not (version / FACT_ANN).exists()


def test_a_build_writes_and_records_the_approximate_indexes(ann_index: Path) -> None:
    data = IndexData(ann_index)
    for name in (PASSAGE_ANN, FACT_ANN):
        assert (data.path / name).is_file() and name in data.manifest["files"]
    assert data.verify() == len(data.manifest["files"])  # their checksums hold
    assert data.ann("facts").ntotal == data.counts["facts"] and data.ann("passages").ntotal == data.counts["passages"]
    assert data.manifest["timings_s"]["ann_index"] >= 0


def test_scale_profile_top_k_matches_exact_within_the_bound(ann_index: Path, minilm) -> None:
    exact = Retriever(ann_index, RetrievalConfig(profile="exact"), embedder=minilm)
    scale = Retriever(ann_index, RetrievalConfig(profile="scale"), embedder=minilm)
    k = 5
    passage = [exact.search(QUESTIONS, mode="passage", k=k), scale.search(QUESTIONS, mode="passage", k=k)]
    assert [[d.id for d in r.docs] for r in passage[0]] == [[d.id for d in r.docs] for r in passage[1]]
    ids = [p.id for p in exact.passages]
    graph = scale.search(QUESTIONS, mode="graph", k=k)
    assert scale.profile.name == "scale" and isinstance(scale.fact_scorer, FaissFactScorer)
    for q, res in zip(QUESTIONS, graph):  # the same seeds: push's scores low by at most eps · D / total, never high
        seeds, _, _ = exact.query_seeds(q)
        ref = exact.ppr(seeds.weights)
        out = scale.push.solve(np.fromiter(seeds.weights, np.int64), np.fromiter(seeds.weights.values(), float))
        got = np.zeros_like(ref)
        got[out.vertices] = out.scores
        rounding = 2 * exact.cfg.ppr_tol * ref.max()  # the exact side is the Chebyshev solve, to its tolerance
        bound = scale.cfg.push_eps * scale.push.degree(np.arange(len(ref))) / out.total
        assert out.complete and (ref - got >= -rounding).all() and (ref - got <= bound + rounding).all()
        np.testing.assert_allclose(scale.ppr(seeds.weights), got)
        # the top k may differ from the exact one only among passages whose exact scores are that close
        passages = ref[: exact.n_passages]
        kth = np.sort(passages)[::-1][k - 1]
        for doc in res.docs:
            assert passages[ids.index(doc.id)] >= kth - bound.max() - 2 * rounding
        assert [d.id for d in res.docs][:3] == [ids[i] for i in np.lexsort((np.arange(len(passages)), -passages))[:3]]


def test_a_read_only_index_builds_its_approximate_indexes_in_memory(index: Path, minilm, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from graph_index import store

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003
        raise PermissionError("read-only file system")

    monkeypatch.setattr(store, "write_ann", refuse)
    r = Retriever(index, RetrievalConfig(profile="scale"), embedder=minilm)
    assert r.search(QUESTIONS[:1], mode="hybrid", k=3)[0].docs
    assert not (IndexData(index).path / PASSAGE_ANN).exists()


def test_large_tables_get_a_mapped_inverted_file_that_searches_like_exact(ivf_index: Path, minilm) -> None:
    import faiss

    data = IndexData(ivf_index)
    assert data.verify() == len(data.manifest["files"])
    for which in ("passages", "facts"):
        index = faiss.downcast_index(data.ann(which))
        assert isinstance(index, faiss.IndexIVFScalarQuantizer) and index.ntotal == data.counts[which]
    mapped = Path("/proc/self/maps").read_text()
    assert str(data.path / PASSAGE_ANN) in mapped and str(data.path / FACT_ANN) in mapped  # cells not copied
    # every cell scanned: the candidates are rescored exactly, so the scale profile finds the exact top k
    scale = Retriever(ivf_index, RetrievalConfig(profile="scale", ann_nprobe=4096), embedder=minilm)
    exact = Retriever(ivf_index, RetrievalConfig(profile="exact"), embedder=minilm)
    for mode in ("passage", "graph", "hybrid"):
        a, b = scale.search(QUESTIONS, mode=mode, k=3), exact.search(QUESTIONS, mode=mode, k=3)
        assert [[d.id for d in r.docs] for r in a] == [[d.id for d in r.docs] for r in b], mode
    q = exact.embed(QUESTIONS)
    got, want = scale.fact_scorer.match(q, 3), exact.fact_scorer.match(q, 3)
    np.testing.assert_array_equal(got.top, want.top)
    np.testing.assert_allclose(got.lo, want.lo, rtol=1e-5)
