"""The reward function verl calls for each finished rollout (``reward.custom_reward_function``).

It scores the rollout summary the agent loop left in ``extra_info["rollout"]`` with our reward library. Per rollout
it returns the stage-1 reward (correctness); RouteRAG's stage-2 time efficiency depends on the whole batch and is
applied by :mod:`.trainer` (through :mod:`.stage2`), which rescores the same rollout summaries batch-wide.
"""

from __future__ import annotations

from typing import Any

from routerag.policy.answering import extract_answer
from training.rewards import RewardConfig, Rollout, batch_rewards


def gold_answers(ground_truth: Any) -> list[str]:
    """The gold answers of a verl row's ``reward_model.ground_truth``: ``{"target": [...]}`` (what ``routerag
    prepare-data`` writes), a list, or one string."""
    golds = ground_truth.get("target", []) if isinstance(ground_truth, dict) else ground_truth
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  preset: str = "routerag-stage1", **kwargs: Any) -> dict[str, float]:
    extra = extra_info or {}
    if "rollout" in extra:
        rollout = Rollout.from_json(extra["rollout"])
    else:  # a rollout from another agent loop: read the answer from the text
        rollout = Rollout(answer=extract_answer(solution_str) if "<answer>" in solution_str.lower() else None)
    [b] = batch_rewards([rollout], [gold_answers(ground_truth)], RewardConfig.preset(preset))
    return {"score": b.total, "em": b.parts["em"], "searches": float(rollout.searches),
            "retrieval_ms": float(rollout.retrieval_ms), "format_ok": float(rollout.format_ok)}
