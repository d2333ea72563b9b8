"""Build the verl command for RouteRAG's recipe from :class:`~routerag.config.TrainConfig` (no verl import needed, so
``--dry-run`` works anywhere).

Recipe (RouteRAG): Qwen2.5-3B/7B-Instruct, temperature 1, batch 256 questions × 5 rollouts, mini-batch 128
trajectories, lr 1e-6, KL 0.001 (low-variance), max 4 searches, top-3 documents, FSDP with offload, vLLM rollout
with tensor parallelism 1 and 60% GPU memory, 40 steps with the stage switch at step 20.

Every override names a key of verl 0.9.1's own config (``verl/trainer/config/ppo_trainer.yaml``) except the two that
verl lacks and our code reads (``+…reward_kwargs.preset`` and the ``routerag`` section of our base config), so Hydra
refuses a misspelt key instead of ignoring it; ``tests/test_verl_launch.py`` composes the whole launch against verl's
config. String values are quoted for Hydra's override grammar and the agent-loop file is written with a YAML
library, so paths with quotes, commas or spaces arrive intact.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from graph_index.config import EmbedderConfig
from routerag.config import Loop, RetrievalConfig, TrainConfig
from training.rewards import RewardConfig

PLUGIN_DIR = Path(__file__).resolve().parent
AGENT_NAME = "routerag_agent"
AGENT_LOOP_TARGET = "training.verl_plugin.agent_loop.RouteRAGAgentLoop"
FACT_FILTER_KEY_ENV = "ROUTERAG_RETRIEVAL__FACT_FILTER_API_KEY"
"""Where in-process retrieval's fact filter finds its API key (the same variable ``Settings`` reads); the key itself
is never written into the launch files."""


def mini_batch_prompts(train_batch: int, trajectories: int, rollouts: int) -> int:
    """verl counts mini-batches in prompts (× rollouts inside); RouteRAG counted trajectories. The smallest divisor of
    the batch that covers ``trajectories`` (128 trajectories of 5 rollouts → 32 prompts = 160 trajectories)."""
    need = -(-trajectories // rollouts)
    for d in range(need, train_batch + 1):
        if train_batch % d == 0:
            return d
    return train_batch


# -- values in Hydra's override grammar and in OmegaConf-loaded YAML ------------------------------------------------

def _no_interpolation(text: str) -> str:
    """OmegaConf resolves ``${…}`` inside strings (verl's Hydra config and its agent-loop YAML both go through it);
    ``\\${`` keeps a literal dollar-brace, e.g. in a path."""
    return text.replace("${", "\\${")


def hydra_string(text: str) -> str:
    """A single-quoted Hydra override string: any character survives (commas, spaces, ``=``, brackets, quotes).
    Hydra's grammar: a quote inside is escaped with a backslash, and backslashes that precede a quote (or the
    closing quote) are doubled; other backslashes stay as they are."""
    text = _no_interpolation(text)
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    trailing = len(text) - len(text.rstrip("\\"))  # these precede the closing quote
    return "'" + body + "\\" * trailing + "'"


_BARE = re.compile(r"[A-Za-z0-9_/+.%@-]+")
_NON_STRINGS = {"true", "false", "null", "inf", "+inf", "-inf", "nan", "+nan", "-nan"}


def _reads_as_string(text: str) -> bool:
    """Whether Hydra reads ``text`` unquoted as this very string: only path-like characters, and not something
    Hydra would take for a number, a boolean or null (when unsure, the caller quotes)."""
    if not _BARE.fullmatch(text) or text.lower() in _NON_STRINGS:
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False


def hydra_value(value: Any) -> str:
    """A Python value as a Hydra override value: numbers and booleans bare, strings bare when they read back as the
    same string (``Qwen/Qwen2.5-7B-Instruct``) and quoted otherwise, lists element-wise."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, (str, Path)):
        text = str(value)
        return text if _reads_as_string(text) else hydra_string(text)
    raise TypeError(f"no Hydra override form for {type(value).__name__}")


def _yaml_safe(value: Any) -> Any:
    """Escape OmegaConf interpolation in every string of a YAML-bound structure."""
    if isinstance(value, str):
        return _no_interpolation(value)
    if isinstance(value, dict):
        return {k: _yaml_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_yaml_safe(v) for v in value]
    return value


# -- the agent-loop registration and the overrides ------------------------------------------------------------------

def agent_loop_config(cfg: TrainConfig, index_dir: str | None, retrieval: RetrievalConfig | None = None,
                      loop: Loop | None = None) -> list[dict[str, Any]]:
    """verl's agent-loop registry entry (``agent_loop_config_path``): verl instantiates ``_target_`` with these
    keys as keyword arguments. ``loop`` is the resolved loop settings (budget, k, token limits; None: ``cfg``'s over
    the defaults), passed whole, so the rollouts run the loop the local trainer and the server run. A remote
    retriever gets the *name* of the environment variable that holds its API key; in-process retrieval gets the
    user's retrieval settings (secrets excluded)."""
    v = cfg.verl
    entry: dict[str, Any] = {
        "name": AGENT_NAME,
        "_target_": AGENT_LOOP_TARGET,
        "loop": dict(loop if loop is not None else cfg.resolve()),
    }
    if v.retriever_url:
        entry["retriever_url"] = v.retriever_url
        entry["retriever_api_key_env"] = v.retriever_api_key_env
    elif index_dir:
        entry["index_dir"] = str(Path(index_dir).resolve())
        entry["retrieval"] = (retrieval or RetrievalConfig()).model_dump(mode="json",
                                                                         exclude={"fact_filter_api_key"})
        entry["fact_filter_api_key_env"] = FACT_FILTER_KEY_ENV
    else:
        raise ValueError("the verl engine needs an index (--index) or a retriever URL (train.verl.retriever_url)")
    stages = [RewardConfig.preset(name, cfg.reward_overrides) for name in (cfg.stage1_reward, cfg.stage2_reward)]
    if any("gain_beyond_rag" in c.needs() for c in stages):  # Gain Beyond RAG: the rollouts record naive RAG's answer
        entry["baseline"] = {"mode": (retrieval or RetrievalConfig()).mode, "k": entry["loop"]["k"]}
    return [entry]


def agent_loop_yaml(cfg: TrainConfig, index_dir: str | None, retrieval: RetrievalConfig | None = None,
                    loop: Loop | None = None) -> str:
    return yaml.safe_dump(_yaml_safe(agent_loop_config(cfg, index_dir, retrieval, loop)), sort_keys=False,
                          allow_unicode=True)


def recipe_overrides(cfg: TrainConfig, out: Path, agent_yaml: Path) -> dict[str, Any]:
    """Our recipe as verl config keys → values (a leading ``+`` adds a key verl's config does not have)."""
    v = cfg.verl
    if not v.train_files:
        raise ValueError("no training data: set train.verl.train_files (parquet from `routerag prepare-data`)")
    mini = mini_batch_prompts(v.train_batch_size, v.ppo_mini_batch_size, cfg.group_size)
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return {
        "routerag.switch_step": cfg.switch_step,
        "routerag.stage2_reward": cfg.stage2_reward,
        "data.train_files": [_data_path(f) for f in v.train_files],
        "data.val_files": [_data_path(f) for f in v.val_files or v.train_files[:1]],
        "data.train_batch_size": v.train_batch_size,
        "data.max_prompt_length": v.max_prompt_length,
        "data.max_response_length": v.max_response_length,
        "data.seed": cfg.seed,  # the shuffling of the training questions
        "actor_rollout_ref.model.path": v.model,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.model.use_remove_padding": True,
        f"{actor}.optim.lr": cfg.lr,
        f"{actor}.optim.clip_grad": cfg.max_grad_norm,  # what verl's engines read (actor.grad_clip is not used)
        f"{actor}.ppo_mini_batch_size": mini,
        f"{actor}.ppo_micro_batch_size_per_gpu": v.micro_batch_size_per_gpu,
        f"{actor}.ppo_epochs": cfg.ppo_epochs,
        # verl prefers clip_ratio_low/high (0.2 each by default) over clip_ratio: set all three
        f"{actor}.clip_ratio": cfg.clip,
        f"{actor}.clip_ratio_low": cfg.clip,
        f"{actor}.clip_ratio_high": cfg.clip,
        f"{actor}.use_kl_loss": True,
        f"{actor}.kl_loss_coef": cfg.kl_coef,
        f"{actor}.kl_loss_type": "low_var_kl",
        f"{actor}.loss_agg_mode": "token-mean",
        f"{actor}.data_loader_seed": cfg.seed,
        f"{actor}.fsdp_config.param_offload": v.offload,
        f"{actor}.fsdp_config.optimizer_offload": v.offload,
        "actor_rollout_ref.ref.fsdp_config.param_offload": v.offload,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": v.micro_batch_size_per_gpu,
        f"{rollout}.name": "vllm",
        f"{rollout}.mode": "async",
        f"{rollout}.tensor_model_parallel_size": v.tensor_parallel_size,
        f"{rollout}.gpu_memory_utilization": v.gpu_memory_utilization,
        f"{rollout}.n": cfg.group_size,
        f"{rollout}.temperature": cfg.temperature,
        f"{rollout}.seed": cfg.seed,
        f"{rollout}.log_prob_micro_batch_size_per_gpu": v.micro_batch_size_per_gpu,
        f"{rollout}.calculate_log_probs": True,
        f"{rollout}.val_kwargs.temperature": 0,
        f"{rollout}.val_kwargs.do_sample": False,
        f"{rollout}.agent.default_agent_loop": AGENT_NAME,
        f"{rollout}.agent.agent_loop_config_path": str(agent_yaml.resolve()),
        "reward.custom_reward_function.path": str((PLUGIN_DIR / "reward.py").resolve()),
        "reward.custom_reward_function.name": "compute_score",
        "+reward.custom_reward_function.reward_kwargs.preset": cfg.stage1_reward,
        "trainer.n_gpus_per_node": v.gpus_per_node,
        "trainer.nnodes": v.nodes,
        "trainer.total_training_steps": cfg.steps,
        "trainer.save_freq": cfg.save_every,
        "trainer.test_freq": cfg.save_every,
        "trainer.val_before_train": False,
        "trainer.default_local_dir": str((out / "checkpoints").resolve()),
        "trainer.resume_mode": "auto",
        "trainer.logger": list(v.logger),
        "trainer.project_name": "routerag",
        "trainer.experiment_name": out.name,
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": "sync",  # main.py puts RouteRAGTrainerSync under this name
    }


def _data_path(path: str) -> str:
    """A local data file as an absolute path (verl's dataset and Ray workers need not share the launcher's working
    directory); remote ones (``hdfs://…``) as given."""
    return path if "://" in path else str(Path(path).expanduser().resolve())


def reward_part_overrides(cfg: TrainConfig, loop: Loop, embedder: EmbedderConfig | None) -> dict[str, Any]:
    """``train.reward_overrides`` for verl's per-rollout reward function and for the stage-2 rescoring, with what
    the chosen parts read there: the loop's budget (the stop reward) and the query encoder's settings (the
    duplicate-query penalty; secrets are left out: an OpenAI-compatible embedder reads its key from its
    environment variable). None without overrides: the presets alone need neither."""
    if not cfg.reward_overrides:
        return {}
    overrides = json.dumps(cfg.reward_overrides, sort_keys=True)
    stages = [RewardConfig.preset(name, cfg.reward_overrides) for name in (cfg.stage1_reward, cfg.stage2_reward)]
    fn = "+reward.custom_reward_function.reward_kwargs"
    pairs: dict[str, Any] = {f"{fn}.overrides": overrides, "routerag.reward_overrides": overrides,
                             f"{fn}.budget": loop.budget, "routerag.budget": loop.budget}
    if any("embed" in c.needs() for c in stages):
        fields = json.dumps((embedder or EmbedderConfig()).model_dump(mode="json", exclude={"api_key"}))
        pairs.update({f"{fn}.embedder": fields, "routerag.embedder": fields})
    return pairs


def build_overrides(cfg: TrainConfig, out: Path, agent_yaml: Path, loop: Loop | None = None,
                    embedder: EmbedderConfig | None = None) -> list[str]:
    """``key=value`` strings in Hydra's grammar, then the user's ``train.verl.extra_overrides`` verbatim."""
    pairs = recipe_overrides(cfg, out, agent_yaml)
    pairs.update(reward_part_overrides(cfg, loop if loop is not None else cfg.resolve(), embedder))
    return [f"{key}={hydra_value(value)}" for key, value in pairs.items()] + list(cfg.verl.extra_overrides)


def prepare_launch(cfg: TrainConfig, out: str | Path, *, index_dir: str | None,
                   retrieval: RetrievalConfig | None = None, loop: Loop | None = None,
                   embedder: EmbedderConfig | None = None) -> dict[str, Any]:
    """Write the agent-loop YAML into OUT and return the command and the overrides.
    ``retrieval`` is the user's ``Settings.retrieval`` (in-process retrieval uses it; None: the defaults); ``loop``
    the resolved loop settings (:func:`routerag.policy.card.training_policy`); ``embedder`` the query encoder's
    settings (the duplicate-query penalty)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    agent_yaml = out / "agent_loops.yaml"
    agent_yaml.write_text(agent_loop_yaml(cfg, index_dir, retrieval, loop), encoding="utf-8")
    overrides = build_overrides(cfg, out, agent_yaml, loop, embedder)
    # the installed package is found by module name, here and in verl's Ray workers: no PYTHONPATH needed
    cmd = [sys.executable, "-m", "training.verl_plugin.main", *overrides]
    return {"command": cmd, "agent_loops_yaml": str(agent_yaml),
            "config_yaml": str(PLUGIN_DIR / "config" / "routerag_grpo.yaml"), "overrides": overrides,
            "shell": " ".join(shlex.quote(c) for c in cmd)}
