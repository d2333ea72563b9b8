"""RouteRAG's stage 2 inside verl 0.9.1's synchronous V1 trainer.

verl's ``main_ppo`` runs the V1 trainer (``trainer.use_v1``, on by default) and picks its class by name:
``get_trainer_cls(config.trainer.v1.trainer_mode)`` looks ``TRAINER_REGISTRY`` up. The name must stay ``sync``,
because verl's base trainer branches on ``self.trainer_mode == "sync"`` (replay buffer, refills, checkpoints), and
``register_trainer`` refuses to re-register a taken name, so :func:`install` puts :class:`RouteRAGTrainerSync` under
``sync`` directly (``main.py`` does so inside the Ray task runner, the process that looks the class up).

The subclass overrides the one step that sees the whole batch's rewards before GRPO uses them,
``PPOTrainer._compute_advantage(batch: KVBatchMeta, metrics)``: after ``routerag.switch_step`` it rewrites the batch's
``rm_scores`` in TransferQueue with the stage-2 reward (:func:`.stage2.stage2_scores`), then lets verl compute the
advantages as usual.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from .stage2 import GROUND_TRUTH_KEY, ROLLOUT_KEY, Stage2Scores, stage2_scores

TRAINER_MODE = "sync"
STAGE2_FIELDS = ["responses", "response_mask", "extra_fields", GROUND_TRUTH_KEY]
"""What the stage-2 reward reads from TransferQueue for each trajectory."""


class RouteRAGTrainerSync(PPOTrainerSync):
    """verl's synchronous V1 trainer with RouteRAG's stage-2 reward from ``routerag.switch_step`` on."""

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict[str, Any]) -> KVBatchMeta:
        routerag = self.config.routerag
        if self.global_steps > int(routerag.switch_step):
            result = rewrite_stage2_rewards(batch, str(routerag.stage2_reward), overrides=routerag.get("reward_overrides"),
                                            embedder=routerag.get("embedder"), budget=routerag.get("budget"))
            metrics.update(result.metrics())
        return super()._compute_advantage(batch, metrics)


def rewrite_stage2_rewards(batch: KVBatchMeta, preset: str, **reward: Any) -> Stage2Scores:
    """Replace the ``rm_scores`` of the batch's real trajectories in TransferQueue with the batch-level reward
    ``preset`` (``reward``: :func:`.stage2.stage2_scores`'s overrides, embedder and budget). Padding rows (verl's upsampling, tagged ``is_padding``) copy another row's fields, so they are
    left out of the batch statistics and keep their zero scores."""
    keys = [k for k, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
    fields = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=STAGE2_FIELDS)
    result = stage2_scores(trajectories_as_dataproto(fields), preset, **reward)
    rm_scores = response_to_nested(result.token_scores, fields["response_mask"])
    tq.kv_batch_put(keys=keys, partition_id=batch.partition_id,
                    fields=TensorDict({"rm_scores": rm_scores}, batch_size=len(keys)))
    return result


def trajectories_as_dataproto(fields: TensorDict) -> DataProto:
    """TransferQueue rows (nested, one per trajectory) as the padded DataProto :func:`.stage2.stage2_scores` reads,
    laid out like verl's agent-loop output: right-padded responses, their attention mask, and the rollout summary
    and ground truth as object columns."""
    lengths = fields["response_mask"].offsets().diff()
    responses = fields["responses"].to_padded_tensor(0)
    positions = torch.arange(responses.shape[-1]).unsqueeze(0)
    attention = (positions < lengths.unsqueeze(1)).long()
    extras = list(fields["extra_fields"])
    return DataProto.from_dict(
        tensors={"responses": responses, "attention_mask": attention},
        non_tensors={ROLLOUT_KEY: _objects([e[ROLLOUT_KEY] for e in extras]),
                     GROUND_TRUTH_KEY: _objects(list(fields[GROUND_TRUTH_KEY]))})


def _objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def install() -> None:
    """Make ``get_trainer_cls("sync")`` return :class:`RouteRAGTrainerSync` in this process."""
    trainer_base.TRAINER_REGISTRY[TRAINER_MODE] = RouteRAGTrainerSync
