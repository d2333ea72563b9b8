"""``routerag eval``: answer accuracy, recall and cost of the learned router against forced modes, naive RAG and no
retrieval, on one or more question files; resumable, with reports and plots."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table

from .common import (AdapterOpt, ApiOpt, BackendOpt, BaseUrlOpt, ConfigOpt, PolicyOpt, TemperatureOpt,
                     policy_overrides, console, handle_errors, load_engine, setup_logging)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)


@handle_errors
def eval_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    questions: Annotated[list[Path], typer.Option(
        "--questions", "-q", help="Question file (PopQA/HotpotQA/2Wiki/MuSiQue JSON or JSONL); repeat the option for "
                                  "several, evaluated one after another into REPORT_DIR/<file stem>/.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Report directory (re-running resumes).")],
    modes: Annotated[str, typer.Option(help="Comma-separated strategies: learned, passage, graph, hybrid (the policy, "
                                            "its searches forced into one mode), naive-rag, naive-passage, "
                                            "naive-graph, naive-hybrid (one search of the question, then the "
                                            "policy's reader), two-search (the question, then the first new "
                                            "entity of its top document), no-retrieval.")] = "learned",
    limit: Annotated[Optional[int], typer.Option(min=1, help="Only the first N questions of each file.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Questions in flight at once (their generations and "
                                                         "searches are batched).")] = 16,
    budget: Annotated[Optional[int], typer.Option(
        min=0, help="Searches before an answer is forced (default: the policy's card, else 4).")] = None,
    k: Annotated[Optional[int], typer.Option("-k", min=1, help="Documents per search, and naive-rag's documents "
                                                               "(default: the policy's card, else 3).")] = None,
    policy: PolicyOpt = None,
    backend: BackendOpt = None,
    base_url: BaseUrlOpt = None,
    api: ApiOpt = None,
    adapter: AdapterOpt = None,
    temperature: TemperatureOpt = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard earlier results of these modes instead of "
                                                        "resuming.")] = False,
    max_errors: Annotated[int, typer.Option(min=1, help="Stop a mode after this many failed questions.")] = 10,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    config: ConfigOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Evaluate on question sets: EM, F1, GenAcc, supporting-passage recall@2/5/10, searches, time and tokens per
    strategy; writes REPORT_DIR/report.{json,md} and per-file folders with per-question JSONL and plots."""
    setup_logging(verbose)
    from ..datasets import load_questions
    from ..evaluation import EvalOptions, parse_strategies, run_evaluation

    strategies = parse_strategies(modes)
    for f in questions:
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no such question file")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is not a directory")
    if not index.is_dir():
        raise FileNotFoundError(f"{index}: no such index directory")
    items = [load_questions(f, limit=limit) for f in questions]  # a bad file fails now, before model loading
    engine = load_engine(index, config, policy_overrides(policy, backend, base_url, adapter, temperature, api))
    options = EvalOptions(strategies=list(strategies), budget=budget, k=k, concurrency=concurrency, limit=limit,
                          progress=progress, fresh=fresh, max_errors=max_errors)
    overview = run_evaluation(engine, questions, out, options, command=shlex.join(["routerag", *sys.argv[1:]]),
                              items_by_file=items)
    for d in overview["datasets"]:
        t = Table(title=f"{d['dataset']} ({d['questions']} questions)", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("strategy", "EM", "F1", "GenAcc", "R@5", "searches", "%Tradeoff", "ret. ms/q", "format ok",
                    "refused"):
            if col == "strategy":
                t.add_column(col, no_wrap=True)
            else:
                t.add_column(col, justify="right", overflow="fold")
        for name, s in d["summaries"].items():
            pct = lambda x: "—" if x is None else f"{100 * x:.1f}"  # noqa: E731
            t.add_row(name, pct(s["em"]), pct(s["f1"]), pct(s["gen_acc"]), pct(s["recall@5"]), f"{s['searches']:.2f}",
                      f"{s['tradeoff']:.1f}", f"{s['retrieval_ms']:.1f}", pct(s["format_ok"]), pct(s["refusal_rate"]))
        console.print(t)
    console.print(f"reports: {out / 'report.md'}, {out / 'report.json'}")
