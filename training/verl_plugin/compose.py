"""A launch's configuration as verl's entry point will see it: the overrides composed in-process against our base
config (``config/routerag_grpo.yaml``, which extends verl's own ``ppo_trainer``) with Hydra's compose API, then
verl's own validation. It checks a launch without GPUs: Hydra refuses an override whose key verl lacks, and verl's
config dataclasses refuse values they cannot take."""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from .launch import PLUGIN_DIR

CONFIG_DIR = PLUGIN_DIR / "config"
CONFIG_NAME = "routerag_grpo"


def compose_launch(overrides: Sequence[str]) -> DictConfig:
    """The config ``python -m training.verl_plugin.main OVERRIDES…`` starts from (before verl resolves it)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None, job_name="routerag"):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def validate_launch(config: DictConfig) -> None:
    """What ``main.py`` checks before it starts Ray, plus the conversions verl's workers make of the actor and rollout
    sections (dataclass validation: batch sizes, clip ratios, sampling, agent loop). The model section is converted
    by the workers too, but that loads the model's files, so it is left to the agent-loop checks."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from .main import check_trainer_mode

    check_trainer_mode(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    for section in ("actor", "rollout"):
        omega_conf_to_dataclass(config.actor_rollout_ref[section])
