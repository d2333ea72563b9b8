"""RouteRAG's stage-2 reward needs the whole batch (its 95th percentile and mean of retrieval time), which no verl
plug-in point sees: reward functions and managers get one rollout at a time. This subclass of verl's synchronous V1
trainer rewrites the batch's rewards just before GRPO computes advantages, after ``switch_step``.

Written against verl 0.9.1 (``verl/trainer/ppo/v1/trainer_base.py``); it needs the ``transfer_queue`` package that
``verl[vllm]`` brings, and has not been exercised here (no GPU machine): run the 2-step smoke recipe in
docs/training.md before a long run.
"""

from __future__ import annotations

from typing import Any

import torch

from training.rewards import routerag_time_efficiency

try:  # only inside a verl installation
    from verl.trainer.ppo.v1.trainer_base import PPOTrainerSync
except ImportError as exc:  # pragma: no cover
    raise ImportError("training.verl_plugin.trainer needs verl[vllm] (transfer_queue)") from exc


class RouteRAGTrainerSync(PPOTrainerSync):
    def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        switch = int(self.config.get("routerag", {}).get("switch_step", 20))
        if self.global_steps > switch:
            self._apply_time_efficiency(batch, metrics)
        return super()._compute_advantage(batch, metrics)

    def _apply_time_efficiency(self, batch: Any, metrics: dict[str, Any]) -> None:
        import transfer_queue as tq
        from tensordict import TensorDict
        from verl.workers.utils.padding import response_to_nested

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["rm_scores", "response_mask", "extra_fields"])
        scores = data["rm_scores"]
        mask = data["response_mask"]
        extras = data["extra_fields"].tolist()
        live = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding")]
        em = [float(extras[i].get("reward_extra_info", {}).get("em", scores[i].sum().item())) for i in live]
        times = [float(extras[i].get("retrieval_ms", 0.0)) for i in live]
        new = routerag_time_efficiency(em, times)
        dense = torch.zeros_like(scores.to_padded_tensor(0.0)) if scores.is_nested else torch.zeros_like(scores)
        for j, i in enumerate(live):
            last = int(mask[i].sum().item()) - 1
            dense[i, max(last, 0)] = new[j]
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({"rm_scores": response_to_nested(dense, mask)}, batch_size=len(batch)))
        metrics["routerag/stage2_reward_mean"] = sum(new) / max(len(new), 1)
        metrics["routerag/retrieval_ms_mean"] = sum(times) / max(len(times), 1)
