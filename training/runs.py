"""GRPO runs as library calls (``routerag train``, or any other caller): the local engine's run, its smoke preset
on the shipped sample corpus, and the verl launch plan with the resolved loop."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import routerag
from routerag.config import Settings

SAMPLES = Path(routerag.__file__).resolve().parent / "samples"
"""The demo corpus and its questions, shipped as package data (the smoke preset trains on them)."""
SMOKE_MODEL = "tiny-random"


def sample_index(out: Path) -> Path:
    """The built-in micro dataset's index (the shipped sample corpus), built once into OUT."""
    from graph_index.builder import build_index
    from graph_index.store import MANIFEST

    idx = out / "sample-index"
    if not (idx / MANIFEST).is_file():
        build_index([SAMPLES / "corpus.jsonl"], idx, Settings(), force=True, progress=False)
    return idx


def smoke_preset(settings: Settings, out: Path, *, lr: float | None = None) -> tuple[Path, list[Path]]:
    """The smoke preset (``--model tiny-random`` without data): the sample corpus's index and questions, and a
    run small enough for CI (2 questions × 2 rollouts, short turns, a large learning rate unless ``lr`` is given).
    Changes ``settings.train`` in place; returns the index and the question files."""
    tcfg = settings.train
    tcfg.batch_size, tcfg.group_size = min(tcfg.batch_size, 2), min(tcfg.group_size, 2)
    tcfg.max_turn_tokens, tcfg.max_total_tokens, tcfg.micro_batch_size = 24, 160, 4
    tcfg.lr = lr or 1e-3
    return sample_index(out), [SAMPLES / "questions.jsonl"]


def train_local(settings: Settings, index: Path, questions: Sequence[Path], out: Path, *,
                limit: int | None = None) -> tuple[list[dict[str, Any]], Path]:
    """Run local GRPO for ``settings.train.steps`` (resuming from OUT's latest checkpoint) and plot its reward
    curve. Returns the per-step metrics and the plot's path."""
    from .data import load_training_items
    from .local_trainer import METRICS, LocalGRPOTrainer
    from .plots import plot_training

    items = [it for q in questions for it in load_training_items(q, limit=limit)]
    history = LocalGRPOTrainer(settings, index, items, out).train()
    return history, plot_training(out / METRICS, out / "reward_curve.png")


def verl_launch(settings: Settings, out: Path, index: Path | None) -> dict[str, Any]:
    """Write the verl launch files into OUT and return the plan (:func:`~training.verl_plugin.launch.prepare_launch`),
    the rollouts' loop resolved as the local trainer resolves it."""
    from routerag.policy.card import training_policy

    from .verl_plugin.launch import prepare_launch

    return prepare_launch(settings.train, out, index_dir=str(index) if index else None, retrieval=settings.retrieval,
                          loop=training_policy(settings).loop)
