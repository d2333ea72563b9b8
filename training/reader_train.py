"""``routerag train-reader``: fine-tune the extractive reader (:mod:`routerag.policy.extractive`) on CPU.

The MiniLM's embeddings and lower layers stay frozen (and are not shipped: the installed package provides them); the
top layers and two heads learn: start/end over the window's tokens, ``[CLS]`` meaning "not here" (SQuAD 2.0), and a
yes/no logit trained on yes/no examples only. Checkpoints (OUT/checkpoint-N: the trained tensors in float32, the
optimiser, the schedule and the RNG states) are atomic, and a rerun with the same OUT resumes from the latest one;
the batch order is a function of the seed and the epoch, so a resumed run sees what the killed one would have.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from routerag.policy.extractive import (READER_CARD, ReaderCard, base_model_path, build_span_model, file_sha256,
                                        save_reader, trainable_state, window_inputs)

from .checkpoints import CHECKPOINT_PREFIX, latest_checkpoint, load_state, staged_directory
from .reader_data import SpanExample, data_summary

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReaderTrainConfig:
    epochs: int = 1
    batch_size: int = 16
    lr: float = 2e-4
    head_lr: float = 2e-3
    trained_layers: tuple[int, ...] = (4, 5)
    max_length: int = 128
    save_every: int = 25
    seed: int = 0
    abstain_below: float = 0.01
    max_steps: int | None = None
    """Stop (and schedule the learning rate to end) here, before the epochs are done: a run bounded in time."""
    init: Path | None = None
    """A trained reader folder to start from instead of the base: fine-tuning a shipped reader on new data costs
    minutes where retraining its recipe costs most of an hour per member."""
    init_member: int = 0
    """Which of ``init``'s members (0 = ``reader.safetensors``) to start from."""


@dataclass(slots=True)
class Window:
    input_ids: list[int]
    token_type_ids: list[int]
    start: int
    end: int
    yes_no: float
    """1 yes, 0 no, −1: not a yes/no example."""


def featurize(examples: Sequence[SpanExample], tokenizer: Any, card: ReaderCard, *,
              max_negative_windows: int = 1) -> list[Window]:
    """Windows with their targets: the answer's first and last token when the window holds all of it, else 0, 0
    (at most ``max_negative_windows`` of those per document)."""
    enc = window_inputs(tokenizer, [e.question for e in examples], [e.context for e in examples], card,
                        tensors=False)
    out = []
    negatives_of: dict[int, int] = {}
    for w, owner in enumerate(enc["overflow_to_sample_mapping"]):
        ex = examples[owner]
        start = end = 0
        if ex.answer:
            a, b = ex.answer_start, ex.answer_start + len(ex.answer)
            seq = enc.sequence_ids(w)
            offsets = enc["offset_mapping"][w]
            toks = [t for t, sid in enumerate(seq) if sid == 1 and offsets[t][0] < b and offsets[t][1] > a]
            if toks and offsets[toks[0]][0] <= a and offsets[toks[-1]][1] >= b:
                start, end = toks[0], toks[-1]
        label = -1.0 if ex.yes_no is None else float(ex.yes_no)
        if start == 0 and ex.yes_no is None:
            negatives_of[owner] = negatives_of.get(owner, 0) + 1
            if negatives_of[owner] > max_negative_windows:
                continue  # the rest of a long document costs more than it teaches
        out.append(Window(enc["input_ids"][w], enc["token_type_ids"][w], start, end, label))
    return out


def collate(batch: Sequence[Window], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(w.input_ids) for w in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, w in enumerate(batch):
        n = len(w.input_ids)
        ids[i, :n] = torch.tensor(w.input_ids)
        types[i, :n] = torch.tensor(w.token_type_ids)
        mask[i, :n] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
            "start": torch.tensor([w.start for w in batch]), "end": torch.tensor([w.end for w in batch]),
            "yes_no": torch.tensor([w.yes_no for w in batch])}


def batch_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Start and end cross-entropy over the unpadded tokens, plus the yes/no log-loss where there is a label."""
    start, end, yes = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    pad = batch["attention_mask"] == 0
    ce = torch.nn.functional.cross_entropy
    loss = (ce(start.masked_fill(pad, -1e4), batch["start"]) + ce(end.masked_fill(pad, -1e4), batch["end"])) / 2
    labelled = batch["yes_no"] >= 0
    if labelled.any():
        loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(yes[labelled], batch["yes_no"][labelled])
    return loss


def start_from_member(model: Any, cfg: ReaderTrainConfig) -> None:
    """Put one member of a trained reader over the fresh model. Its layers must be the ones this run trains: a
    member's tensors cover only its own trained layers, so any other layer would silently restart from the base."""
    from routerag.policy.extractive import load_member, member_files, read_reader_card

    card = read_reader_card(cfg.init)
    names = member_files(card)
    if not 0 <= cfg.init_member < len(names):
        raise ValueError(f"--init-member {cfg.init_member}: {cfg.init} has {len(names)} member(s) (0-{len(names) - 1})")
    if tuple(card.trained_layers) != tuple(cfg.trained_layers):
        raise ValueError(f"--init {cfg.init}: its trained layers {card.trained_layers} differ from --layers "
                         f"{list(cfg.trained_layers)}; train the same layers it ships")
    member = load_member(Path(cfg.init) / names[cfg.init_member], card)
    model.load_state_dict(member.state_dict())


def freeze_base(model: Any, trained_layers: Sequence[int]) -> list[dict[str, Any]]:
    """Freeze all but the trained layers and the heads; the optimiser's parameter groups (heads learn faster)."""
    keep = tuple(f"bert.encoder.layer.{i}." for i in trained_layers)
    encoder, heads = [], []
    for name, p in model.named_parameters():
        if name.startswith(("span.", "yes_no.")):
            heads.append(p)
        elif name.startswith(keep):
            encoder.append(p)
        else:
            p.requires_grad_(False)
    return [{"params": encoder, "name": "encoder"}, {"params": heads, "name": "heads"}]


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(seed * 1000 + epoch).shuffle(order)
    return order


def save_train_state(out: Path, step: int, model: Any, optimizer: Any, scheduler: Any, layers: Sequence[int]) -> Path:
    """OUT/checkpoint-STEP, written beside and renamed into place (a kill mid-write keeps the previous one)."""
    final = out / f"{CHECKPOINT_PREFIX}{step}"
    with staged_directory(final) as tmp:
        torch.save({"model": {k: v.clone() for k, v in trainable_state(model, layers).items()},
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}, tmp / "state.pt")
    for old in out.glob(f"{CHECKPOINT_PREFIX}*"):
        if old != final and old.name[len(CHECKPOINT_PREFIX):].isdigit():
            shutil.rmtree(old, ignore_errors=True)
    return final


def resume(out: Path, model: Any, optimizer: Any, scheduler: Any) -> int:
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return 0
    state = load_state(ckpt / "state.pt")
    model.load_state_dict(state["model"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    log.info("resumed from %s (step %d)", ckpt, state["step"])
    return int(state["step"])


def train_reader(examples: Sequence[SpanExample], out: Path, cfg: ReaderTrainConfig, *,
                 provenance: dict[str, Any] | None = None,
                 progress: Callable[[dict[str, Any]], None] | None = None, export_only: bool = False) -> Path:
    """Train, checkpointing as it goes; write the finished reader (fp16 tensors + card) to OUT/reader. With
    ``export_only``, train nothing: write the reader of the latest checkpoint (a run stopped early)."""
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    out.mkdir(parents=True, exist_ok=True)
    base = base_model_path()
    card = ReaderCard(base_sha256=file_sha256(base / "model.safetensors"), trained_layers=list(cfg.trained_layers),
                      max_length=cfg.max_length, stride=cfg.max_length // 4, abstain_below=cfg.abstain_below)
    tokenizer = AutoTokenizer.from_pretrained(base)
    windows = featurize(examples, tokenizer, card)
    model = build_span_model()  # seeds torch with 0: every seed's heads start alike, and so does dropout's stream
    if cfg.init is not None:
        start_from_member(model, cfg)
    groups = freeze_base(model, cfg.trained_layers)
    groups[0]["lr"], groups[1]["lr"] = cfg.lr, cfg.head_lr
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    per_epoch = (len(windows) + cfg.batch_size - 1) // cfg.batch_size
    total = per_epoch * cfg.epochs if cfg.max_steps is None else min(per_epoch * cfg.epochs, cfg.max_steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, max(1, total // 10), total)
    step = resume(out, model, optimizer, scheduler)
    if export_only and step == 0:
        raise FileNotFoundError(f"{out}: no checkpoint to export")
    model.train()
    metrics = (out / "metrics.jsonl").open("a", encoding="utf-8")
    t0, done_at_start = time.perf_counter(), step
    while step < total and not export_only:
        epoch, i = divmod(step, per_epoch)
        order = epoch_order(len(windows), cfg.seed, epoch)
        batch = collate([windows[j] for j in order[i * cfg.batch_size:(i + 1) * cfg.batch_size]],
                        tokenizer.pad_token_id)
        loss = batch_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        elapsed = time.perf_counter() - t0
        row = {"step": step, "total": total, "epoch": epoch + 1, "loss": round(loss.item(), 4),
               "elapsed_s": round(elapsed, 1),
               "eta_s": round(elapsed / (step - done_at_start) * (total - step), 1)}
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()
        if progress is not None:
            progress(row)
        if step % cfg.save_every == 0 or step == total:
            save_train_state(out, step, model, optimizer, scheduler, cfg.trained_layers)
    metrics.close()
    card.trained.update({"by": "routerag train-reader", "windows": len(windows), "examples": len(examples),
                         "data": data_summary(examples), "epochs": cfg.epochs, "steps": step,
                         "scheduled_steps": total,
                         "trained_layers": list(cfg.trained_layers),
                         "batch_size": cfg.batch_size, "lr": cfg.lr, "head_lr": cfg.head_lr, "seed": cfg.seed,
                         **({"init": str(cfg.init), "init_member": cfg.init_member} if cfg.init else {}),
                         **(provenance or {})})
    final = out / "reader"
    with staged_directory(final) as tmp:
        save_reader(tmp, model.eval(), card)
    return final


MERGE_MUST_MATCH = ("base", "base_sha256", "trained_layers", "max_length", "stride", "max_answer_tokens")
"""Card fields every merged reader shares: the members read the same windows of the same base."""


def merge_readers(out: Path, folders: Sequence[Path]) -> ReaderCard:
    """One reader that averages the logits of several trained ones (``routerag merge-readers``): the seeds of one
    recipe disagree by up to 10 EM points on a set, and their mean reads better than either. Members of a merged
    reader are taken one by one; the first folder's abstention threshold is kept. Written atomically to ``out``."""
    from routerag.policy.extractive import member_files, read_reader_card

    if len(folders) < 2:
        raise ValueError("give two or more reader folders to merge")
    if any(Path(f).resolve() == out.resolve() for f in folders):
        raise ValueError(f"{out}: is one of the readers being merged; write the merged reader elsewhere")
    if out.is_dir() and any(out.iterdir()) and not (out / READER_CARD).is_file():
        raise FileExistsError(f"{out}: a folder that holds no reader; not replacing it")
    cards = [read_reader_card(f) for f in folders]
    for folder, card in zip(folders[1:], cards[1:]):
        for name in MERGE_MUST_MATCH:
            if getattr(card, name) != getattr(cards[0], name):
                raise ValueError(f"{folder}: its {name} ({getattr(card, name)}) differs from {folders[0]}'s "
                                 f"({getattr(cards[0], name)}); only readers of one base and featurisation merge")
    sources = [Path(f) / name for f, card in zip(folders, cards) for name in member_files(card)]
    tensor_names = [member_tensor_names(source) for source in sources]
    for source, names in zip(sources[1:], tensor_names[1:]):
        if names != tensor_names[0]:
            raise ValueError(f"{source}: holds other tensors than {sources[0]}")
    merged = cards[0].model_copy(update={"members": len(sources), "trained": {
        "by": "routerag merge-readers", "members": [{"from": str(f), **card.trained}
                                                    for f, card in zip(folders, cards)]}})
    with staged_directory(out) as tmp:
        for source, name in zip(sources, member_files(merged)):
            shutil.copyfile(source, tmp / name)
        (tmp / READER_CARD).write_text(merged.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return merged


def member_tensor_names(path: Path) -> frozenset[str]:
    """The tensor names of one weight file, read from its header: a missing or truncated file fails here, named,
    before anything is written."""
    from safetensors import safe_open

    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing")
    try:
        with safe_open(str(path), framework="pt") as fh:
            return frozenset(fh.keys())
    except Exception as exc:  # safetensors raises its own error types for a damaged header
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
