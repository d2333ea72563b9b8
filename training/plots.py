"""The curves of a training run (reward, EM, format, searches, retrieval time, mode mix), from its metrics JSONL
(matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path


def plot_training(metrics_file: str | Path, out_png: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(metrics_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{metrics_file}: no metrics yet")
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    axes[0].plot(steps, [r["reward"] for r in rows], marker="o", label="reward")
    axes[0].plot(steps, [r["em"] for r in rows], marker=".", label="EM")
    axes[0].plot(steps, [r["format_ok"] for r in rows], marker=".", label="format-valid")
    axes[0].set_title("reward, EM, format")
    axes[1].plot(steps, [r["searches"] for r in rows], marker="o", color="tab:green")
    axes[1].set_title("searches per rollout")
    axes[2].plot(steps, [r["retrieval_ms"] for r in rows], marker="o", color="tab:red")
    axes[2].set_title("retrieval ms per rollout")
    bottom = [0.0] * len(rows)  # the mode mix: what stage 2's time reward moves
    for mode, color in (("passage", "tab:blue"), ("graph", "tab:orange"), ("hybrid", "tab:purple")):
        share = [float(r.get("mode_mix", {}).get(mode, 0.0)) for r in rows]
        axes[3].bar(steps, share, bottom=bottom, color=color, label=mode, width=0.8)
        bottom = [b + x for b, x in zip(bottom, share)]
    axes[3].set_title("searches by mode")
    axes[3].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    switch = next((r["step"] for r in rows if r.get("stage") == 2), None)
    for ax in axes:
        ax.set_xlabel("step")
        if switch is not None:
            ax.axvline(switch - 0.5, color="grey", linestyle="--", linewidth=1)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_sft(metrics_file: str | Path, out_png: str | Path) -> Path:
    """The warm start's loss per optimiser step (``sft_metrics.jsonl``), epochs marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(metrics_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{metrics_file}: no metrics yet")
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker="o")
    for prev, row in zip(rows, rows[1:]):
        if row["epoch"] != prev["epoch"]:
            ax.axvline(row["step"] - 0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("cross-entropy on policy tokens")
    ax.set_title("SFT warm start")
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_stages(runs: dict[str, str | Path], out_png: str | Path, cost_table: dict[str, float] | None = None) -> Path:
    """Runs side by side (for example stage 1 and stage 2 from one warm start): EM, searches and retrieval cost per
    rollout, and the graph share of searches, per step. With ``cost_table`` (ms per search of each mode, the
    trainer's ``retrieval_costs.json``), the cost is the table's, the same for every run and free of timing noise:
    a step's mean per rollout is its searches × Σ mode share × mode cost; otherwise each run's measured time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for label, path in runs.items():
        rows = [json.loads(ln) for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
        if not rows:
            raise ValueError(f"{path}: no metrics yet")
        steps = [r["step"] for r in rows]
        cost = [step_table_ms(r, cost_table) if cost_table else r["retrieval_ms"] for r in rows]
        axes[0].plot(steps, [r["em"] for r in rows], marker="o", label=label)
        axes[1].plot(steps, [r["searches"] for r in rows], marker="o", label=label)
        axes[2].plot(steps, cost, marker="o", label=label)
        axes[3].plot(steps, [float(r.get("mode_mix", {}).get("graph", 0.0)) for r in rows], marker="o", label=label)
    titles = ("EM (training batch)", "searches per rollout",
              "retrieval ms per rollout" + (" (cost table)" if cost_table else " (measured)"), "graph share of searches")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def step_table_ms(row: dict, cost_table: dict[str, float]) -> float:
    """A training step's mean retrieval cost per rollout priced by a per-mode table: the mean of Σ cost(mode) over a
    rollout's searches equals searches per rollout × Σ share(mode) × cost(mode)."""
    return row["searches"] * sum(share * cost_table[m] for m, share in row.get("mode_mix", {}).items())
