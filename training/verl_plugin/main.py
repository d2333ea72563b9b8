"""Entry point for ``routerag train --engine verl``: verl's own ``run_ppo`` with a task runner that swaps in
:class:`~training.verl_plugin.trainer.RouteRAGTrainerSync` for the batch-level stage-2 reward. Everything else is
upstream verl, configured by ``config/routerag_grpo.yaml`` and command-line overrides."""

from __future__ import annotations

import hydra
import ray
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo


@ray.remote
class RouteRAGTaskRunner(TaskRunnerV1.__ray_actor_class__):  # type: ignore[name-defined,misc]
    def run(self, config):  # noqa: ANN001, ANN201
        import verl.trainer.ppo.v1.trainer_base as base

        from training.verl_plugin.trainer import RouteRAGTrainerSync

        base.TRAINER_REGISTRY["sync"] = RouteRAGTrainerSync  # keep the name "sync": verl compares it in many places
        return super().run(config)


@hydra.main(config_path="config", config_name="routerag_grpo", version_base=None)
def main(config):  # noqa: ANN001, ANN201
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=RouteRAGTaskRunner)


if __name__ == "__main__":
    main()
