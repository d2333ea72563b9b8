"""Forward-push PageRank (the scale profile's) equals igraph's prpack within its stated bound: each score low by less
than eps × weighted degree / total, never high, and the reported L1 error exact; dangling seeds included."""

from __future__ import annotations

import numpy as np
import pytest

from routerag.retrieval.ppr import PPRSolver, igraph_adjacency, igraph_ppr
from routerag.retrieval.push import PushPPR

from .test_retrieval import random_graph


def _push(g, eps: float, on_graph: bool = False, **kwargs) -> PushPPR:  # noqa: ANN001
    """Push on a solver's scaled operator, or (``on_graph``) on the graph's adjacency itself, as the scale profile
    loads it."""
    if on_graph:
        return PushPPR.on_graph(igraph_adjacency(g, "weight").tocsr(), damping=0.5, eps=eps, **kwargs)
    return PushPPR(PPRSolver.from_igraph(g, damping=0.5, device="cpu"), eps=eps, **kwargs)


@pytest.mark.parametrize("on_graph", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_push_matches_prpack_within_its_bound(seed: int, on_graph: bool) -> None:
    g = random_graph(seed)
    rng = np.random.default_rng(seed + 7)
    n = g.vcount()
    seeds = np.concatenate([rng.integers(0, n - 3, 4), [n - 1]])  # the last vertex is isolated
    weights = rng.random(5) + 0.1
    reset = np.zeros(n)
    np.add.at(reset, seeds, weights)
    ref = igraph_ppr(g, reset, 0.5)
    for eps in (1e-4, 1e-6):
        push = _push(g, eps, on_graph)
        res = push.solve(seeds, weights)
        assert res.complete
        got = np.zeros(n)
        got[res.vertices] = res.scores
        err = ref - got
        rounding = 1e-5 * ref + 1e-8  # the solver's operator is float32
        assert (err >= -rounding).all()  # never high
        assert (err <= eps * push.degree(np.arange(n)) / res.total + rounding).all()
        assert abs(err.sum() - res.l1_error) < 1e-5  # the L1 error is what it reports
    assert res.l1_error < 1e-2
    exact = _push(g, 1e-10, on_graph).top(seeds, weights, n, 10)[0]
    assert list(exact) == list(np.lexsort((np.arange(n), -ref))[:10])


def test_push_touches_only_the_neighbourhood_and_stops_at_its_work_bound() -> None:
    g = random_graph(0)
    res = _push(g, 1e-3).solve(np.array([0]), np.array([1.0]))
    assert res.complete and 0 < len(res.vertices) < g.vcount() // 2
    ref = igraph_ppr(g, np.eye(g.vcount())[0], 0.5)
    cut = _push(g, 1e-12, max_edges=10).solve(np.array([0]), np.array([1.0]))
    assert not cut.complete  # stopped early: the L1 error is still exact
    got = np.zeros(g.vcount())
    got[cut.vertices] = cut.scores
    assert abs((ref - got).sum() - cut.l1_error) < 1e-5 and cut.l1_error > 0.01
    with pytest.raises(ValueError):
        _push(g, 1e-3).solve(np.array([0]), np.array([-1.0]))


def test_kept_work_arrays_give_each_query_what_fresh_ones_give() -> None:
    """Queries one after another reuse the work arrays, cleared where the last one touched them: the result of each
    equals a fresh solver's, whatever ran before (a failed query included)."""
    g = random_graph(2)
    n = g.vcount()
    push = _push(g, 1e-6, on_graph=True)
    queries = [(np.array([0, 5]), np.array([1.0, 2.0])), (np.array([n - 2]), np.array([1.0])),
               (np.array([3, 4, 7]), np.array([0.2, 0.3, 0.5]))]
    for seeds, weights in queries * 2:
        got = push.solve(seeds, weights)
        want = _push(g, 1e-6, on_graph=True).solve(seeds, weights)
        np.testing.assert_array_equal(got.vertices, want.vertices)
        np.testing.assert_array_equal(got.scores, want.scores)
        with pytest.raises(ValueError):
            push.solve(seeds, -weights)


def test_concurrent_queries_share_the_kept_arrays_safely() -> None:
    """16 threads at once on one solver (a server's worker threads): each gets what a fresh solver gives."""
    from concurrent.futures import ThreadPoolExecutor

    g = random_graph(3)
    n = g.vcount()
    push = _push(g, 1e-6, on_graph=True)
    rng = np.random.default_rng(5)
    queries = [(rng.integers(0, n, 3), rng.random(3) + 0.1) for _ in range(64)]
    want = [_push(g, 1e-6, on_graph=True).solve(s, w) for s, w in queries]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda q: push.solve(*q), queries))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.vertices, b.vertices)
        np.testing.assert_array_equal(a.scores, b.scores)
