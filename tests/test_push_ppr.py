"""Forward-push PageRank equals igraph's prpack within its stated bound (each unnormalised score low by less than
eps × weighted degree, never high; the normalising total exact), dangling seeds included."""

from __future__ import annotations

import numpy as np
import pytest

from routerag.retrieval.ppr import igraph_ppr
from routerag.retrieval.push import PushPPR

from .test_retrieval import random_graph


@pytest.mark.parametrize("seed", range(4))
def test_push_matches_prpack_within_its_bound(seed: int) -> None:
    g = random_graph(seed)
    rng = np.random.default_rng(seed + 7)
    n = g.vcount()
    seeds = np.concatenate([rng.integers(0, n - 3, 4), [n - 1]])  # the last vertex is isolated
    weights = rng.random(5) + 0.1
    reset = np.zeros(n)
    np.add.at(reset, seeds, weights)
    ref = igraph_ppr(g, reset, 0.5)
    eps = 1e-9
    push = PushPPR.from_igraph(g, damping=0.5, eps=eps)
    p, total = push.solve(seeds, weights)
    # prpack's normalised scores times the exact total are the unnormalised PageRank push approximates from below
    true = ref * total
    assert (true - p >= -1e-9).all()
    assert (true - p <= eps * push.deg + 1e-9).all()
    got = p / total
    assert np.abs(got - ref).max() < 1e-6
    assert list(np.argsort(-got, kind="stable")[:10]) == list(np.argsort(-ref, kind="stable")[:10])


def test_push_touches_only_the_neighbourhood_and_gives_up_past_its_work_bound() -> None:
    g = random_graph(0)
    push = PushPPR.from_igraph(g, damping=0.5, eps=1e-3)
    p, _ = push.solve(np.array([0]), np.array([1.0]))
    assert 0 < np.count_nonzero(p) < g.vcount() // 2
    assert PushPPR.from_igraph(g, damping=0.5, eps=1e-12, max_pushes=10).solve(np.array([0]), np.array([1.0])) is None
