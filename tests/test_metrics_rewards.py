"""Answer metrics and every reward, on hand-made rollouts, with exact values."""

from __future__ import annotations

import numpy as np
import pytest

from routerag.metrics import exact_match, f1, gen_acc, normalize_answer
from routerag.metrics import answer_in_documents
from training.rewards import (GainBeyondRAG, RewardConfig, Rollout, batch_rewards,
                              duplicate_query_penalty, format_reward, frugal_stop_reward, retrieval_count_reward,
                              routerag_time_efficiency, support_recall, table_cost)

# -- metrics ------------------------------------------------------------------------------------------------------


def test_squad_normalisation() -> None:
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("A cat, an apple.") == "cat apple"
    assert normalize_answer("") == "" and normalize_answer(None) == ""


@pytest.mark.parametrize("pred, golds, em, f, ga", [
    ("Paris", ["paris"], 1.0, 1.0, 1.0),
    ("the city of Paris, France", ["Paris"], 0.0, 0.4, 1.0),  # f1: 1 of 4 tokens → p=0.25, r=1 → 0.4
    ("politician", ["politician", "political leader"], 1.0, 1.0, 1.0),
    ("political figure", ["politician", "political leader"], 0.0, 0.5, 0.0),
    ("", ["Paris"], 0.0, 0.0, 0.0),
    (None, ["Paris"], 0.0, 0.0, 0.0),
    ("New York City", ["new york"], 0.0, 0.8, 1.0),
    ("York New", ["new york"], 0.0, 1.0, 0.0),  # a bag-of-tokens match but not a span
])
def test_em_f1_genacc(pred, golds, em, f, ga) -> None:
    assert exact_match(pred, golds) == em
    assert f1(pred, golds) == pytest.approx(f)
    assert gen_acc(pred, golds) == ga


# -- rewards ------------------------------------------------------------------------------------------------------

def rollout(answer, searches=0, ms=0.0, ok=True, queries=(), titles=(), modes=(), docs=()):
    return Rollout(answer=answer, searches=searches, retrieval_ms=ms, format_ok=ok, queries=list(queries),
                   step_titles=[list(t) for t in titles], modes=list(modes), documents=list(docs))


def test_format_reward() -> None:
    assert format_reward(rollout("x", ok=True), 0.5) == 0.5
    assert format_reward(rollout("x", ok=False), 0.5) == -0.5


def test_routerag_time_efficiency_exact() -> None:
    # T = p95 of [0, 100, 200, 400] = 200 + 0.85·200 = 370; s = min(0.5·t/370, 0.5)
    r = routerag_time_efficiency([1, 1, 0, 1], [0, 100, 200, 400])
    s = np.array([0.0, 50 / 370, 100 / 370, 0.5])
    assert r == pytest.approx([1 + s.mean() - s[0], 1 + s.mean() - s[1], 0.0, 1 + s.mean() - s[3]])
    assert r[0] == pytest.approx(1.2263513513)
    assert routerag_time_efficiency([1, 0], [0, 0]) == [1.0, 0.0]  # nobody retrieved: no efficiency term
    assert routerag_time_efficiency([], []) == []
    # paid: who earns the term (default: correct > 0)
    assert routerag_time_efficiency([1, 1, 0.5, 1], [0, 100, 200, 400], paid=[True, False, False, True])[1:3] == [1.0, 0.5]


@pytest.mark.parametrize("correct, rc, stage, expected", [
    (False, 0, 1, -1.0), (False, 2, 1, -0.4), (False, 3, 1, -0.1), (False, 4, 1, -0.1), (True, 4, 1, 1.0),
    (True, 0, 2, 1.0), (True, 2, 2, 0.4), (True, 4, 2, 0.1), (False, 1, 2, -1.0),
])
def test_retrieval_count_reward(correct, rc, stage, expected) -> None:
    assert retrieval_count_reward(correct, rc, stage, beta=0.3) == pytest.approx(expected)


def test_duplicate_query_penalty_is_mean_pairwise_cosine() -> None:
    vecs = {"a": [1.0, 0.0], "a again": [2.0, 0.0], "b": [0.0, 3.0]}
    embed = lambda qs: np.array([vecs[q] for q in qs])  # noqa: E731
    assert duplicate_query_penalty(["a", "a again", "b"], embed) == pytest.approx(1 / 3)
    assert duplicate_query_penalty(["a"], embed) == 0.0


def test_gain_beyond_rag_caches_the_baseline() -> None:
    calls = []

    def baseline(q):
        calls.append(q)
        return "London"

    gbr = GainBeyondRAG(baseline)
    assert gbr(rollout("Paris"), "capital of France?", ["Paris"]) == 1.0
    assert gbr(rollout("London"), "capital of France?", ["Paris"]) == 0.0
    assert gbr(rollout("Paris"), "capital of England?", ["London"]) == -1.0
    assert calls == ["capital of France?", "capital of England?"]


def test_frugal_stop_reward() -> None:
    gold = ["A", "B"]
    assert frugal_stop_reward(rollout("x", 2, titles=[["A"], ["B", "C"]]), gold, 4) == 1.0
    assert frugal_stop_reward(rollout("x", 4, titles=[["A", "B"], ["C"], ["D"], ["E"]]), gold, 4) == 0.25
    assert frugal_stop_reward(rollout("x", 1, titles=[["A"]]), gold, 4) == -1.0
    assert frugal_stop_reward(rollout("x", 4, titles=[["A"], ["C"], ["D"], ["E"]]), gold, 4) == 0.0


def test_presets_reproduce_routerag() -> None:
    rs = [rollout("Paris", 1, 100.0), rollout("Lyon", 2, 300.0), rollout("Paris", 0, 0.0)]
    golds = [["Paris"]] * 3
    stage1 = batch_rewards(rs, golds, RewardConfig.preset("routerag-stage1"))
    assert [b.total for b in stage1] == [1.0, 0.0, 1.0]
    stage2 = batch_rewards(rs, golds, RewardConfig.preset("routerag-stage2"))
    expected = routerag_time_efficiency([1, 0, 1], [100.0, 300.0, 0.0])
    assert [b.total for b in stage2] == pytest.approx(expected)
    assert stage2[2].total > stage2[0].total > stage2[1].total == 0.0  # right and fast > right and slow > wrong


def test_composed_reward_adds_weighted_parts() -> None:
    cfg = RewardConfig(correctness="em", format_weight=0.1, duplicate_weight=0.5, stop_weight=0.2)
    embed = lambda qs: np.array([[1.0, 0.0]] * len(qs))  # noqa: E731 - every query the same
    r = rollout("Paris", 2, 10.0, ok=False, queries=["q", "q"], titles=[["A"], ["B"]])
    [b] = batch_rewards([r], [["Paris"]], cfg, embed=embed, gold_titles=[["A"]], budget=4)
    assert b.parts["format"] == -0.1 and b.parts["duplicate"] == pytest.approx(1.0) and b.parts["stop"] == 0.75
    assert b.total == pytest.approx(1.0 - 0.1 - 0.5 * 1.0 + 0.2 * 0.75)


def test_answer_in_documents_matches_whole_token_spans_of_any_alias() -> None:
    docs = ["Marisol Vantreigh (born 1961) is an Orelandic composer born in Kestrel Harbor.", "Other page"]
    assert answer_in_documents(docs, ["Kestrel Harbor"]) == 1.0
    assert answer_in_documents(docs, ["Lisbon", "kestrel harbor"]) == 1.0  # any alias, normalised
    assert answer_in_documents(docs, ["Kestrel"]) == 1.0
    assert answer_in_documents(docs, ["Harb"]) == 0.0  # not a whole-token span
    assert answer_in_documents([], ["Kestrel Harbor"]) == 0.0
    assert answer_in_documents(docs, [""]) == 0.0


def test_support_recall_and_table_cost() -> None:
    r = rollout("x", 2, titles=[["A", "C"], ["b "]], modes=["graph", "passage"])
    assert support_recall(r, ["A", "B"]) == 1.0 and support_recall(r, ["A", "D"]) == 0.5
    assert support_recall(r, []) == 0.0
    assert table_cost(r, {"passage": 20.0, "graph": 34.0, "hybrid": 33.0}) == 54.0
    with pytest.raises(ValueError, match="graph"):
        table_cost(r, {"passage": 20.0})


def test_outcome_presets_credit_found_evidence_and_price_searches_by_the_table() -> None:
    docs_with = ["Kestrel Harbor is a city"]
    rs = [rollout("wrong", 1, 900.0, modes=["passage"], docs=docs_with),     # evidence found, cheap mode
          rollout("wrong", 2, 1.0, modes=["graph", "graph"], docs=docs_with),  # evidence found, two dear searches
          rollout("Kestrel Harbor", 1, 5.0, modes=["graph"], docs=[]),          # right answer, no evidence
          rollout("wrong", 1, 5.0, modes=["hybrid"], docs=["nothing here"])]    # neither
    golds = [["Kestrel Harbor"]] * 4
    stage1 = batch_rewards(rs, golds, RewardConfig.preset("outcome-stage1"))
    assert [b.total for b in stage1] == [0.5, 0.5, 1.0, 0.0]  # EM + 0.5 × evidence found
    assert [b.parts["retrieval_outcome"] for b in stage1] == [1.0, 1.0, 0.0, 0.0]
    maxed = batch_rewards(rs, golds, RewardConfig(retrieval="answer", retrieval_combine="max"))
    assert [b.total for b in maxed] == [1.0, 1.0, 1.0, 0.0]
    table = {"passage": 20.0, "graph": 34.0, "hybrid": 33.0}
    stage2 = batch_rewards(rs, golds, RewardConfig.preset("outcome-stage2"), cost_table=table)
    # the measured times (900 ms for the cheap search) are ignored: the table prices 20, 68, 34, 33 ms
    assert [b.parts["cost_ms"] for b in stage2] == [20.0, 68.0, 34.0, 33.0]
    assert [b.total for b in stage2] == pytest.approx(routerag_time_efficiency([0.5, 0.5, 1, 0],
                                                                              [20.0, 68.0, 34.0, 33.0]))
    assert stage2[0].total > stage2[1].total and stage2[2].total > stage2[3].total == 0.0
    # outcome-stage2-em: the same correctness, but the time term pays only the right answer (RouteRAG's EM = 1):
    # found-but-misread evidence keeps its 0.5 whatever its cost
    paid_right = batch_rewards(rs, golds, RewardConfig.preset("outcome-stage2-em"), cost_table=table)
    assert [b.total for b in paid_right] == pytest.approx(routerag_time_efficiency(
        [0.5, 0.5, 1, 0], [20.0, 68.0, 34.0, 33.0], paid=[False, False, True, False]))
    assert [b.total for b in paid_right][:2] == [0.5, 0.5] and paid_right[2].total != 1.0
    assert paid_right[2].total == pytest.approx(stage2[2].total)
    # a lower time_scale shrinks the term: the right answer's bonus moves toward 1 by the same factor
    gentle = batch_rewards(rs, golds, RewardConfig.preset("outcome-stage2-em", {"time_scale": 0.1}), cost_table=table)
    assert gentle[2].total - 1.0 == pytest.approx((paid_right[2].total - 1.0) / 5)
    with pytest.raises(ValueError, match="cost_table"):
        batch_rewards(rs, golds, RewardConfig.preset("outcome-stage2"))
    support = batch_rewards([rollout("x", 1, titles=[["A"]])], [["y"]], RewardConfig(retrieval="support"),
                            gold_titles=[["A", "B"]])
    assert support[0].total == 0.5


def test_rollout_round_trips_through_json() -> None:
    r = rollout("x", 2, 5.5, queries=["a", "b"], titles=[["T"], ["U"]], modes=["graph", "passage"], docs=["T t"])
    assert Rollout.from_json(r.to_json()) == r
