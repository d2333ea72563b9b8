"""``routerag train`` (two-stage GRPO, local or verl), ``routerag train-sft`` (format warm start) and
``routerag prepare-data`` (question sets → verl parquet and local JSONL)."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import Settings, load_settings
from ..vocabulary import MODES
from .common import UsageError, console, handle_errors, print_json, setup_logging

log = logging.getLogger(__name__)


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("train-sft")(sft_cmd)
    app.command("prepare-data")(prepare_cmd)
    app.command("make-questions")(make_questions_cmd)
    app.command("plan-outcomes")(plan_outcomes_cmd)
    app.command("merge-adapter")(merge_cmd)


@handle_errors
def train_cmd(
    stage: Annotated[int, typer.Option(help="1: correctness only; 2: stage 1 then stage 2 (efficiency) from "
                                            "--switch-step on (RouteRAG: 20 of 40).")] = 2,
    engine: Annotated[str, typer.Option(help="local (one machine, CPU or GPU) or verl (distributed).")] = "local",
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory: checkpoints, metrics, plot.")] = Path("runs/train"),
    index: Annotated[Optional[Path], typer.Option(help="Index to retrieve from (local engine, or verl in-process).")] = None,
    questions: Annotated[Optional[list[Path]], typer.Option(help="Training questions (JSON/JSONL/parquet).")] = None,
    model: Annotated[Optional[str], typer.Option(help="smollm2, a folder or hub name, or tiny-random (verl: "
                                                      "train.verl.model, Qwen2.5-7B-Instruct).")] = None,
    init_adapter: Annotated[Optional[str], typer.Option(help="Start from this LoRA adapter (the SFT warm start).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (40).")] = None,
    switch_step: Annotated[Optional[int], typer.Option(help="Last stage-1 step (20).")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Questions per step (verl: train.verl.train_batch_size, "
                                                           "256).")] = None,
    group_size: Annotated[Optional[int], typer.Option(help="Rollouts per question.")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate.")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Use only the first N questions.")] = None,
    nodes: Annotated[Optional[int], typer.Option(help="verl: nodes.")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option(help="verl: GPUs per node.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="verl: print the resolved command and config.")] = False,
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML file with settings.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Two-stage GRPO (RouteRAG): stage 1 rewards correct answers, stage 2 also fast retrieval."""
    setup_logging(verbose or not dry_run)
    settings = _train_settings(stage, engine, config, questions, model=model, init_adapter=init_adapter, steps=steps,
                               switch_step=switch_step, batch_size=batch_size, group_size=group_size, lr=lr,
                               nodes=nodes, gpus_per_node=gpus_per_node)
    if engine == "verl":
        _train_verl(settings, out, index, dry_run)
        return
    from training.runs import SMOKE_MODEL, smoke_preset, train_local

    from ..runtime import configure_threads

    configure_threads()
    if settings.train.model == SMOKE_MODEL and not questions and index is None:  # built-in micro dataset
        index, questions = smoke_preset(settings, out, lr=lr)
    if index is None or not questions:
        raise UsageError("the local engine needs --index and --questions (or --model tiny-random for the smoke "
                         "preset)")
    history, png = train_local(settings, index, questions, out, limit=limit)
    console.print(f"[bold green]trained[/] {settings.train.steps} steps → {out}  (reward curve: {png})")
    if history:
        last = history[-1]
        console.print(json.dumps({k: last[k] for k in ("step", "stage", "reward", "em", "format_ok", "searches",
                                                       "retrieval_ms", "kl")}))


def _train_settings(stage: int, engine: str, config: Path | None, questions: list[Path] | None, *,
                    model: str | None, init_adapter: str | None, batch_size: int | None, nodes: int | None,
                    gpus_per_node: int | None, **flags: object) -> Settings:
    """``[train]`` from the flags over the config file; verl's model and batch go to ``train.verl``."""
    if stage not in (1, 2):
        raise UsageError("--stage must be 1 or 2")
    if engine not in ("local", "verl"):
        raise UsageError("--engine must be local or verl")
    overrides = {"engine": engine, "model": model, "init_adapter": init_adapter, "batch_size": batch_size, **flags}
    if engine == "verl":
        if init_adapter:
            raise UsageError("the verl engine trains full weights: merge the adapter into its base first "
                             "(`routerag merge-adapter --adapter DIR --out MERGED`) and pass --model MERGED")
        # verl's model and batch are its own settings (train.verl.*): the flags go there, not to the local ones
        overrides.update(model=None, batch_size=None)
        overrides["verl"] = {"nodes": nodes, "gpus_per_node": gpus_per_node, "model": model,
                             "train_batch_size": batch_size,
                             "train_files": [str(q) for q in questions] if questions else None}
    settings = load_settings(Settings, config, train=overrides)
    if stage == 1:
        settings.train.switch_step = settings.train.steps  # never switch
    return settings


def _train_verl(settings: Settings, out: Path, index: Path | None, dry_run: bool) -> None:
    from training.runs import verl_launch

    plan = verl_launch(settings, out, index)
    if dry_run:
        console.print("[bold]command[/]")
        print(plan["shell"])
        console.print(f"[bold]agent loop[/] ({plan['agent_loops_yaml']})")
        print(Path(plan["agent_loops_yaml"]).read_text())
        console.print(f"[bold]base config[/] ({plan['config_yaml']})")
        print(Path(plan["config_yaml"]).read_text())
        console.print("[bold]resolved training settings[/]")
        print_json(settings.train.model_dump(mode="json"))
        return
    try:
        import verl  # noqa: F401
    except ImportError:
        raise RuntimeError("the verl engine needs verl: pip install 'routerag[train]' (and the gpu extra)") from None
    raise typer.Exit(subprocess.call(plan["command"]))


_ROUTES_FROM = ("A `routerag eval --modes naive-passage,naive-graph,naive-hybrid` folder of these questions (repeat "
                "for several question files): each question's first search uses the mode whose documents served the "
                "reader best; where its documents miss what the question needs (the answer; a multi-hop question's "
                "supporting page), the question is searched again in the cheapest mode whose documents add it "
                "(implies --plan retrieval).")
_PLANS_FROM = ("A `routerag plan-outcomes` file of these questions (repeat for several): each question's trajectory "
               "is the cheapest measured plan that got its best outcome (one search per mode, a bridge second search, "
               "a search per compared entity), with the documents it showed; questions without a row are left out "
               "(implies --plan retrieval).")
_REFUSALS = ("A question whose answer none of the retrieved documents holds ends with a refusal "
             "(an answer that is the refusal marker, refuse in square brackets) instead of a guess, under an "
             "instruction that states the convention, recorded in the policy card (implies --plan retrieval).")
_EXTRA_SEARCHES = ("Share of questions (drawn with the seed) whose trajectory searches again although the first "
                   "search found what they need: an over-retrieving warm start, for showing what stage 2's cost term "
                   "removes (implies --plan retrieval).")


@handle_errors
def sft_cmd(
    index: Annotated[Path, typer.Option(help="Index: retrieval for the routing plan; gold passages' text by title; "
                                             "with --plans-from, the documents of rows that name no index.")],
    questions: Annotated[list[Path], typer.Option(help="Questions with gold answers (and supporting passages).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the adapter goes.")] = Path("runs/sft"),
    model: Annotated[Optional[str], typer.Option(help="smollm2, a folder or hub name, or tiny-random.")] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the examples.")] = 1,
    lr: Annotated[float, typer.Option(help="Learning rate (LoRA).")] = 2e-4,
    limit: Annotated[Optional[int], typer.Option(help="Use only the first N questions.")] = None,
    plan: Annotated[str, typer.Option(help="gold: the gold passages as if retrieved, random modes (format only); "
                                           "retrieval: what the retriever returns for the question, in the labelled "
                                           "mode (--routes-from) or a random one.")] = "gold",
    routes_from: Annotated[Optional[list[Path]], typer.Option(help=_ROUTES_FROM)] = None,
    plans_from: Annotated[Optional[list[Path]], typer.Option(help=_PLANS_FROM)] = None,
    refusals: Annotated[bool, typer.Option("--refusals", help=_REFUSALS)] = False,
    extra_searches: Annotated[float, typer.Option(min=0.0, max=1.0, help=_EXTRA_SEARCHES)] = 0.0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Build the examples, print their counts and write them to OUT/warm_start_examples.jsonl; "
                          "train nothing.")] = False,
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML file with settings.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Warm start (FrugalRAG): teach the search format, and with routing labels which mode suits which question,
    from trajectories built on gold passages or on real retrieval. Writes OUT/adapter with its policy card."""
    setup_logging(True)
    from training.models import load_policy
    from training.warm_start import WarmStartOptions, prepare_warm_start, train_warm_start, write_examples

    from ..runtime import configure_threads

    if plan not in ("gold", "retrieval"):
        raise UsageError("--plan must be gold or retrieval")
    opts = WarmStartOptions(plan=plan, routes_from=list(routes_from or []),  # type: ignore[arg-type]
                            plans_from=list(plans_from or []), refusals=refusals, extra_searches=extra_searches,
                            limit=limit)
    configure_threads()
    settings = load_settings(Settings, config, train={"model": model})
    model_, tok = load_policy(settings.train)
    data = prepare_warm_start(settings, index, questions, opts, tok)
    console.print(data.summary())
    if dry_run:  # the data only, to read before an hour of training
        path = write_examples(data, tok, out)
        console.print(f"dry run: examples in {path}; nothing trained")
        return
    folder, hist = train_warm_start(data, model_, tok, settings, out, opts, epochs=epochs, lr=lr)
    console.print(f"[bold green]saved[/] {folder}  (final loss {hist[-1]['loss'] if hist else float('nan'):.4f}; curve: "
                  f"{out / 'sft_loss.png'})")


@handle_errors
def prepare_cmd(
    inputs: Annotated[list[Path], typer.Argument(help="Question files: HippoRAG/RouteRAG JSON, JSONL, verl parquet.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")],
    split: Annotated[str, typer.Option(help="Split name (file stem).")] = "train",
    limit: Annotated[Optional[int], typer.Option(help="First N questions of each input.")] = None,
    data_source: Annotated[Optional[str], typer.Option(help="data_source field (default: first input's name).")] = None,
    solved_in: Annotated[Optional[Path], typer.Option(
        help="Keep only questions a policy got right (EM or GenAcc > 0) in these `routerag eval` records "
             "(<strategy>.jsonl): GRPO learns nothing from groups that are always wrong.")] = None,
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="TOML file with settings (the parquet's prompts use its policy.template_file).")] = None,
) -> None:
    """Write OUT/<split>.parquet (verl's RL format, our policy prompt) and OUT/<split>.jsonl (local trainer, eval)."""
    from training.data import prepare, solved_ids

    from ..prompts import load_template

    template = load_template(load_settings(Settings, config).policy.template_file)
    keep = solved_ids(solved_in) if solved_in is not None else None
    print_json(prepare(inputs, out, split=split, limit=limit, data_source=data_source, keep_ids=keep,
                       template=template))


@handle_errors
def make_questions_cmd(
    index: Annotated[Path, typer.Argument(help="A built index (routerag build-graph).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Question file to write (JSONL).")],
    per_type: Annotated[int, typer.Option(min=1, help="At most this many questions of each type.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the phrasings and the selection.")] = 0,
    exclude: Annotated[Optional[list[Path]], typer.Option(
        "--exclude", help="A question file (any format eval reads) whose questions and facts this draw must not "
                          "repeat, such as a held-out draw of another seed; repeatable.")] = None,
) -> None:
    """Derive questions with answers and gold passages from the index's own facts: single-hop, bridge, comparison
    and unanswerable ones (answers: []), for routerag eval, train-sft and train. Prints the count per type."""
    from training.questions import write_questions

    print_json(write_questions(index, out, per_type=per_type, seed=seed, exclude=exclude or []))


@handle_errors
def plan_outcomes_cmd(
    index: Annotated[Path, typer.Argument(help="The index the questions are asked over.")],
    questions: Annotated[Path, typer.Option(help="Questions with gold answers (unanswerable ones: answers []).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Outcome rows to write (JSONL; a rerun resumes).")],
    limit: Annotated[Optional[int], typer.Option(min=1, help="Only the first N questions.")] = None,
    k: Annotated[Optional[int], typer.Option("-k", min=1, help="Documents per search (default: the policy's).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Questions in flight at once.")] = 8,
    second_modes: Annotated[str, typer.Option(help="Modes of a bridge plan's second search (comma-separated).")]
    = ",".join(MODES),
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML file with settings.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Measure each question's candidate plans (one search per mode, a bridge second search, a search per compared
    entity) with the policy's retriever and reader: the warm-start labels of train-sft --plans-from. Prints the
    headroom per question type (best fixed mode against the best plan per question)."""
    setup_logging(verbose)
    import asyncio

    from training.outcomes import headroom, measure_all

    from ..datasets import load_questions
    from .common import load_engine

    modes = [m.strip() for m in second_modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise UsageError(f"--second-modes: choose from {', '.join(MODES)}")
    items = load_questions(questions, limit=limit)
    engine = load_engine(index, config, {}, warm=True)
    rows = asyncio.run(measure_all(engine, items, out, k=k, concurrency=concurrency,
                                   second_modes=modes))  # type: ignore[arg-type]
    print_json({"questions": len(rows), "out": str(out), "headroom": headroom(rows)})


@handle_errors
def merge_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="New folder for the merged model and its tokenizer.")],
    adapter: Annotated[Optional[Path], typer.Option(help="LoRA adapter folder (train-sft's adapter/, a GRPO "
                                                         "checkpoint's model/).")] = None,
    model: Annotated[str, typer.Option(help="The adapter's base: smollm2, a folder, a hub name or tiny-random; "
                                            "smollm2-routerag merges the shipped router.")] = "smollm2",
) -> None:
    """Fold a LoRA adapter into its base model: a plain transformers folder for verl (--model) or vLLM."""
    from training.models import merge_adapter

    path = merge_adapter(model, str(adapter) if adapter else None, out)
    console.print(f"[bold green]merged[/] {adapter or model} → {path}")
