"""The four reward parts no preset uses (duplicate-query penalty, Gain Beyond RAG, stop reward, support recall),
chosen through ``train.reward_overrides`` and scored through the local trainer's reward path
(:class:`training.trainer_rewards.StageRewards`) on trajectories of a scripted policy, to exact values."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from pydantic import ValidationError

from routerag.config import Loop, TrainConfig
from routerag.datasets import GoldPassage, QAItem
from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.answering import Reader
from training.trainer_rewards import StageRewards, naive_rag_baseline

from .helpers.scripted import FakeSearch, ScriptedGenerator

Q = "In which city was the composer of The Glass Lighthouse born?"
FIRST, SECOND = "Glass Lighthouse composer", "Marisol Vantreigh birthplace"
DOCS = {FIRST: ["The Glass Lighthouse", "Opera"], SECOND: ["Marisol Vantreigh", "Kestrel Harbor"],
        Q: ["Opera", "Kestrel Harbor"]}
ITEM = QAItem("q1", Q, ["Kestrel Harbor"], supporting=[GoldPassage("The Glass Lighthouse"),
                                                       GoldPassage("Marisol Vantreigh")])
LOOP = Loop(budget=3, k=2)
VECTORS = {FIRST: [1.0, 0.0], SECOND: [0.0, 1.0]}
GOOD = [f"<search>[passage] {FIRST}</search>", f"<search>[graph] {SECOND}</search>", "<answer>Kestrel Harbor</answer>"]
"""Finds both supporting pages with two different queries and answers right."""
REPEAT = [f"<search>[passage] {FIRST}</search>", f"<search>[graph] {FIRST}</search>", "<answer>Opera</answer>"]
"""Asks the same query twice, never finds the composer's page, stops early and answers wrong."""


def trajectories():
    cfg = LoopConfig(budget=LOOP.budget, k=LOOP.k)
    return [asyncio.run(PolicyLoop(ScriptedGenerator(turns), FakeSearch(DOCS), cfg).run(Q)) for turns in (GOOD, REPEAT)]


def embed(queries: list[str]) -> np.ndarray:
    return np.array([VECTORS[q] for q in queries])


def score(overrides: dict, **kw):
    rewards = StageRewards(TrainConfig(switch_step=5, reward_overrides=overrides), LOOP, **kw)
    _, out = rewards.score(1, [ITEM, ITEM], trajectories())
    return out


def test_duplicate_query_penalty_through_the_trainer() -> None:
    good, repeat = score({"duplicate_weight": 0.5}, embed=embed)
    assert (good.parts["duplicate"], repeat.parts["duplicate"]) == (0.0, 1.0)  # orthogonal queries; one asked twice
    assert (good.total, repeat.total) == (1.0, -0.5)  # EM − 0.5 × penalty


def test_gain_beyond_rag_through_the_trainer_reads_naive_rag_once_per_question() -> None:
    reader_model, search = ScriptedGenerator(["<answer>Opera</answer>"]), FakeSearch(DOCS)
    baseline = naive_rag_baseline(Reader(None), reader_model, search, mode="passage", k=LOOP.k)
    good, repeat = score({"gain_beyond_rag_weight": 0.5}, baseline=baseline)
    assert search.calls == [(Q, "passage", 2)] and len(reader_model.requests) == 1  # one baseline for both rollouts
    assert "Opera" in reader_model.requests[0].prompt_text  # the policy reads the naive top 2 itself
    assert (good.parts["gain_beyond_rag"], repeat.parts["gain_beyond_rag"]) == (1.0, 0.0)
    assert (good.total, repeat.total) == (1.5, 0.0)


def test_stop_reward_through_the_trainer() -> None:
    good, repeat = score({"stop_weight": 0.2})
    # good: the evidence complete at its last search (1 − 0/3); repeat: stopped before the budget without it (−1)
    assert (good.parts["stop"], repeat.parts["stop"]) == (1.0, -1.0)
    assert (good.total, repeat.total) == (1.2, -0.2)


def test_support_recall_through_the_trainer() -> None:
    good, repeat = score({"retrieval": "support", "retrieval_combine": "sum", "retrieval_weight": 0.5})
    assert (good.parts["retrieval_outcome"], repeat.parts["retrieval_outcome"]) == (1.0, 0.5)
    assert (good.total, repeat.total) == (1.5, 0.25)  # EM + 0.5 × recall of the two supporting pages


def test_a_part_without_its_input_or_a_misspelt_field_is_an_error_before_scoring() -> None:
    with pytest.raises(ValueError, match="query encoder"):
        score({"duplicate_weight": 0.5})
    with pytest.raises(ValueError, match="baseline"):
        score({"gain_beyond_rag_weight": 0.5})
    with pytest.raises(ValueError, match="'stop_weigth' is no reward setting .did you mean 'stop_weight'"):
        StageRewards(TrainConfig(reward_overrides={"stop_weigth": 0.2}), LOOP)
    with pytest.raises(ValidationError, match="stop_weight"):
        StageRewards(TrainConfig(reward_overrides={"stop_weight": -1}), LOOP)


# -- verl: the per-rollout reward function, the stage-2 rescoring and the launch carry the same parts ---------------

GOLD_TITLES = json.dumps(["The Glass Lighthouse", "Marisol Vantreigh"])  # as routerag prepare-data writes them


def verl_scores(overrides: dict, baseline: str | None = None, **kw) -> list[float]:
    """compute_score over the two rollouts as verl's agent loop leaves them (the question, the gold pages and, for
    Gain Beyond RAG, naive RAG's answer recorded in the rollout)."""
    pytest.importorskip("verl")
    from training.rewards import Rollout
    from training.verl_plugin.reward import compute_score

    scores = []
    for traj in trajectories():
        r = Rollout.from_trajectory(traj)
        r.baseline_answer = baseline
        extra = {"rollout": r.to_json(), "question": Q, "supporting_titles": GOLD_TITLES}
        scores.append(compute_score("hotpotqa", "", {"target": ["Kestrel Harbor"]}, extra,
                                    overrides=json.dumps(overrides), budget=LOOP.budget, **kw)["score"])
    return scores


def test_verl_reward_function_scores_the_stop_reward_and_support_recall_from_the_row() -> None:
    assert verl_scores({"stop_weight": 0.2}) == [1.2, -0.2]
    assert verl_scores({"retrieval": "support", "retrieval_combine": "sum", "retrieval_weight": 0.5}) == [1.5, 0.25]


def test_verl_reward_function_scores_gain_beyond_rag_from_the_recorded_baseline() -> None:
    assert verl_scores({"gain_beyond_rag_weight": 0.5}, baseline="Opera") == [1.5, 0.0]
    with pytest.raises(ValueError, match="baseline"):
        verl_scores({"gain_beyond_rag_weight": 0.5})


def test_verl_reward_function_scores_the_duplicate_penalty_with_the_launchers_embedder(minilm) -> None:
    from graph_index.config import EmbedderConfig

    good, repeat = verl_scores({"duplicate_weight": 0.5}, embedder=json.dumps(EmbedderConfig().model_dump(mode="json")))
    v = minilm.encode_queries([FIRST, SECOND])
    cos = float(v[0] @ v[1] / (np.linalg.norm(v[0]) * np.linalg.norm(v[1])))
    assert good == pytest.approx(1.0 - 0.5 * cos, abs=1e-6) and repeat == pytest.approx(-0.5, abs=1e-6)


def test_verl_launch_passes_the_overrides_and_asks_the_agent_loop_for_the_baseline(tmp_path) -> None:
    pytest.importorskip("verl")
    import yaml

    from training.verl_plugin.compose import compose_launch
    from training.verl_plugin.launch import prepare_launch

    cfg = TrainConfig(engine="verl", verl={"train_files": ["train.parquet"]},
                      reward_overrides={"duplicate_weight": 0.5, "gain_beyond_rag_weight": 0.5, "stop_weight": 0.2})
    plan = prepare_launch(cfg, tmp_path / "run", index_dir=str(tmp_path), loop=LOOP)
    composed = compose_launch(plan["overrides"])  # the JSON values survive Hydra's grammar
    kwargs = composed.reward.custom_reward_function.reward_kwargs
    assert json.loads(kwargs.overrides) == cfg.reward_overrides == json.loads(composed.routerag.reward_overrides)
    assert kwargs.budget == composed.routerag.budget == 3
    assert json.loads(kwargs.embedder)["name"] == json.loads(composed.routerag.embedder)["name"] == "minilm"
    [entry] = yaml.safe_load(open(plan["agent_loops_yaml"]))
    assert entry["baseline"] == {"mode": "hybrid", "k": 2}


def test_verl_stage2_rescoring_adds_the_parts_as_the_local_trainer_does() -> None:
    pytest.importorskip("verl")
    import torch
    from verl.protocol import DataProto

    from training.rewards import Rollout
    from training.verl_plugin.stage2 import stage2_scores

    overrides = {"stop_weight": 0.2, "retrieval": "support", "retrieval_combine": "sum"}
    trajs = trajectories()
    _, local = StageRewards(TrainConfig(switch_step=0, reward_overrides=overrides), LOOP).score(1, [ITEM, ITEM], trajs)
    rows = np.empty(2, dtype=object)
    for i, traj in enumerate(trajs):  # as the agent loop records them
        r = Rollout.from_trajectory(traj)
        r.question, r.gold_titles = Q, json.loads(GOLD_TITLES)
        rows[i] = r.to_json()
    truth = np.empty(2, dtype=object)
    truth[:] = [{"ground_truth": {"target": ["Kestrel Harbor"]}}] * 2
    ones = torch.ones((2, 4), dtype=torch.long)
    data = DataProto.from_dict(tensors={"responses": ones, "attention_mask": ones},
                               non_tensors={"rollout": rows, "reward_model": truth})
    got = stage2_scores(data, "routerag-stage2", overrides=json.dumps(overrides), budget=LOOP.budget)
    assert [r.total for r in got.rewards] == [b.total for b in local]
    assert [r.parts["stop"] for r in got.rewards] == [1.0, -1.0]


def test_the_local_trainer_passes_every_part_its_inputs(tmp_path, monkeypatch, minilm) -> None:
    """A real step of the smoke preset (tiny random model, sample corpus) with all four parts chosen from the
    environment: the trainer hands them the retriever's query encoder, naive RAG's answers and the gold pages."""
    from typer.testing import CliRunner

    from routerag.cli import app

    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROUTERAG_TRAIN__REWARD_OVERRIDES", json.dumps(
        {"duplicate_weight": 0.5, "gain_beyond_rag_weight": 0.5, "stop_weight": 0.2, "retrieval": "support"}))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "--stage", "1", "--engine", "local", "--model", "tiny-random", "--out",
                                   str(out), "--steps", "1"])
    assert res.exit_code == 0, res.output
    [row] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    parts = row["reward_parts"]
    assert {"duplicate", "gain_beyond_rag", "stop", "retrieval_outcome"} <= set(parts)
    assert 0 <= parts["duplicate"] <= 1 + 1e-6 and -1 <= parts["gain_beyond_rag"] <= 1 and -1 <= parts["stop"] <= 1
    assert 0 <= parts["retrieval_outcome"] <= 1
