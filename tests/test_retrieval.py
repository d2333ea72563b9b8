"""The retriever: batched PPR equals igraph's prpack, RRF arithmetic, fallbacks, and a two-hop corpus where the
graph finds a bridge passage that shares no word with the question."""

from __future__ import annotations

from pathlib import Path

import igraph as ig
import numpy as np
import pytest

from graph_index.builder import build_index
from routerag.config import RetrievalConfig
from routerag.retrieval import Retriever
from routerag.retrieval.types import QueryError
from routerag.retrieval.fusion import reciprocal_rank_fusion
from routerag.retrieval.ppr import PPRSolver, chebyshev_steps, igraph_ppr

FIX = Path(__file__).parent / "fixtures"
QUESTION = "Which river flows through the city where Joran Veld was born?"


# -- PPR ----------------------------------------------------------------------------------------------------------

def random_graph(seed: int, n: int = 400, m: int = 1600) -> ig.Graph:
    rng = np.random.default_rng(seed)
    g = ig.Graph.Erdos_Renyi(n=n, m=m, directed=False)
    g.add_vertices(3)  # isolated vertices: dangling mass must go back through the reset, as in prpack
    g.es["weight"] = (rng.random(g.ecount()) * 3 + 0.1).tolist()
    return g


@pytest.mark.parametrize("seed", range(4))
def test_batched_ppr_matches_igraph_prpack(seed: int) -> None:
    g = random_graph(seed)
    rng = np.random.default_rng(seed + 100)
    reset = np.zeros((g.vcount(), 6))
    for j in range(6):
        reset[rng.integers(0, g.vcount(), 4), j] = rng.random(4) + 0.1
    reset[:, 5] += 0.002 * rng.random(g.vcount())  # a dense reset, as passage seeding makes
    reset[g.vcount() - 1, 4] = 0.7  # mass on an isolated vertex
    ours = PPRSolver.from_igraph(g, damping=0.5, device="cpu").solve(reset)
    for j in range(6):
        ref = igraph_ppr(g, reset[:, j], 0.5)
        assert np.abs(ours[:, j] - ref).max() < 1e-4
        assert list(np.argsort(-ours[:, j], kind="stable")[:10]) == list(np.argsort(-ref, kind="stable")[:10])
        assert ours[:, j].sum() == pytest.approx(1.0, abs=1e-5)


def test_the_local_phase_runs_on_a_large_sparse_graph_and_changes_nothing(monkeypatch) -> None:
    """The first steps multiply only the rows around the seeds while those rows hold few of the matrix's non-zeros
    (``ppr.LOCAL_NNZ``): on a 20,000-vertex ring with chords they do, and the scores equal igraph's and those of
    whole products from the first step."""
    from routerag.retrieval import ppr

    n = 20_000
    ring = [(i, (i + 1) % n) for i in range(n)] + [(i, (i + 7) % n) for i in range(0, n, 5)]
    g = ig.Graph(n=n, edges=ring)
    g.es["weight"] = (np.random.default_rng(5).random(g.ecount()) + 0.5).tolist()
    solver = PPRSolver.from_igraph(g, damping=0.5, device="cpu")
    reset = np.zeros(n)
    reset[[10, 5000, 12345]] = [1.0, 0.5, 0.25]

    class Counting:  # counts row slices of S (the local phase's products), forwards the rest
        def __init__(self, inner) -> None:  # noqa: ANN001
            self.inner, self.slices = inner, 0

        def __getitem__(self, key):  # noqa: ANN001, ANN204
            self.slices += 1
            return self.inner[key]

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self.inner, name)

    counting = Counting(solver.S)
    monkeypatch.setattr(solver, "S", counting)
    local = solver.solve(reset)
    assert counting.slices >= 3  # several steps stayed around the seeds
    monkeypatch.setattr(ppr, "LOCAL_NNZ", 0.0)
    whole = solver.solve(reset)
    assert np.abs(local - whole).max() < 1e-7
    assert np.abs(local - igraph_ppr(g, reset, 0.5)).max() < 1e-5


def test_a_batch_s_chunks_on_single_threaded_workers_give_the_same_scores(monkeypatch) -> None:
    """A batch's column chunks are solved side by side on workers whose torch ops use one thread each; the scores
    are those of the chunks solved one after another, and neither the caller's thread count nor that of threads
    started later changes."""
    import os
    import signal
    import threading

    import torch

    from routerag.retrieval import ppr

    g = random_graph(12)
    rng = np.random.default_rng(12)
    reset = np.zeros((g.vcount(), 3 * ppr.CHUNK + 5), dtype=np.float32)
    for j in range(reset.shape[1]):
        reset[rng.integers(0, g.vcount(), 3), j] = rng.random(3) + 0.1
    solver = PPRSolver.from_igraph(g, device="cpu")
    before = torch.get_num_threads()
    pool = ppr._chunk_pool(2)
    assert set(pool.map(lambda _: torch.get_num_threads(), range(6))) == {1}
    assert torch.get_num_threads() == before
    seen: list[int] = []
    later = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    later.start()
    later.join()
    assert seen == [before]
    monkeypatch.setattr(ppr, "_torch_threads", lambda: 2)
    side_by_side = solver.solve(reset, rows=np.arange(100))
    monkeypatch.setattr(ppr, "_torch_threads", lambda: 1)
    one_after_another = solver.solve(reset, rows=np.arange(100))
    assert np.allclose(side_by_side, one_after_another, rtol=0, atol=1e-7)  # equal here; rounding elsewhere
    monkeypatch.setattr(ppr, "_torch_threads", lambda: 2)
    if hasattr(os, "fork"):  # a forked child has none of the pool's threads: it must make its own, not wait forever
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)
            os._exit(0 if np.allclose(solver.solve(reset, rows=np.arange(100)), side_by_side, atol=1e-7) else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_device_resident_solve_equals_the_host_path() -> None:
    """The CUDA path (seeds in, requested rows out, everything else on the device) is plain torch: run on the CPU
    tensors it must give the host path's scores, for one query, a batch and a restricted set of rows."""
    g = random_graph(13)
    rng = np.random.default_rng(13)
    reset = np.zeros((g.vcount(), 35), dtype=np.float32)  # two full column chunks and a part
    for j in range(reset.shape[1]):
        reset[rng.integers(0, g.vcount(), 3), j] = rng.random(3) + 0.1
    solver = PPRSolver.from_igraph(g, device="cpu")
    rows = np.arange(0, g.vcount(), 2)
    host, host_one = solver.solve(reset, rows=rows), solver.solve(reset[:, 4])
    solver.device = "cuda"  # the resident path; its operator stays where it was built
    assert np.allclose(solver.solve(reset, rows=rows), host, rtol=0, atol=1e-6)
    assert np.allclose(solver.solve(reset[:, 4]), host_one, rtol=0, atol=1e-6)
    assert solver.solve(reset[:, 4]).shape == (g.vcount(),)


def test_ppr_input_checks_and_step_count() -> None:
    s = PPRSolver.from_igraph(random_graph(9, 20, 40), device="cpu")
    with pytest.raises(ValueError, match="positive mass"):
        s.solve(np.zeros(s.n))
    with pytest.raises(ValueError, match="rows"):
        s.solve(np.ones(s.n + 1))
    assert chebyshev_steps(0.5, 1e-7) < 20 < np.log(1e-7) / np.log(0.5) + 1  # fewer than power iteration


# -- RRF ----------------------------------------------------------------------------------------------------------

def test_rrf_arithmetic_and_ties() -> None:
    fused = dict(reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]], k=60))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert fused["b"] == pytest.approx(1 / 62)
    assert fused["d"] == pytest.approx(1 / 63)
    order = [d for d, _ in reciprocal_rank_fusion([["x", "y"], ["y", "x"]], k=60)]
    assert order == ["x", "y"]  # equal scores: the better best rank, then the earlier list


# -- the retriever on a two-hop corpus -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def twohop_index(tmp_path_factory, minilm, spacy_extractor):
    from graph_index.builder import Components
    from routerag.config import Settings

    out = tmp_path_factory.mktemp("twohop") / "idx"
    cfg = Settings(cache_dir=out.parent / "cache")
    build_index([FIX / "twohop.jsonl"], out, cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return out


@pytest.fixture(scope="module")
def retriever(twohop_index, minilm) -> Retriever:
    return Retriever(twohop_index, RetrievalConfig(device="cpu"), embedder=minilm)


def test_a_forked_child_searches_as_its_parent(retriever: Retriever) -> None:
    """A child forked after its parent searched gets the same results instead of hanging on a thread pool that
    stayed in the parent (ONNX Runtime's, torch's and FAISS's OpenMP teams, the PageRank chunk workers)."""
    import faulthandler
    import os

    from routerag.retrieval.facts import SMALL_BATCH

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    questions = [QUESTION, "Who founded the company?", "Where is the river?"] * (SMALL_BATCH + 1)
    parent = [[d.id for d in r.docs] for r in retriever.search(questions, mode="hybrid", k=5)]
    pid = os.fork()
    if pid == 0:
        faulthandler.dump_traceback_later(60, exit=True)  # a hang ends the child with its stack, not the suite
        child = [[d.id for d in r.docs] for r in retriever.search(questions, mode="hybrid", k=5)]
        os._exit(0 if child == parent else 3)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_memory_counts_the_int8_screen_in_place_of_the_float16_copy(twohop_index, minilm) -> None:
    """/health's per-index memory: with the int8 fact screen the float16 copy is not read, so the screen counts
    instead of it."""
    screened = Retriever(twohop_index, RetrievalConfig(device="cpu"), embedder=minilm)
    floating = Retriever(twohop_index, RetrievalConfig(device="cpu", small_batch_scan="float"), embedder=minilm)
    for r in (screened, floating):
        r.warm_up()
    screen, half = screened.fact_scorer.screen, floating.fact_scorer.half
    assert screen is not None and floating.fact_scorer.screen is None
    assert screened.memory_bytes() - floating.memory_bytes() == screen.memory_bytes() - half.numpy().nbytes


def rank_of(result, title: str) -> int:
    titles = [d.title for d in result.docs]
    return titles.index(title) + 1 if title in titles else 99


def test_bridge_passage_shares_no_word_with_the_question() -> None:
    import json

    bridge = next(json.loads(l) for l in (FIX / "twohop.jsonl").read_text().splitlines() if '"Tarsk"' in l)
    words = lambda s: {w.strip(".,;?").lower() for w in s.split()}  # noqa: E731
    assert not words(bridge["text"] + " " + bridge["title"]) & words(QUESTION)


def test_graph_mode_finds_the_bridge_dense_mode_misses(retriever: Retriever) -> None:
    dense = retriever.search([QUESTION], mode="passage", k=10)[0]
    graph = retriever.search([QUESTION], mode="graph", k=10)[0]
    hybrid = retriever.search([QUESTION], mode="hybrid", k=10)[0]
    gold = ("Joran Veld", "Tarsk")
    recall = lambda res, k: sum(rank_of(res, t) <= k for t in gold) / 2  # noqa: E731
    assert recall(graph, 3) == 1.0  # both hops in the graph's top 3...
    assert recall(dense, 5) == 0.5  # ...while dense finds only the passage that names Joran Veld
    assert rank_of(graph, "Tarsk") < rank_of(dense, "Tarsk")
    assert rank_of(hybrid, "Tarsk") < rank_of(dense, "Tarsk")
    assert ("joran veld", "born in", "tarsk") in [f for f, _ in graph.facts]
    assert graph.fallback is None


def test_results_carry_scores_timings_and_batches_equal_single_queries(retriever: Retriever) -> None:
    qs = [QUESTION, "What does Kesh trade?", "glass"]
    batch = retriever.search(qs, mode="hybrid", k=3)
    for q, res in zip(qs, batch):
        single = retriever.search([q], mode="hybrid", k=3)[0]
        assert [d.id for d in single.docs] == [d.id for d in res.docs]
        assert len(res.docs) == 3 and res.mode == "hybrid"
        assert {"embed", "dense", "seeds", "ppr", "fuse"} <= set(res.timings_ms)
        scores = [d.score for d in res.docs]
        assert scores == sorted(scores, reverse=True)
    doc = batch[0].to_json()
    assert set(doc) == {"query", "mode", "docs", "ms"} and set(doc["docs"][0]) == {"id", "title", "text", "score"}


def test_batched_solver_equals_the_igraph_reference_end_to_end(retriever: Retriever, twohop_index, minilm) -> None:
    ref = Retriever(twohop_index, RetrievalConfig(device="cpu", ppr_backend="igraph"), embedder=minilm)
    for q in (QUESTION, "amber harbour", "painters"):
        a = retriever.search([q], mode="graph", k=10)[0]
        b = ref.search([q], mode="graph", k=10)[0]
        assert [d.id for d in a.docs] == [d.id for d in b.docs]
        assert np.allclose([d.score for d in a.docs], [d.score for d in b.docs], atol=1e-4)


def test_query_that_links_to_no_entity_falls_back_to_dense_seeds(retriever: Retriever) -> None:
    no_facts = Retriever(retriever.data, RetrievalConfig(device="cpu", fact_top_k=0), embedder=retriever.embedder)
    res = no_facts.search(["xylophone quantum zebra"], mode="graph", k=3)[0]
    assert res.fallback and "dense seeds" in res.fallback
    dense = retriever.search(["xylophone quantum zebra"], mode="passage", k=3)[0]
    assert len(res.docs) == 3 and res.docs[0].id == dense.docs[0].id  # the dense seed dominates


def test_bad_queries_are_clear_errors(retriever: Retriever) -> None:
    with pytest.raises(QueryError, match="empty query"):
        retriever.search(["   "])
    with pytest.raises(QueryError, match="unknown mode"):
        retriever.search(["x"], mode="web")  # type: ignore[arg-type]
    with pytest.raises(QueryError, match="longer than"):
        retriever.search(["x" * 5000])


def test_k_larger_than_the_corpus_returns_everything_once(retriever: Retriever) -> None:
    for mode in ("passage", "graph", "hybrid"):
        res = retriever.search(["river"], mode=mode, k=50)[0]
        ids = [d.id for d in res.docs]
        assert len(ids) == len(set(ids)) == 10


def test_sparse_and_dense_resets_and_vertex_order_give_the_same_scores() -> None:
    import scipy.sparse as sp

    g = random_graph(11)
    rng = np.random.default_rng(3)
    reset = np.zeros((g.vcount(), 20), dtype=np.float32)
    for j in range(20):
        reset[rng.integers(0, g.vcount(), 3), j] = rng.random(3) + 0.1
    rows = np.arange(50)
    ordered = PPRSolver.from_igraph(g, device="cpu")
    plain = PPRSolver.from_igraph(g, device="cpu", reorder=False)
    a = ordered.solve(reset, rows=rows)
    assert np.allclose(a, ordered.solve(sp.csc_matrix(reset), rows=rows), atol=1e-7)
    assert np.allclose(a, plain.solve(reset, rows=rows), atol=1e-6)  # RCM renumbering is only for speed
    assert np.allclose(a[:, 3], ordered.solve(reset[:, 3], rows=rows), atol=1e-6)  # one column = the batch column


def test_query_vectors_skip_the_encoder_and_give_the_same_result(retriever: Retriever) -> None:
    qs = [QUESTION, "amber"]
    vecs = retriever.embed(qs)
    a = retriever.search(qs, mode="hybrid", k=4)
    b = retriever.search(qs, mode="hybrid", k=4, query_vectors=vecs)
    assert [[d.id for d in r.docs] for r in a] == [[d.id for d in r.docs] for r in b]
    assert "embed" in a[0].timings_ms and "embed" not in b[0].timings_ms
    with pytest.raises(QueryError, match="shape"):
        retriever.search(qs, query_vectors=vecs[:1])


def test_query_entities_prefer_the_longest_name(retriever: Retriever) -> None:
    entities = set(retriever.data.entities)
    assert {"veld", "pell", "joran veld", "river pell"} <= entities  # nested names exist in this graph
    names = [retriever.data.graph.vs[v]["name"] for v in retriever.query_entities("Did Joran Veld swim the River Pell?")]
    assert "e:joran veld" in names and "e:river pell" in names
    assert "e:veld" not in names and "e:pell" not in names  # inside the longer matches


# -- fact matching ------------------------------------------------------------------------------------------------

def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("small", ["float", "int8"])
def test_screened_fact_matching_equals_the_float32_scan(small: str) -> None:
    """The screened single-query path (float16 or int8) and the batched GEMM both give the top facts, minimum and
    maximum of an exact scan, up to float32 rounding: facts whose scores differ by less than that (near copies,
    exact duplicates) may come in either order, as they would between two float32 scans that sum in different
    orders."""
    from routerag.retrieval.facts import SMALL_BATCH, FactScorer

    rng = np.random.default_rng(0)
    facts = unit_rows(rng.standard_normal((5000, 64))).astype(np.float32)
    # near-ties that float16 cannot tell apart: copies nudged by less than its resolution
    base = facts[:20].copy()
    facts[20:40] = unit_rows(base + 1e-5 * rng.standard_normal(base.shape))
    facts[40:60] = base  # exact duplicates
    queries = np.vstack([unit_rows(base[:6] + 0.3 * rng.standard_normal((6, 64))), base[6:9],
                         unit_rows(base[:9] + 0.3 * rng.standard_normal((9, 64)))]).astype(np.float32)
    scorer = FactScorer(facts, blas_threads=2, small_batch_scan=small)  # type: ignore[arg-type]
    assert (scorer.screen is not None) == (small == "int8")
    assert len(queries) >= 2 * SMALL_BATCH
    big = scorer.match(queries, 5)  # a large batch: the float32 GEMM, its rows split over two threads
    exact = queries.astype(np.float64) @ facts.T.astype(np.float64)
    for r in range(len(queries)):
        best = np.sort(exact[r])[::-1][:5]
        small = scorer.match(queries[r:r + 1], 5)  # one query: screened, rescored in float32
        for got in (small.top[0], big.top[r]):
            assert len(set(got)) == 5
            assert np.allclose(exact[r, got], best, atol=1e-6)  # the top 5, best first, up to float32 rounding
        assert np.allclose(small.scores[0], exact[r, small.top[0]], atol=1e-6)
        for m, i in ((small, 0), (big, r)):
            assert m.lo[i] == pytest.approx(exact[r].min(), abs=1e-6)
            assert m.hi[i] == pytest.approx(exact[r].max(), abs=1e-6)
    # where the top 5 is clear of rounding, both paths pick exactly the same facts in the same order
    table = unit_rows(rng.standard_normal((5000, 64))).astype(np.float32)
    q = unit_rows(rng.standard_normal((40, 64))).astype(np.float32)
    one = [list(FactScorer(table, small_batch_scan=small).match(q[r:r + 1], 5).top[0])  # type: ignore[arg-type]
           for r in range(40)]
    for threads in (1, 3):  # the GEMM on one thread, and split three ways
        for how in ("blas", "onnxruntime"):
            assert one == [list(t) for t in FactScorer(table, blas_threads=threads,
                                                        batch_scan=how).match(q, 5).top]
    assert scorer.bound(1.0) < 2e-3  # the proven float16 error stays small for unit vectors


def test_onnxruntime_fact_scan_equals_the_float32_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch matched in ONNX Runtime (GEMM, TopK and the row range in one graph) gives the float32 GEMM's top
    facts, scores, minimum and maximum over more queries than one run takes, with exact duplicates lowest index
    first; a forked child makes its own session; asking for ONNX Runtime where it is missing is a clear error."""
    import os
    import signal

    from routerag.retrieval import facts as facts_mod
    from graph_index.ort_session import TopScan
    from routerag.retrieval.facts import FactScorer

    rng = np.random.default_rng(1)
    facts = unit_rows(rng.standard_normal((6000, 64))).astype(np.float32)
    base = facts[:30].copy()
    facts[30:60] = unit_rows(base + 1e-5 * rng.standard_normal(base.shape))
    facts[60:90] = base  # exact duplicates of 0-29
    queries = unit_rows(np.vstack([base + 0.3 * rng.standard_normal(base.shape),
                                   rng.standard_normal((TopScan.ROWS + 10, 64))])).astype(np.float32)
    scorer = FactScorer(facts, batch_scan="onnxruntime")
    assert scorer.scan is not None
    got = scorer.match(queries, 5)
    gemm = FactScorer(facts, batch_scan="blas").match(queries, 5)
    exact = queries.astype(np.float64) @ facts.T.astype(np.float64)
    for r in range(len(queries)):
        best = np.sort(exact[r])[::-1][:5]
        assert len(set(got.top[r])) == 5
        assert np.allclose(exact[r, got.top[r]], best, atol=1e-6)
        assert np.allclose(got.scores[r], exact[r, got.top[r]], atol=1e-6)
        assert got.lo[r] == pytest.approx(exact[r].min(), abs=1e-6)
        assert got.hi[r] == pytest.approx(exact[r].max(), abs=1e-6)
        for i in range(4):  # equal scores come lowest index first
            if got.scores[r, i] == got.scores[r, i + 1]:
                assert got.top[r, i] < got.top[r, i + 1]
    ties = [r for r in range(30) if {r, r + 60} <= set(got.top[r])]
    assert ties and all(list(got.top[r]).index(r) < list(got.top[r]).index(r + 60) for r in ties)
    # where the top 6 are clear of rounding, both pick exactly the same facts in the same order
    clear = [r for r in range(len(queries)) if np.diff(np.sort(exact[r])[::-1][:6]).max() < -1e-5]
    assert len(clear) > 50 and all(list(got.top[r]) == list(gemm.top[r]) for r in clear)
    if hasattr(os, "fork"):  # ONNX Runtime's pool does not survive a fork: the child needs its own session
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)
            os._exit(0 if np.array_equal(scorer.match(queries, 5).top, got.top) else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    monkeypatch.setattr(facts_mod, "_onnxruntime", lambda: False)
    fallback = FactScorer(facts)
    assert fallback.scan is None and fallback.screen is None  # auto falls back to numpy and the float16 screen
    with pytest.raises(RuntimeError, match="onnxruntime is not installed"):
        FactScorer(facts, batch_scan="onnxruntime")
    with pytest.raises(RuntimeError, match="small_batch_scan = int8, but onnxruntime is not installed"):
        FactScorer(facts, small_batch_scan="int8")


def test_int8_screen_gives_the_float32_scan_s_top_k_and_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph_index.ort_session.Int8Screen: its error bound holds for every row, and what it returns is the exact
    scan's top k (best first, equal scores lowest index first), minimum and maximum, also where more rows than its
    first width fall within the bound (200 copies of one row), for a zero query and a zero row, one query or
    several at once, and k past the table's size."""
    from graph_index.ort_session import Int8Screen, _quantise

    rng = np.random.default_rng(7)
    table = unit_rows(rng.standard_normal((3000, 48)))
    base = table[:20].copy()
    table[20:40] = unit_rows(base + 1e-5 * rng.standard_normal(base.shape))
    table[40:60] = base  # exact duplicates
    table[100:300] = table[99]  # 200 copies: more rows within the bound than the first width
    table[500] = 0
    queries = np.vstack([unit_rows(base[:5] + 0.3 * rng.standard_normal((5, 48))), table[99:100],
                         unit_rows(rng.standard_normal((5, 48))), np.zeros((1, 48), np.float32)]).astype(np.float32)
    screen = Int8Screen(table, 2, with_range=True)
    widths: list[int] = []
    run = screen.session.run
    monkeypatch.setattr(screen.session, "run", lambda feeds: (widths.append(int(feeds["width"][0])), run(feeds))[1])
    codes, scale, _, _ = _quantise(table)
    stored = codes.T.astype(np.float64) * scale[:, None].astype(np.float64)
    exact = queries.astype(np.float64) @ table.T.astype(np.float64)
    got = screen(queries, 5)
    for r, q in enumerate(queries):
        step = max(float(np.abs(q).max()) / 127, 0.0) or 1.0
        u = np.clip(np.rint(q / step), -127, 127)
        assert np.abs(exact[r] - step * (stored @ u)).max() <= screen.bound(q[None], np.array([step]), u[None])[0]
        one = screen(q[None], 5)
        for scores, ids, lo, hi in ((got[0][r], got[1][r], got[2][r], got[3][r]), tuple(x[0] for x in one)):
            assert len(set(ids)) == 5
            assert np.allclose(exact[r, ids], np.sort(exact[r])[::-1][:5], atol=1e-6)
            assert np.allclose(scores, exact[r, ids], atol=1e-6)
            assert lo == pytest.approx(exact[r].min(), abs=1e-6) and hi == pytest.approx(exact[r].max(), abs=1e-6)
            for i in range(4):
                if scores[i] == scores[i + 1]:
                    assert ids[i] < ids[i + 1]
    assert list(got[1][5]) == [99, 100, 101, 102, 103]  # 201 equal rows: lowest index first
    assert list(got[1][-1]) == [0, 1, 2, 3, 4]  # a zero query scores every row 0
    assert max(widths) > 4 * 5  # the copies made it look past its first width
    small = Int8Screen(table[:3], 1)
    scores, ids, lo, hi = small(queries[:2], 10)
    assert ids.shape == (2, 3) and np.isnan(lo).all() and np.isnan(hi).all()
    assert sorted(ids[0]) == [0, 1, 2]
    broken = table.copy()
    broken[3, 0] = np.nan
    with pytest.raises(ValueError, match="needs finite table values; row 3 holds NaN"):
        Int8Screen(broken)
    from routerag.retrieval.facts import FactScorer

    assert FactScorer(broken).screen is None  # auto keeps such a table on the float path
    monkeypatch.setattr(Int8Screen, "MAX_BYTES", 100)
    assert not Int8Screen.fits(table)
    with pytest.raises(ValueError, match="an int8 screen takes 1 to 100 table entries"):
        Int8Screen(table)


def test_an_onnx_session_freed_in_a_forked_child_is_kept_not_destroyed() -> None:
    """A screen that became garbage in the parent (a reference cycle not yet collected) and is collected in a forked
    child: destroying its ONNX Runtime session there waited forever on the parent's thread pool. It is kept."""
    import gc
    import os
    import signal

    from graph_index.ort_session import Int8Screen

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    screen = Int8Screen(unit_rows(np.random.default_rng(0).standard_normal((500, 16))), 2)
    screen(np.ones((1, 16), np.float32), 3)  # the session's pool has run in the parent
    cycle: list[object] = [screen]
    cycle.append(cycle)
    del screen, cycle
    gc.disable()
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)
            gc.collect()
            os._exit(0)
    finally:
        gc.enable()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


# -- LLM fact filter -----------------------------------------------------------------------------------------------

def test_fact_filter_parses_answers_and_never_breaks_retrieval(retriever: Retriever) -> None:
    from tests.helpers.fake_openai import FakeOpenAIServer, Reply, last_user_message

    from routerag.retrieval.fact_filter import parse_keep

    assert parse_keep('Sure: {"keep": [2, "1", 9, 2, true]}', 3) == [1, 0]  # out of range, repeats, bools dropped
    assert parse_keep("no json here", 3) is None and parse_keep('{"keep": "all"}', 3) is None
    assert parse_keep('{"keep": []}', 3) == []

    def handler(req: dict) -> Reply:
        msg = last_user_message(req)
        if "boom" in msg:
            return Reply(status=500, error="scripted failure")
        if "glass" in msg:
            return Reply(text='{"keep": []}')
        lines = [ln for ln in msg.splitlines() if ln[:1].isdigit()]
        keep = [i + 1 for i, ln in enumerate(lines) if "veld" in ln.lower()]  # only facts about Joran Veld
        return Reply(text='{"keep": %s}' % keep)

    with FakeOpenAIServer(handler) as server:
        cfg = RetrievalConfig(device="cpu", fact_filter=True, fact_filter_base_url=server.base_url,
                              fact_filter_model="fake-model")
        filtered = Retriever(retriever.data, cfg, embedder=retriever.embedder)
        plain = retriever.search([QUESTION], mode="graph", k=3)[0]
        res = filtered.search([QUESTION], mode="graph", k=3)[0]
        assert any("veld" not in " ".join(f).lower() for f, _ in plain.facts)  # the filter has work to do
        assert res.facts and all("veld" in " ".join(f).lower() for f, _ in res.facts)
        assert "filter" in res.timings_ms and len(server.requests) == 1
        dropped = filtered.search(["glass"], mode="graph", k=3)[0]
        assert dropped.facts == [] and "fact filter kept no fact" in dropped.fallback and len(dropped.docs) == 3
        failed = filtered.search(["boom glass"], mode="graph", k=3)[0]  # a failed call keeps every fact
        assert [f for f, _ in failed.facts] == [f for f, _ in retriever.search(["boom glass"], mode="graph", k=3)[0].facts]
    with pytest.raises(ValueError, match="fact_filter needs"):
        RetrievalConfig(fact_filter=True)


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_fact_index_finds_the_top_facts_and_the_range(kind: str) -> None:
    """The FAISS fact indexes: the exact top facts are found (nearly always, on unit vectors), their scores are
    exact (rescored), and the minimum over all facts comes from the negated query's search."""
    from routerag.retrieval.facts import FactScorer, FaissFactScorer

    rng = np.random.default_rng(0)
    emb = rng.standard_normal((4000, 64)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    q = emb[rng.choice(4000, 20, replace=False)] + 0.3 * rng.standard_normal((20, 64)).astype(np.float32)
    exact, approx = FactScorer(emb).match(q, 3), FaissFactScorer(emb, kind).match(q, 3)
    found = np.mean([len(set(a) & set(b)) / 3 for a, b in zip(exact.top, approx.top)])
    assert found >= (0.9 if kind == "hnsw" else 0.4)  # IVF-PQ trades recall for memory (measured in benchmarks)
    for r in range(20):  # a found fact's score is its exact score
        np.testing.assert_allclose(approx.scores[r], emb[approx.top[r]] @ q[r], rtol=1e-5)
    assert np.all(approx.lo >= exact.lo - 1e-5) and np.mean(np.abs(approx.lo - exact.lo)) < 0.15
    np.testing.assert_allclose(approx.hi, exact.hi, rtol=1e-5) if kind == "hnsw" else None


def test_query_floors_count_the_encoder_work_and_bound_throughput(retriever: Retriever) -> None:
    """benchmarks/query_floors.py (issue 19's lower bounds): the encoder's FLOPs follow from its shapes and the
    question's own token count, and the ceilings are the floors' arithmetic."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from query_floors import encoder_flops, floors
    from tokenizers import Tokenizer

    from graph_index.embedders.sentence_transformers import embedded_minilm_path

    folder = embedded_minilm_path()
    question = "Where was the glass lighthouse built?"
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    s = len(tok.encode(question).ids)  # [CLS] … [SEP]
    assert 8 < s < 20
    layers, h, inner = 6, 384, 1536  # all-MiniLM-L6-v2
    assert encoder_flops(folder, [question]) == [2.0 * layers * s * (4 * h * h + 2 * h * inner + 2 * s * h)]
    out = floors(retriever, [question])
    b = out["batched_floor_ms_per_query"]
    assert out["machine"]["gemm_gflops"] > 0 and out["machine"]["int8_gemm_gops"] > 0
    # the fp32 rate is the best of the libraries at hand (torch alone was slower than the encoder's own kernels)
    by_library = [v for v in out["machine"]["gemm_gflops_by_library"].values() if v is not None]
    assert len(by_library) >= 2 and out["machine"]["gemm_gflops"] == pytest.approx(max(by_library), abs=0.051)
    assert out["batched_ceiling_qps_without_pagerank"] == pytest.approx(
        1000 / (b["encode"] + b["facts"] + b["dense"]), rel=2e-3)
    assert b["encode"] == pytest.approx(encoder_flops(folder, [question])[0] / (out["machine"]["gemm_gflops"] * 1e6),
                                        rel=2e-3)
    assert out["batched_estimate_qps_int8_encoder_and_pagerank"] < out["batched_ceiling_qps_without_pagerank_int8_encoder"]


def test_dense_search_on_the_blas_kernel_gives_the_same_results_and_restores_faiss() -> None:
    """graph_index.dense.search: a batch on FAISS's BLAS kernel finds what FAISS's default choice finds, and the
    process-wide threshold it sets for the call is put back."""
    import faiss

    from graph_index.dense import search

    rng = np.random.default_rng(3)
    index = faiss.IndexFlatIP(32)
    index.add(unit_rows(rng.standard_normal((3000, 32))).astype(np.float32))
    q = unit_rows(rng.standard_normal((40, 32))).astype(np.float32)
    before = faiss.cvar.distance_compute_blas_threshold
    want_d, want_i = index.search(q, 10)
    got_d, got_i = search(index, q, 10, blas_from=16)
    assert faiss.cvar.distance_compute_blas_threshold == before
    assert (got_i == want_i).all() and np.allclose(got_d, want_d, atol=1e-5)
    small_d, small_i = search(index, q[:3], 10, blas_from=16)  # below blas_from: FAISS's own choice, untouched
    assert (small_i == want_i[:3]).all() and (small_d == want_d[:3]).all()


def test_long_chebyshev_solves_stay_finite_and_match_igraph() -> None:
    """The step kept as c·u (u grows as 1/c) over many steps: a tight tolerance at a small damping is 20+ steps,
    where c would leave float32's range without the rescaling."""
    g = random_graph(7, n=300, m=1200)
    solver = PPRSolver.from_igraph(g, damping=0.1, tol=1e-40)
    assert solver.steps > 20
    reset = np.zeros(solver.n)
    reset[[3, 50]] = 1.0
    got = solver.solve(reset)
    assert np.isfinite(got).all()
    assert np.allclose(got, igraph_ppr(g, reset, damping=0.1), atol=1e-5)
