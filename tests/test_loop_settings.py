"""The loop's settings are one type, `Loop`, resolved once; `k` has one default and one set of bounds wherever it
is set; Reciprocal Rank Fusion's constant is `rrf_k`, not `k`."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from routerag.config import (DEFAULT_K, LOOP_DEFAULTS, LOOP_FIELDS, MAX_K, Loop, LoopSettings, PolicyConfig,
                             RetrievalConfig, ServerConfig, TrainConfig)
from routerag.policy import LoopConfig
from routerag.policy.card import resolve_with
from routerag.retrieval.fusion import reciprocal_rank_fusion


def test_resolving_gives_a_loop_from_the_first_source_that_sets_each_field() -> None:
    loop = TrainConfig(budget=1).resolve(PolicyConfig(budget=3, k=5), LoopSettings(k=7, max_invalid=0))
    assert isinstance(loop, Loop)
    assert (loop.budget, loop.k, loop.max_invalid, loop.max_turn_tokens) == (1, 5, 0, LOOP_DEFAULTS.max_turn_tokens)
    resolved = resolve_with(PolicyConfig(), None, None, loop=TrainConfig(k=4))
    assert resolved.loop == Loop(k=4) and resolved.loop.k == 4


def test_the_loops_config_extends_the_loop_and_takes_its_defaults() -> None:
    cfg = LoopConfig(k=2, template="{question}")
    assert isinstance(cfg, Loop) and cfg.k == 2 and cfg.budget == Loop().budget
    assert {**cfg} == {**Loop(k=2)} and tuple(cfg) == LOOP_FIELDS  # read as a mapping: the loop settings only
    assert dataclasses.replace(cfg, budget=1).budget == 1


def test_a_loop_reads_as_the_dict_it_replaces() -> None:
    assert LOOP_DEFAULTS == Loop() and LOOP_DEFAULTS["k"] == DEFAULT_K == Loop().k == RetrievalConfig().k
    assert {**LOOP_DEFAULTS, "budget": 2} == Loop(budget=2)
    with pytest.raises(KeyError):
        LOOP_DEFAULTS["template"]


@pytest.mark.parametrize("build", [lambda k: PolicyConfig(k=k), lambda k: TrainConfig(k=k),
                                   lambda k: RetrievalConfig(k=k), lambda k: ServerConfig(max_k=k)])
def test_k_has_one_set_of_bounds(build) -> None:
    assert build(MAX_K) is not None and build(1) is not None
    for bad in (0, MAX_K + 1):
        with pytest.raises(ValidationError):
            build(bad)


def test_rrf_constant_has_its_own_name() -> None:
    assert reciprocal_rank_fusion([["a", "b"], ["b", "a"]], rrf_k=1) == [("a", 1 / 2 + 1 / 3), ("b", 1 / 3 + 1 / 2)]
    assert reciprocal_rank_fusion([["a"]], rrf_k=10) == reciprocal_rank_fusion([["a"]], k=10)
    assert RetrievalConfig().rrf_k == 60
