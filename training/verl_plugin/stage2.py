"""RouteRAG's stage-2 reward over a verl :class:`~verl.protocol.DataProto`: a pure function, so the trainer hook that
applies it stays a thin adapter and the reward itself can be checked on CPU against the local trainer's.

The reward needs the whole batch (the 95th percentile and the mean of the rollouts' retrieval times), which none of
verl's per-rollout reward hooks sees. It is computed by the same library call as the local trainer's
(:func:`training.rewards.batch_rewards` with the stage-2 preset) from the rollout summaries our agent loop left in
each row and the gold answers of the dataset row, and it is placed where verl places an outcome reward: on the last
token of the response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from verl.protocol import DataProto

from training.rewards import RewardBreakdown, Rollout, batch_rewards

from .reward import gold_answers, reward_config, reward_inputs

ROLLOUT_KEY = "rollout"
"""The non-tensor column with each row's :class:`~training.rewards.Rollout` (the agent loop's ``extra_fields``)."""
GROUND_TRUTH_KEY = "reward_model"
"""verl's dataset column with ``{"ground_truth": …}``."""


@dataclass(slots=True)
class Stage2Scores:
    token_scores: torch.Tensor
    """(batch, response width) float32: each row's stage-2 reward on its last response token, 0 elsewhere."""
    rewards: list[RewardBreakdown]

    def metrics(self) -> dict[str, float]:
        n = max(len(self.rewards), 1)
        return {"routerag/stage2_reward_mean": sum(r.total for r in self.rewards) / n,
                "routerag/em_mean": sum(r.parts["em"] for r in self.rewards) / n,
                "routerag/retrieval_ms_mean": sum(r.parts["retrieval_ms"] for r in self.rewards) / n}


def response_lengths(data: DataProto) -> torch.Tensor:
    """Valid response length per row: the response part of ``attention_mask`` (responses are right-padded), as
    verl's agent-loop postprocessing counts it when it places ``rm_scores``."""
    width = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -width:].sum(dim=-1).long()


def stage2_scores(data: DataProto, preset: str = "routerag-stage2", *, overrides: str | dict[str, Any] | None = None,
                  embedder: str | dict[str, Any] | None = None, budget: int | None = None,
                  **reward_kwargs: Any) -> Stage2Scores:
    """Score every row of ``data`` with the batch-level reward ``preset`` (``overrides`` laid over it, the reward
    parts' inputs as :func:`.reward.reward_inputs` builds them).

    ``data`` needs ``batch["responses"]`` and ``batch["attention_mask"]`` (at least over the responses) and the
    non-tensor columns ``rollout`` and ``reward_model``. ``reward_kwargs`` go to ``batch_rewards`` (e.g. a cost
    table for the table-priced presets)."""
    rollouts = [Rollout.from_json(r) for r in data.non_tensor_batch[ROLLOUT_KEY]]
    golds = [gold_answers(rm["ground_truth"]) for rm in data.non_tensor_batch[GROUND_TRUTH_KEY]]
    cfg = reward_config(preset, overrides)
    rewards = batch_rewards(rollouts, golds, cfg, **{**reward_inputs(cfg, embedder, budget), **reward_kwargs})
    return Stage2Scores(place_on_last_token([r.total for r in rewards], response_lengths(data),
                                            data.batch["responses"].shape[-1]), rewards)


def place_on_last_token(totals: Sequence[float], lengths: torch.Tensor, width: int) -> torch.Tensor:
    """A (rows, width) tensor with ``totals[i]`` at position ``lengths[i] - 1`` (position 0 for an empty response,
    which verl would score there too)."""
    scores = torch.zeros((len(totals), width), dtype=torch.float32)
    rows = torch.arange(len(totals))
    scores[rows, (lengths - 1).clamp(min=0)] = torch.tensor(list(totals), dtype=torch.float32)
    return scores

