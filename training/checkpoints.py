"""Atomic, resumable checkpoints for every trainer (the warm start and local GRPO).

A checkpoint is OUT/checkpoint-N: the weights (the adapter only, for LoRA), the tokenizer, the policy card, and
``state.pt`` with the optimiser, RNG states and step. It is written to a temporary folder and renamed, so a run killed
mid-write leaves the previous checkpoint intact, and a resumed run continues from the latest whole one.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from routerag.policy.card import PolicyCard, write_card

from .models import is_peft

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"


@contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """A fresh sibling folder (``.NAME.tmp``) to write ``final`` into; it replaces ``final`` when the block ends
    without error, so a run killed mid-write leaves the previous ``final`` whole (and the next write clears the
    leftover)."""
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def save_checkpoint(out: Path, step: int, model: Any, tokenizer: Any, optimizer: Any, card: PolicyCard, *,
                    config_json: str | None = None, keep_last: int | None = None) -> Path:
    """Write OUT/checkpoint-STEP atomically; with ``keep_last``, delete older checkpoints beyond that many."""
    final = out / f"{CHECKPOINT_PREFIX}{step}"
    with staged_directory(final) as tmp:
        if is_peft(model):  # the trained adapter only, not a frozen reference copy
            model.save_pretrained(tmp / "model", selected_adapters=["default"])
        else:
            model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        write_card(tmp / "model", card)
        torch.save({"optimizer": optimizer.state_dict(), "step": step,
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}, tmp / "state.pt")
        if config_json is not None:
            (tmp / "train_config.json").write_text(config_json)
    if keep_last:
        for _, old in sorted(_checkpoints(out))[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resume_checkpoint(out: Path, model: Any, optimizer: Any, device: str, metrics: Path | None = None) -> int:
    """Load the latest checkpoint under OUT into ``model`` and ``optimizer`` and restore the RNGs; return its step
    (0 when there is none). Metric lines after that step came from a run that died before saving: they are dropped."""
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return 0
    state = load_state(ckpt / "state.pt")
    if is_peft(model):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(model, load_peft_weights(str(ckpt / "model"), device=device))
    else:
        from transformers import AutoModelForCausalLM

        model.load_state_dict(AutoModelForCausalLM.from_pretrained(ckpt / "model").state_dict())
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    step = int(state["step"])
    if metrics is not None and metrics.exists():
        lines = [ln for ln in metrics.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        metrics.write_text("".join(ln + "\n" for ln in lines))
    log.info("resumed from %s (step %d)", ckpt, step)
    return step


def load_state(path: Path) -> dict[str, Any]:
    """A checkpoint's optimiser state, RNG states and step. They are tensors and plain containers only, so the file is
    read with ``weights_only=True``: a tampered ``state.pt`` cannot run code when a run resumes from it."""
    return torch.load(path, weights_only=True)


def _checkpoints(out: Path) -> list[tuple[int, Path]]:
    return [(int(p.name[len(CHECKPOINT_PREFIX):]), p) for p in Path(out).glob(f"{CHECKPOINT_PREFIX}*")
            if p.is_dir() and p.name[len(CHECKPOINT_PREFIX):].isdigit()]


def latest_checkpoint(out: Path) -> Path | None:
    found = _checkpoints(out)
    return max(found)[1] if found else None
