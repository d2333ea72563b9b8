"""The reward function verl calls for each finished rollout (``reward.custom_reward_function``).

It scores the rollout summary the agent loop left in ``extra_info["rollout"]`` with our reward library. Per rollout
it returns the stage-1 reward (correctness); RouteRAG's stage-2 time efficiency depends on the whole batch and is
applied by :mod:`.trainer`, which reads the ``em`` and ``retrieval_ms`` returned here.
"""

from __future__ import annotations

from typing import Any

from routerag.policy.answering import extract_answer
from training.rewards import RewardConfig, Rollout, batch_rewards


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  preset: str = "routerag-stage1", **kwargs: Any) -> dict[str, float]:
    extra = extra_info or {}
    if "rollout" in extra:
        rollout = Rollout.from_json(extra["rollout"])
    else:  # a rollout from another agent loop: read the answer from the text
        rollout = Rollout(answer=extract_answer(solution_str) if "<answer>" in solution_str.lower() else None)
    golds = ground_truth.get("target", []) if isinstance(ground_truth, dict) else ground_truth
    if isinstance(golds, str):
        golds = [golds]
    [b] = batch_rewards([rollout], [list(golds)], RewardConfig.preset(preset))
    return {"score": b.total, "em": b.parts["em"], "searches": float(rollout.searches),
            "retrieval_ms": float(rollout.retrieval_ms), "format_ok": float(rollout.format_ok)}
