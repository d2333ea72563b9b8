"""Evaluation reports: ``report.json`` (everything, machine-readable), ``report.md`` (one row per strategy, plus the
mode mix) and PNG plots drawn with matplotlib's Agg canvas (no display, no pyplot global state)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graph_index.atomic import atomic_path, write_text_atomic

from ..vocabulary import MODES
from .records import DEFINITIONS, RECALL_KS

PLOTS = {
    "accuracy_vs_searches": "accuracy_vs_searches.png",
    "mode_mix": "mode_mix.png",
    "retrieval_time": "retrieval_time.png",
}

_MODE_COLORS = {"passage": "#4C72B0", "graph": "#DD8452", "hybrid": "#55A868"}


def write_dataset_report(out_dir: Path, report: dict[str, Any], records: Mapping[str, Sequence[dict[str, Any]]]
                         ) -> None:
    """``report.json``, ``report.md`` and the plots of one question set."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = report["summaries"]
    plot_accuracy_vs_searches(summaries, out_dir / PLOTS["accuracy_vs_searches"])
    plot_mode_mix(summaries, out_dir / PLOTS["mode_mix"])
    plot_retrieval_times(records, out_dir / PLOTS["retrieval_time"])
    full = {**report, "plots": dict(PLOTS), "definitions": DEFINITIONS}
    write_text_atomic(out_dir / "report.json", json.dumps(full, indent=2, ensure_ascii=False) + "\n")
    write_text_atomic(out_dir / "report.md", dataset_markdown(full))


def write_overview(out_dir: Path, overview: dict[str, Any]) -> None:
    """The top-level ``report.json`` / ``report.md``: every question set, one table each."""
    out_dir.mkdir(parents=True, exist_ok=True)
    full = {**overview, "definitions": DEFINITIONS}
    write_text_atomic(out_dir / "report.json", json.dumps(full, indent=2, ensure_ascii=False) + "\n")
    lines = ["# RouteRAG evaluation", "", *_header(overview), ""]
    for d in overview["datasets"]:
        lines += [f"## {d['dataset']} ({d['questions']} questions)", "",
                  f"Questions: `{d['questions_file']}`. Details and plots: [{d['dataset']}/report.md]"
                  f"({d['dataset']}/report.md).", "", *results_table(d["summaries"]), "",
                  "Refusals, accuracy on the questions answered, and how the trajectories ended:", "",
                  *refusal_table(d["summaries"]), ""]
    lines += _definitions()
    write_text_atomic(out_dir / "report.md", "\n".join(lines) + "\n")


# -- markdown ---------------------------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def _num(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


RESULT_COLUMNS = ("strategy", "n", "EM", "F1", "GenAcc", "answer recall", *(f"R@{k}" for k in RECALL_KS), "R@all",
                  "searches",
                  "%Tradeoff", "retrieval ms/q", "ms/search", "generation ms/q", "tokens in/q", "tokens out/q",
                  "format ok", "errors")


def results_table(summaries: Mapping[str, dict[str, Any]]) -> list[str]:
    """One row per strategy: accuracy and recall in percent, cost per question."""
    rows = ["| " + " | ".join(RESULT_COLUMNS) + " |", "|" + "|".join("---" for _ in RESULT_COLUMNS) + "|"]
    for name, s in summaries.items():
        cells = [name, str(s["questions"]), _pct(s["em"]), _pct(s["f1"]), _pct(s["gen_acc"]),
                 _pct(s.get("answer_recall")), *(_pct(s[f"recall@{k}"]) for k in RECALL_KS), _pct(s["recall_all"]), _num(s["searches"], 2),
                 _num(s["tradeoff"]), _num(s["retrieval_ms"]), _num(s["retrieval_ms_per_search"]),
                 _num(s["generation_ms"], 0), _num(s["prompt_tokens"], 0), _num(s["completion_tokens"], 0),
                 _pct(s["format_ok"]), str(s["errors"])]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


REFUSAL_COLUMNS = ("strategy", "refusal %", "EM answered", "F1 answered", "GenAcc answered", "refusal precision",
                   "refusal recall", "refused with answer %", "endings")


def refusal_table(summaries: Mapping[str, dict[str, Any]]) -> list[str]:
    """One row per strategy: the share of questions refused, and accuracy on the questions answered (a refusing
    policy is judged on what it chose to answer, beside its plain EM, where a refusal scores 0), and how its
    trajectories ended (the ones out of format are the forced and the cut-off ones)."""
    rows = ["| " + " | ".join(REFUSAL_COLUMNS) + " |", "|" + "|".join("---" for _ in REFUSAL_COLUMNS) + "|"]
    for name, s in summaries.items():
        endings = ", ".join(f"{k} {v}" for k, v in sorted(s.get("finish", {}).items(), key=lambda kv: -kv[1]))
        cells = [name, _pct(s.get("refusal_rate")),
                 *(_pct(s.get(f"{k}_answered")) for k in ("em", "f1", "gen_acc")),
                 _num(s.get("refusal_precision"), 2), _num(s.get("refusal_recall"), 2),
                 _pct(s.get("refused_with_answer")), endings or "—"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def mode_mix_table(summaries: Mapping[str, dict[str, Any]]) -> list[str]:
    cols = ("strategy", "searches", *(f"{m} %" for m in MODES))
    rows = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for name, s in summaries.items():
        total = sum(s["mode_counts"].values())
        rows.append("| " + " | ".join([name, str(total), *(_pct(s["mode_mix"][m]) if total else "—"
                                                             for m in MODES)]) + " |")
    return rows


def routing_by_type_table(summaries: Mapping[str, dict[str, Any]]) -> list[str]:
    """Per question type and strategy: accuracy, searches and mode mix (how the routing differs by question)."""
    cols = ("type", "strategy", "n", "EM", "GenAcc", "answer recall", "searches", *(f"{m} %" for m in MODES))
    rows = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    types = sorted({t for s in summaries.values() for t in s.get("by_type", {})})
    for t in types:
        for name, s in summaries.items():
            sub = s.get("by_type", {}).get(t)
            if sub is None:
                continue
            total = sum(sub["mode_counts"].values())
            rows.append("| " + " | ".join([t, name, str(sub["questions"]), _pct(sub["em"]), _pct(sub["gen_acc"]),
                                            _pct(sub.get("answer_recall")), _num(sub["searches"], 2),
                                            *(_pct(sub["mode_mix"][m]) if total else "—" for m in MODES)]) + " |")
    return rows if types else []


def _header(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    gen = cfg["policy"]["generator"]
    ans = cfg["policy"].get("answer_generator")
    policy = cfg.get("generator_name") or f"{gen['backend']}:{gen['model']}" + (
        f"+{gen['adapter']}" if gen.get("adapter") else "")
    lines = [f"- command: `{report['command']}`", f"- created: {report['created']}", f"- index: `{cfg['index']}`",
             f"- policy: `{policy}`" + (f", answers by `{ans['backend']}:{ans['model']}`" if ans else ""),
             f"- search budget {cfg['budget']}, k = {cfg['k']} documents per search; naive-rag retrieves k "
             f"documents in `{cfg['retrieval']['mode']}` mode",
             f"- concurrency {cfg['concurrency']}" + (f", limit {cfg['limit']} questions" if cfg.get("limit") else "")]
    return lines


def _definitions() -> list[str]:
    return ["## Definitions", "", *(f"- **{k}**: {v}" for k, v in DEFINITIONS.items()),
            "- Accuracy and recall are percentages; times are milliseconds per question unless named per search; "
            "tokens are per question (prompt tokens as the backend reports them)."]


def dataset_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Evaluation: {report['dataset']} ({report['questions']} questions)", "",
             f"- questions: `{report['questions_file']}`", *_header(report), "", "## Results", "",
             *results_table(report["summaries"]), "", "## Refusals (accuracy on the questions answered)", "",
             *refusal_table(report["summaries"]), "", "## Mode mix (share of searches)", "",
             *mode_mix_table(report["summaries"]), "",
             *(["## By question type", "", *by_type, ""] if (by_type := routing_by_type_table(report["summaries"]))
               else []),
             "## This run", "",
             "| strategy | evaluated | resumed | elapsed s |", "|---|---|---|---|"]
    for name, r in report["this_run"].items():
        lines.append(f"| {name} | {r['evaluated']} | {r['resumed']} | {r['elapsed_s']:.1f} |")
    lines += ["", "## Plots", "", f"![accuracy vs searches]({PLOTS['accuracy_vs_searches']})", "",
              f"![mode mix]({PLOTS['mode_mix']})", "", f"![retrieval time]({PLOTS['retrieval_time']})", "",
              *_definitions()]
    return "\n".join(lines) + "\n"


# -- plots -----------------------------------------------------------------------------------------------------------

def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")


def plot_accuracy_vs_searches(summaries: Mapping[str, dict[str, Any]], path: Path) -> None:
    """EM, F1 and GenAcc against average searches: one colour per strategy, one marker per metric."""
    from matplotlib.lines import Line2D

    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    metrics = (("em", "o", "EM"), ("f1", "s", "F1"), ("gen_acc", "^", "GenAcc"))
    handles = []
    labels: dict[tuple[float, float], list[str]] = {}  # strategies that land on the same point share one label
    for i, (name, s) in enumerate(summaries.items()):
        color = f"C{i % 10}"
        for key, marker, _ in metrics:
            ax.scatter([s["searches"]], [100 * s[key]], color=color, marker=marker, s=50, zorder=3)
        labels.setdefault((round(s["searches"], 2), round(100 * s["f1"], 1)), []).append(name)
        handles.append(Line2D([], [], color=color, marker="o", linestyle="", label=name))
    for (x, y), names in labels.items():
        ax.annotate(" / ".join(names), (x, y), xytext=(6, 4), textcoords="offset points", fontsize=8)
    handles += [Line2D([], [], color="black", marker=m, linestyle="", label=lab) for _, m, lab in metrics]
    ax.set_xlabel("average searches per question")
    ax.set_ylabel("score (%)")
    ax.set_ylim(-2, 102)
    ax.set_xlim(left=-0.1)
    ax.grid(alpha=0.3)
    ax.set_title("Accuracy vs. retrieval cost")
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, path)


def plot_mode_mix(summaries: Mapping[str, dict[str, Any]], path: Path) -> None:
    """Stacked bars: the share of each strategy's searches made in each retrieval mode."""
    fig = _figure(max(4.0, 1.2 * len(summaries) + 2), 4)
    ax = fig.add_subplot()
    names = list(summaries)
    bottoms = [0.0] * len(names)
    for mode in MODES:
        vals = [100 * summaries[n]["mode_mix"][mode] for n in names]
        ax.bar(names, vals, bottom=bottoms, color=_MODE_COLORS[mode], label=mode)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, n in enumerate(names):
        if not sum(summaries[n]["mode_counts"].values()):
            ax.text(i, 50, "no searches", ha="center", va="center", rotation=90, fontsize=8, color="gray")
    ax.set_ylabel("share of searches (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Retrieval mode mix")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.tick_params(axis="x", labelrotation=20)
    _save(fig, path)


def plot_retrieval_times(records: Mapping[str, Sequence[dict[str, Any]]], path: Path) -> None:
    """Histogram of the time of each search, per strategy (what a search costs in each mode mix)."""
    import numpy as np

    fig = _figure(7, 4)
    ax = fig.add_subplot()
    values = {name: [float(x) for r in recs for x in r.get("search_ms", [])] for name, recs in records.items()}
    values = {k: v for k, v in values.items() if v}
    if values:
        edges = np.histogram_bin_edges(np.concatenate([np.asarray(v) for v in values.values()]), bins=30)
        for name, v in values.items():
            ax.hist(v, bins=edges, histtype="step", linewidth=1.5, color=f"C{list(records).index(name) % 10}",
                    label=f"{name} ({len(v)} searches, median {np.median(v):.1f} ms)")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no searches", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xlabel("retrieval time per search (ms)")
    ax.set_ylabel("searches")
    ax.set_title("Retrieval time")
    _save(fig, path)
