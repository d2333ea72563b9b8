"""Running strategies over question sets: concurrent, resumable, and reported.

Layout of ``out_dir`` (one subfolder per question file, whatever their number, so scripts find results in the same
place; the folder is the file's stem, made unique)::

    out_dir/report.json, report.md             overview: every dataset × strategy
    out_dir/<dataset>/<strategy>.jsonl         one record per finished question (appended, flushed per line)
    out_dir/<dataset>/<strategy>.config.json   what produced those records (a re-run with other settings refuses)
    out_dir/<dataset>/report.json, report.md, *.png

A re-run with the same settings evaluates only the questions missing from ``<strategy>.jsonl`` (and retries those
that failed); ``fresh=True`` starts those strategies over.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..datasets import QAItem, load_questions
from .records import ResultsLog, score, summarize
from .report import write_dataset_report, write_overview
from ..policy.types import Summary
from .strategies import NO_RETRIEVAL, POLICY_STRATEGIES, Strategy, parse_strategies, run_strategy

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger(__name__)


class EvaluationError(RuntimeError):
    """Too many questions failed (a backend down, a misconfiguration): stop rather than record hundreds of zeros."""


@dataclass(slots=True)
class EvalOptions:
    strategies: list[str] = field(default_factory=lambda: ["learned"])
    budget: int | None = None
    """Searches before an answer is forced (None: the policy settings)."""
    k: int | None = None
    """Documents per search, and naive RAG's documents (None: the policy settings, 3)."""
    concurrency: int = 16
    limit: int | None = None
    progress: bool = True
    fresh: bool = False
    """Discard earlier results of the selected strategies instead of resuming."""
    max_errors: int = 10
    """Abort a strategy once this many of its questions failed in this invocation."""


@dataclass(slots=True)
class StrategyRun:
    records: list[dict[str, Any]]
    """Records of every current question (earlier runs' included), in question order."""
    evaluated: int
    resumed: int
    elapsed_s: float


def engine_config(engine: Engine, options: EvalOptions) -> dict[str, Any]:
    """What determines the answers: index, policy and retrieval settings, effective budget and k."""
    settings = engine.settings
    data = getattr(engine.retriever, "data", None)
    resolved = getattr(engine, "policy", None)
    return {
        "index": str(getattr(data, "path", "")) or None,
        "policy": settings.policy.model_dump(mode="json"),
        # what the policy's card decided where the settings are unset (a new card means new answers)
        "loop": ({**resolved.loop, "reader": resolved.reader, "reader_prompt": resolved.reader_prompt,
                  "short_answer": resolved.short_answer, "template": resolved.template}
                 if resolved is not None else None),
        "retrieval": settings.retrieval.model_dump(mode="json"),
        "budget": options.budget if options.budget is not None else engine.loop_config.budget,
        "k": options.k if options.k is not None else engine.loop_config.k,
    }


_RUNTIME_KEYS = {"generator": ("device", "max_batch", "max_wait_ms", "timeout_s", "max_concurrency", "api_key",
                                "gpu_memory_utilization", "tensor_parallel_size", "stream"),
                 "retrieval": ("batch_size", "device", "fact_filter_api_key")}
"""Settings that change speed, not answers: a resumed run may change them."""
_OPENAI_ONLY_KEYS = ("api", "chat_continuation")


def _fingerprint(config: dict[str, Any], strategy: str) -> dict[str, Any]:
    """The part of the configuration that determines a strategy's answers (what a resumed run must share)."""
    config = json.loads(json.dumps(config))  # a deep copy
    policy = config.get("policy") or {}
    for gen in (policy.get("generator"), policy.get("answer_generator")):
        for key in _RUNTIME_KEYS["generator"] if isinstance(gen, dict) else ():
            gen.pop(key, None)
        if isinstance(gen, dict) and gen.get("backend") != "openai":
            for key in _OPENAI_ONLY_KEYS:  # read by the openai backend only: they change no other backend's answers
                gen.pop(key, None)
    for key in _RUNTIME_KEYS["retrieval"] if isinstance(config.get("retrieval"), dict) else ():
        config["retrieval"].pop(key, None)
    fp = {"strategy": strategy, **config}
    if strategy not in POLICY_STRATEGIES:
        fp["policy"] = {"generator": config["policy"].get("generator"),
                        "answer_generator": config["policy"].get("answer_generator")}
        fp.pop("budget", None)
        if isinstance(fp.get("loop"), dict):  # the reader and what it reads matter, not the policy's own loop
            fp["loop"] = {key: fp["loop"].get(key) for key in ("reader", "reader_prompt", "short_answer", "k",
                                                               "max_information_tokens")}
    if strategy == NO_RETRIEVAL:
        for key in ("index", "retrieval", "k"):
            fp.pop(key, None)
    return fp


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [prefix or "(all)"]


def unique_ids(items: list[QAItem]) -> list[QAItem]:
    """Results are keyed by question id: repeated ids get a ``#n`` suffix so none is skipped as done."""
    seen: dict[str, int] = {}
    for it in items:
        n = seen.get(it.id, 0)
        seen[it.id] = n + 1
        if n:
            it.id = f"{it.id}#{n + 1}"
    return items


def dataset_names(files: Sequence[Path]) -> list[str]:
    names: list[str] = []
    for f in files:
        base = Path(f).stem or "questions"
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


async def evaluate_strategy(engine: Engine, items: Sequence[QAItem], strategy: Strategy, out_dir: Path,
                            options: EvalOptions, config: dict[str, Any], *, label: str = "") -> StrategyRun:
    """Evaluate the questions of ``items`` not yet in ``out_dir/<strategy>.jsonl``, ``options.concurrency`` at a
    time, appending each record as it finishes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = ResultsLog(out_dir / f"{strategy}.jsonl")
    cfg_path = out_dir / f"{strategy}.config.json"
    fp = _fingerprint(config, strategy)
    if options.fresh:
        results.reset()
    elif cfg_path.exists() and results.path.exists():
        old = json.loads(cfg_path.read_text(encoding="utf-8"))
        changed = _diff(old, fp)
        if changed:
            raise ValueError(f"{results.path} holds results of other settings (differs in {', '.join(changed[:12])}); "
                             "pass --fresh to start over, or use another --out")
    cfg_path.write_text(json.dumps(fp, indent=2) + "\n", encoding="utf-8")
    existing = results.load()
    done = {i for i, r in existing.items() if r.get("finish") != "error"}
    pending = [it for it in items if it.id not in done]
    records: dict[str, dict[str, Any]] = {it.id: existing[it.id] for it in items if it.id in done}
    sem = asyncio.Semaphore(max(1, options.concurrency))

    async def one(item: QAItem) -> dict[str, Any]:
        async with sem:
            t0 = time.perf_counter()
            try:
                outcome = await run_strategy(engine, item.question, strategy, budget=options.budget, k=options.k)
                error = None
            except Exception as exc:  # noqa: BLE001 - one failing question must not lose the others
                log.warning("%s %s: %s: %s", strategy, item.id, type(exc).__name__, exc)
                outcome = Summary(answer=None, finish="error")
                error = f"{type(exc).__name__}: {exc}"
            return score(item, strategy, outcome, (time.perf_counter() - t0) * 1000, error=error)

    from tqdm import tqdm

    bar = tqdm(total=len(items), initial=len(items) - len(pending), desc=f"{label}{strategy}", unit="q",
               disable=not options.progress, file=sys.stderr, dynamic_ncols=True)
    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(one(it)) for it in pending]
    errors = 0
    em_sum = 0.0
    try:
        for n, fut in enumerate(asyncio.as_completed(tasks), 1):
            rec = await fut
            results.append(rec)
            records[rec["id"]] = rec
            em_sum += rec["em"]
            bar.update(1)
            bar.set_postfix(em=f"{em_sum / n:.3f}", refresh=False)
            if rec["finish"] == "error":
                errors += 1
                if errors >= options.max_errors:
                    raise EvaluationError(f"{strategy}: {errors} questions failed; last: {rec.get('error')}")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        results.close()
        bar.close()
    ordered = [records[it.id] for it in items if it.id in records]
    return StrategyRun(ordered, evaluated=len(pending), resumed=len(items) - len(pending),
                       elapsed_s=round(time.perf_counter() - t0, 3))


async def evaluate(engine: Engine, question_files: Sequence[str | Path], out_dir: str | Path,
                   options: EvalOptions | None = None, *, command: str | None = None,
                   items_by_file: Sequence[list[QAItem]] | None = None) -> dict[str, Any]:
    """Evaluate every strategy of ``options`` on every question file, one file after another, and write the
    reports. Returns the overview (what ``out_dir/report.json`` holds). ``items_by_file``: the files' questions
    already loaded (with ``options.limit`` applied)."""
    options = options or EvalOptions()
    strategies = parse_strategies(options.strategies)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: not a directory")
    files = [Path(f) for f in question_files]
    if not files:
        raise ValueError("no question files given")
    if items_by_file is None:
        items_by_file = [load_questions(f, limit=options.limit) for f in files]
    config = engine_config(engine, options)
    run_info = {**config, "generator_name": getattr(engine.generator, "name", None), "strategies": list(strategies),
                "concurrency": options.concurrency, "limit": options.limit,
                "questions_files": [str(f) for f in files]}
    command = command if command is not None else " ".join(sys.argv)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    datasets = []
    for f, name, items in zip(files, dataset_names(files), items_by_file):
        items = unique_ids(list(items))
        ddir = out / name
        runs: dict[str, StrategyRun] = {}
        for strategy in strategies:
            runs[strategy] = await evaluate_strategy(engine, items, strategy, ddir, options, config,
                                                     label=f"{name} " if len(files) > 1 else "")
        summaries = {s: summarize(r.records) for s, r in runs.items()}
        report = {
            "dataset": name, "questions_file": str(f), "questions": len(items), "command": command,
            "created": created, "config": run_info, "summaries": summaries,
            "this_run": {s: {"evaluated": r.evaluated, "resumed": r.resumed, "elapsed_s": r.elapsed_s}
                         for s, r in runs.items()},
        }
        write_dataset_report(ddir, report, {s: r.records for s, r in runs.items()})
        datasets.append(report)
    overview = {"command": command, "created": created, "config": run_info,
                "datasets": [{k: d[k] for k in ("dataset", "questions_file", "questions", "summaries", "this_run")}
                             for d in datasets]}
    write_overview(out, overview)
    return overview


def run_evaluation(engine: Engine, question_files: Sequence[str | Path], out_dir: str | Path,
                   options: EvalOptions | None = None, *, command: str | None = None,
                   items_by_file: Sequence[list[QAItem]] | None = None) -> dict[str, Any]:
    """:func:`evaluate` in a fresh event loop (one loop for the whole run: the engine's batchers bind to it)."""
    return asyncio.run(evaluate(engine, question_files, out_dir, options, command=command,
                                items_by_file=items_by_file))


__all__ = ["EvalOptions", "EvaluationError", "StrategyRun", "engine_config", "evaluate", "evaluate_strategy",
           "run_evaluation"]
