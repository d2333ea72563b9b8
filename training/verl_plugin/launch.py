"""Build the verl command for RouteRAG's recipe from :class:`~routerag.config.TrainConfig` (no verl import needed, so
``--dry-run`` works anywhere).

Recipe (RouteRAG): Qwen2.5-3B/7B-Instruct, temperature 1, batch 256 questions × 5 rollouts, mini-batch 128
trajectories, lr 1e-6, KL 0.001 (low-variance), max 4 searches, top-3 documents, FSDP with offload, vLLM rollout
with tensor parallelism 1 and 60% GPU memory, 40 steps with the stage switch at step 20.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from routerag.config import TrainConfig

PLUGIN_DIR = Path(__file__).resolve().parent
REPO_ROOT = PLUGIN_DIR.parents[1]


def mini_batch_prompts(train_batch: int, trajectories: int, rollouts: int) -> int:
    """verl counts mini-batches in prompts (× rollouts inside); RouteRAG counted trajectories. The smallest divisor of
    the batch that covers ``trajectories`` (128 trajectories of 5 rollouts → 32 prompts = 160 trajectories)."""
    need = -(-trajectories // rollouts)
    for d in range(need, train_batch + 1):
        if train_batch % d == 0:
            return d
    return train_batch


def agent_loop_yaml(cfg: TrainConfig, index_dir: str | None) -> str:
    v = cfg.verl
    lines = [
        "- name: routerag_agent",
        "  _target_: training.verl_plugin.agent_loop.RouteRAGAgentLoop",
        f"  budget: {cfg.budget}",
        f"  k: {cfg.k}",
        f"  max_turn_tokens: {cfg.max_turn_tokens}",
        f"  max_information_tokens: {cfg.max_information_tokens}",
    ]
    if v.retriever_url:
        lines.append(f"  retriever_url: {v.retriever_url}")
    elif index_dir:
        lines.append(f"  index_dir: {Path(index_dir).resolve()}")
    else:
        raise ValueError("the verl engine needs an index (--index) or a retriever URL (train.verl.retriever_url)")
    return "\n".join(lines) + "\n"


def build_overrides(cfg: TrainConfig, out: Path, agent_yaml: Path) -> list[str]:
    v = cfg.verl
    if not v.train_files:
        raise ValueError("no training data: set train.verl.train_files (parquet from `routerag prepare-data`)")
    mini = mini_batch_prompts(v.train_batch_size, v.ppo_mini_batch_size, cfg.group_size)
    lists = lambda xs: "[" + ",".join(f"'{x}'" for x in xs) + "]"  # noqa: E731
    o = [
        f"routerag.switch_step={cfg.switch_step}",
        f"data.train_files={lists(v.train_files)}",
        f"data.val_files={lists(v.val_files or v.train_files[:1])}",
        f"data.train_batch_size={v.train_batch_size}",
        f"data.max_prompt_length={v.max_prompt_length}",
        f"data.max_response_length={v.max_response_length}",
        f"actor_rollout_ref.model.path={v.model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        f"actor_rollout_ref.actor.optim.lr={cfg.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"actor_rollout_ref.actor.ppo_epochs={cfg.ppo_epochs}",
        f"actor_rollout_ref.actor.clip_ratio={cfg.clip}",
        f"actor_rollout_ref.actor.grad_clip={cfg.max_grad_norm}",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={cfg.kl_coef}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.fsdp_config.param_offload={v.offload}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={v.offload}",
        f"actor_rollout_ref.ref.fsdp_config.param_offload={v.offload}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={v.rollout_tp}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={v.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.n={cfg.group_size}",
        f"actor_rollout_ref.rollout.temperature={cfg.temperature}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
        "actor_rollout_ref.rollout.agent.default_agent_loop=routerag_agent",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_yaml.resolve()}",
        f"reward.custom_reward_function.path={(PLUGIN_DIR / 'reward.py').resolve()}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs.preset={cfg.stage1_reward}",
        f"trainer.n_gpus_per_node={v.gpus_per_node}",
        f"trainer.nnodes={v.nodes}",
        f"trainer.total_training_steps={cfg.steps}",
        f"trainer.save_freq={cfg.save_every}",
        f"trainer.test_freq={cfg.save_every}",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={(out / 'checkpoints').resolve()}",
        "trainer.resume_mode=auto",
        f"trainer.logger={lists(v.logger)}",
        "trainer.project_name=routerag",
        f"trainer.experiment_name={out.name}",
        "trainer.v1.trainer_mode=sync",
        f"trainer.seed={cfg.seed}",
    ]
    return o + list(v.extra_overrides)


def prepare_launch(cfg: TrainConfig, out: str | Path, *, index_dir: str | None) -> dict[str, Any]:
    """Write the agent-loop YAML into OUT and return the command, its environment and the overrides."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    agent_yaml = out / "agent_loops.yaml"
    agent_yaml.write_text(agent_loop_yaml(cfg, index_dir), encoding="utf-8")
    overrides = build_overrides(cfg, out, agent_yaml)
    cmd = [sys.executable, "-m", "training.verl_plugin.main", *overrides]
    env = {"PYTHONPATH": str(REPO_ROOT)}
    return {"command": cmd, "env": env, "agent_loops_yaml": str(agent_yaml),
            "config_yaml": str(PLUGIN_DIR / "config" / "routerag_grpo.yaml"), "overrides": overrides,
            "shell": " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " +
            " ".join(shlex.quote(c) for c in cmd)}
