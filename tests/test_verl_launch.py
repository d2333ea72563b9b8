"""The verl launch against verl's own configuration: the command ``routerag train --engine verl --dry-run`` prints
must compose with Hydra against verl 0.9.1's ``ppo_trainer`` config (every override, as printed) and pass verl's own
validation; values must arrive intact whatever characters they hold; the agent-loop file must carry the user's
retrieval settings and name the API key's environment variable, never the key."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from typer.testing import CliRunner

from routerag.cli import app
from routerag.config import RetrievalConfig, TrainConfig
from training.verl_plugin.compose import compose_launch, validate_launch
from training.verl_plugin.launch import hydra_value, prepare_launch

ENTRY = "training.verl_plugin.main"


def _dry_run(args: list[str]) -> tuple[str, list[str]]:
    """Run the CLI's dry run; return its output and the overrides of the command it printed."""
    res = CliRunner().invoke(app, ["train", "--stage", "2", "--engine", "verl", *args, "--dry-run"])
    assert res.exit_code == 0, res.output
    [line] = [ln for ln in res.output.splitlines() if f" -m {ENTRY} " in ln]
    argv = shlex.split(line)
    return res.output, argv[argv.index(ENTRY) + 1:]


def test_the_printed_launch_composes_against_verls_config_and_passes_its_validation(tmp_path: Path) -> None:
    out = tmp_path / "run"
    questions = "../shared/data/hotpotqa_rl/train.parquet"
    printed, overrides = _dry_run(["--nodes", "1", "--gpus-per-node", "8", "--questions", questions,
                                   "--index", str(tmp_path), "--out", str(out)])
    assert overrides == prepare_launch(TrainConfig(engine="verl", verl={"train_files": [questions]}), out,
                                       index_dir=str(tmp_path))["overrides"]  # the CLI prints what the launcher builds
    cfg = compose_launch(overrides)  # raises on any key verl's config lacks (Hydra: "Could not override ...")
    validate_launch(cfg)
    # the recipe arrived where verl reads it
    assert list(cfg.data.train_files) == [str(Path(questions).resolve())] and cfg.data.train_batch_size == 256
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (actor.ppo_mini_batch_size, rollout.n, actor.optim.lr, actor.kl_loss_coef) == (32, 5, 1e-6, 0.001)
    assert actor.clip_ratio_low == actor.clip_ratio_high == 0.2 and actor.optim.clip_grad == 1.0
    assert (rollout.name, rollout.tensor_model_parallel_size, rollout.gpu_memory_utilization) == ("vllm", 1, 0.6)
    assert rollout.agent.default_agent_loop == "routerag_agent"
    assert rollout.agent.agent_loop_config_path == str((out / "agent_loops.yaml").resolve())
    assert (cfg.data.seed, actor.data_loader_seed, rollout.seed) == (0, 0, 0)
    assert cfg.trainer.total_training_steps == 40 and cfg.routerag.switch_step == 20
    assert cfg.reward.custom_reward_function.reward_kwargs.preset == "routerag-stage1"
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "sync"
    assert "budget: 4" in printed and "k: 3" in printed


def test_added_keys_are_exactly_those_verl_lacks(tmp_path: Path) -> None:
    """``+key=`` only where verl's config has no such key (else Hydra would refuse it); plain keys all exist in
    verl's own ppo_trainer config, except the ``routerag`` section, which our base config adds and our code reads."""
    cfg = TrainConfig(engine="verl", verl={"train_files": ["train.parquet"]})
    overrides = prepare_launch(cfg, tmp_path / "run", index_dir=str(tmp_path))["overrides"]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        verl_cfg = compose(config_name="ppo_trainer")
    for o in overrides:
        key = o.split("=", 1)[0]
        parent, _, leaf = key.lstrip("+").rpartition(".")
        node = OmegaConf.select(verl_cfg, parent, default=None)
        in_verl = node is not None and leaf in node.keys()  # keys(): a mandatory ??? value still counts
        if key.startswith("+"):
            assert not in_verl, f"{key} exists in verl's config: drop the +"
        elif key.startswith("routerag."):
            assert not in_verl
        else:
            assert in_verl, f"{key} is not a key of verl 0.9.1's config"


AWKWARD = ["/data/it's here/train.parquet", "/data/a,b/[x] {y}: z=1.parquet", "  spaced  ", "C:\\data\\", "\\'",
           "trailing\\\\", "${HOME}/x", "007", "1e3", "true", "null", "nan", "Qwen/Qwen2.5-7B-Instruct", "", "ü/δ",
           "1.2.3", "-x", "+1", "a*b?c|d"]


def test_hydra_values_survive_the_override_grammar() -> None:
    """Quotes, commas, spaces, brackets, backslashes before quotes, ``${…}`` and number-like strings, as list items
    and as plain values (keys added under ``routerag`` so one composition checks them all)."""
    cfg = compose_launch([f"data.train_files={hydra_value(AWKWARD)}",
                          *(f"+routerag.probe_{i}={hydra_value(t)}" for i, t in enumerate(AWKWARD))])
    assert list(cfg.data.train_files) == AWKWARD
    assert [cfg.routerag[f"probe_{i}"] for i in range(len(AWKWARD))] == AWKWARD


def test_awkward_paths_reach_verl_and_the_agent_loop_file(tmp_path: Path) -> None:
    out = tmp_path / "it's a run, [v1]"
    index = tmp_path / "my index ${USER}, 'quoted'"
    files = [str(tmp_path / "q's, 1.parquet"), str(tmp_path / "q 2.parquet")]
    cfg = TrainConfig(engine="verl", verl={"train_files": files, "model": str(tmp_path / "models/sft 7b")})
    plan = prepare_launch(cfg, out, index_dir=str(index))
    composed = compose_launch(plan["overrides"])
    assert list(composed.data.train_files) == files and list(composed.data.val_files) == files[:1]
    assert composed.trainer.default_local_dir == str((out / "checkpoints").resolve())
    assert composed.trainer.experiment_name == out.name
    assert composed.actor_rollout_ref.model.path == str(tmp_path / "models/sft 7b")
    assert composed.actor_rollout_ref.rollout.agent.agent_loop_config_path == plan["agent_loops_yaml"]
    # verl reads the agent-loop file with OmegaConf (which resolves ${...}) and instantiates it with Hydra
    [entry] = OmegaConf.load(plan["agent_loops_yaml"])
    assert entry.index_dir == str(index.resolve())
    assert shlex.split(plan["shell"])[-len(plan["overrides"]):] == plan["overrides"]  # the shell line round-trips


def test_retrieval_settings_reach_the_agent_loop_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTERAG_RETRIEVAL__FACT_TOP_K", "7")
    monkeypatch.setenv("ROUTERAG_RETRIEVAL__RRF_K", "30")
    monkeypatch.setenv("ROUTERAG_RETRIEVAL__FACT_FILTER", "true")
    monkeypatch.setenv("ROUTERAG_RETRIEVAL__FACT_FILTER_BASE_URL", "http://llm:8001/v1")
    monkeypatch.setenv("ROUTERAG_RETRIEVAL__FACT_FILTER_MODEL", "filter")
    monkeypatch.setenv("ROUTERAG_RETRIEVAL__FACT_FILTER_API_KEY", "filter-secret-123")
    printed, _ = _dry_run(["--questions", "train.parquet", "--index", str(tmp_path), "--out", str(tmp_path / "run")])
    [entry] = yaml.safe_load((tmp_path / "run" / "agent_loops.yaml").read_text())
    want = RetrievalConfig(fact_top_k=7, rrf_k=30, fact_filter=True, fact_filter_base_url="http://llm:8001/v1",
                           fact_filter_model="filter")
    assert RetrievalConfig.model_validate(entry["retrieval"]) == want
    assert entry["fact_filter_api_key_env"] == "ROUTERAG_RETRIEVAL__FACT_FILTER_API_KEY"
    assert "filter-secret-123" not in printed + "".join(p.read_text() for p in (tmp_path / "run").iterdir())


def test_a_remote_retriever_gets_the_name_of_its_key_variable_not_the_key(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTERAG_TRAIN__VERL__RETRIEVER_URL", "http://retriever:8000")
    monkeypatch.setenv("ROUTERAG_SERVER__API_KEY", "server-secret-456")
    printed, overrides = _dry_run(["--questions", "train.parquet", "--out", str(tmp_path / "run")])
    [entry] = yaml.safe_load((tmp_path / "run" / "agent_loops.yaml").read_text())
    assert entry["retriever_url"] == "http://retriever:8000"
    assert entry["retriever_api_key_env"] == "ROUTERAG_SERVER__API_KEY"
    assert "index_dir" not in entry and "retrieval" not in entry
    assert "server-secret-456" not in printed + " ".join(overrides) + (tmp_path / "run" / "agent_loops.yaml").read_text()
    compose_launch(overrides)


def test_main_runs_the_routerag_trainer_under_verls_sync_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from training.verl_plugin.main import RouteRAGTaskRunner, check_trainer_mode
    from training.verl_plugin.trainer import RouteRAGTrainerSync, install

    monkeypatch.setitem(trainer_base.TRAINER_REGISTRY, "sync", PPOTrainerSync)  # restored after the test
    assert issubclass(RouteRAGTaskRunner.__ray_actor_class__, TaskRunnerV1.__ray_actor_class__)
    cfg = compose_launch(["data.train_files=[x.parquet]"])
    install()  # what RouteRAGTaskRunner.run does before verl's TaskRunnerV1.run looks the class up
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode) is RouteRAGTrainerSync
    assert issubclass(RouteRAGTrainerSync, PPOTrainerSync)
    # the hook is the method verl's training step calls, with verl's signature
    base = trainer_base.PPOTrainer
    assert "_compute_advantage" in base._step_once.__code__.co_names
    params = inspect.signature(base._compute_advantage).parameters
    assert list(inspect.signature(RouteRAGTrainerSync._compute_advantage).parameters) == list(params)
    check_trainer_mode(cfg)
    with pytest.raises(ValueError, match="trainer_mode=sync"):
        check_trainer_mode(compose_launch(["trainer.v1.trainer_mode=colocate_async"]))
