"""The reward function verl calls for each finished rollout (``reward.custom_reward_function``).

It scores the rollout summary the agent loop left in ``extra_info["rollout"]`` with our reward library. Per rollout
it returns the stage-1 reward (correctness); RouteRAG's stage-2 time efficiency depends on the whole batch and is
applied by :mod:`.trainer` (through :mod:`.stage2`), which rescores the same rollout summaries batch-wide.
"""

from __future__ import annotations

import json
from typing import Any

from routerag.policy.answering import extract_answer
from training.rewards import RewardConfig, Rollout, batch_rewards


def gold_answers(ground_truth: Any) -> list[str]:
    """The gold answers of a verl row's ``reward_model.ground_truth``: ``{"target": [...]}`` (what ``routerag
    prepare-data`` writes), a list, or one string."""
    golds = ground_truth.get("target", []) if isinstance(ground_truth, dict) else ground_truth
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def supporting_titles(extra_info: dict[str, Any]) -> list[str]:
    """The gold supporting titles of a verl row's ``extra_info`` (``routerag prepare-data`` writes them as JSON)."""
    titles = extra_info.get("supporting_titles") or []
    return [str(t) for t in (json.loads(titles) if isinstance(titles, str) else titles)]


def reward_config(preset: str, overrides: str | dict[str, Any] | None) -> RewardConfig:
    """``preset`` with ``train.reward_overrides`` (JSON, as the launcher passes it) laid over it."""
    return RewardConfig.preset(preset, json.loads(overrides) if isinstance(overrides, str) else overrides)


def reward_inputs(cfg: RewardConfig, embedder: str | dict[str, Any] | None, budget: int | None) -> dict[str, Any]:
    """What ``cfg``'s parts need beyond the rollouts, which carry their question, gold titles and naive-RAG answer
    (the agent loop records them): the query encoder (built once per worker) and the loop's budget."""
    out: dict[str, Any] = {} if budget is None else {"budget": int(budget)}
    if "embed" in cfg.needs():
        if not embedder:
            raise ValueError("the duplicate-query penalty needs the launcher's embedder settings")
        from graph_index.config import EmbedderConfig
        from graph_index.embedders import make_embedder

        fields = json.loads(embedder) if isinstance(embedder, str) else embedder
        out["embed"] = make_embedder(EmbedderConfig.model_validate(fields)).encode_queries
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  preset: str = "routerag-stage1", overrides: str | dict[str, Any] | None = None,
                  embedder: str | dict[str, Any] | None = None, budget: int | None = None,
                  **kwargs: Any) -> dict[str, float]:
    extra = extra_info or {}
    if "rollout" in extra:
        rollout = Rollout.from_json(extra["rollout"])
    else:  # a rollout from another agent loop: read the answer from the text
        rollout = Rollout(answer=extract_answer(solution_str) if "<answer>" in solution_str.lower() else None)
    rollout.question = rollout.question or extra.get("question")
    rollout.gold_titles = rollout.gold_titles or supporting_titles(extra)
    cfg = reward_config(preset, overrides)
    [b] = batch_rewards([rollout], [gold_answers(ground_truth)], cfg, **reward_inputs(cfg, embedder, budget))
    return {"score": b.total, "em": b.parts["em"], "searches": float(rollout.searches),
            "retrieval_ms": float(rollout.retrieval_ms), "format_ok": float(rollout.format_ok)}
