"""Entry point for ``routerag train --engine verl``: verl's own ``main_ppo`` path (config validation, ``run_ppo``,
the V1 task runner) with one change, made in the Ray task runner where verl looks the trainer class up:
``trainer.v1.trainer_mode=sync`` resolves to :class:`~training.verl_plugin.trainer.RouteRAGTrainerSync`. Everything
else is upstream verl, configured by ``config/routerag_grpo.yaml`` and command-line overrides."""

from __future__ import annotations

import hydra
import ray
from omegaconf import DictConfig
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from training.verl_plugin.trainer import TRAINER_MODE, install


@ray.remote
class RouteRAGTaskRunner(TaskRunnerV1.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """verl's V1 task runner; the trainer registry is per process, so the swap happens here, not in the driver."""

    def run(self, config: DictConfig) -> None:
        install()
        return super().run(config)


def check_trainer_mode(config: DictConfig) -> None:
    """Stage 2 lives in the synchronous V1 trainer only: refuse a launch that would silently train without it."""
    if not config.trainer.use_v1 or config.trainer.v1.trainer_mode != TRAINER_MODE:
        raise ValueError(f"RouteRAG's verl engine needs trainer.use_v1=True and trainer.v1.trainer_mode={TRAINER_MODE}"
                         f" (got use_v1={config.trainer.use_v1}, trainer_mode={config.trainer.v1.trainer_mode})")


@hydra.main(config_path="config", config_name="routerag_grpo", version_base=None)
def main(config: DictConfig) -> None:
    check_trainer_mode(config)
    auto_set_device(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=RouteRAGTaskRunner)


if __name__ == "__main__":
    main()
