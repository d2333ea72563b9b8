"""``routerag train-reader``: fine-tune the extractive reader (:mod:`routerag.policy.extractive`) on CPU;
``routerag merge-readers``: one reader averaging several."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import console, handle_errors, setup_logging

DATA = Path("../shared/data")


def register(app: typer.Typer) -> None:
    app.command("train-reader")(train_reader_cmd)
    app.command("merge-readers")(merge_readers_cmd)


@handle_errors
def train_reader_cmd(
    popqa: Annotated[Optional[Path], typer.Option(
        help="PopQA's popqa_dev.json; its first 300 after random.Random(0).shuffle train, the last 200 are held "
             "out and never read.")] = DATA / "popqa/popqa_dev.json",
    hotpot: Annotated[Optional[Path], typer.Option(
        help="hotpotqa_100.json; half of each question type (random.Random(0)) trains, the rest is held out.")]
        = DATA / "hotpotqa_100/hotpotqa_100.json",
    index: Annotated[Optional[Path], typer.Option(
        help="An index over PopQA's corpus: each training question's retrieved documents become examples too "
             "(recommended: they are what the reader meets when serving).")] = None,
    questions: Annotated[Optional[list[Path]], typer.Option(
        "--questions", help="A `routerag make-questions` file from a TRAINING corpus (repeatable): its questions "
                            "on their gold passages, and its comparisons asked as yes/no.")] = None,
    questions_index: Annotated[Optional[list[Path]], typer.Option(
        "--questions-index", help="The index each --questions file was derived from, one per file in the same "
                                  "order: each question's highest-ranked graph document (k 3) that is not gold "
                                  "and does not hold its answer becomes a 'no answer here' example. Measured, it "
                                  "trades answers for refusals (docs/research/2026-12-01-retrieved-distractors-as-"
                                  "a-third-reader.md).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoints, metrics.jsonl, reader/.")]
        = Path("runs/reader"),
    epochs: Annotated[int, typer.Option(min=1)] = 1,
    max_steps: Annotated[Optional[int], typer.Option(min=1, help="Stop after this many steps (the learning rate "
                                                                 "schedule ends there): a run bounded in time.")]
        = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    lr: Annotated[float, typer.Option(help="Learning rate of the trained encoder layers.")] = 2e-4,
    head_lr: Annotated[float, typer.Option(help="Learning rate of the span and yes/no heads.")] = 2e-3,
    layers: Annotated[str, typer.Option(help="MiniLM layers to train and ship, comma-separated (0-5).")] = "4,5",
    max_length: Annotated[int, typer.Option(min=64, max=512, help="Tokens per window (the stride between "
                                                                   "windows is a quarter of it).")] = 128,
    save_every: Annotated[int, typer.Option(min=1, help="Checkpoint every N steps.")] = 25,
    threads: Annotated[int, typer.Option(min=1, help="torch threads.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the batch order (every seed's heads start from one "
                                           "initialisation): two seeds of one recipe tell a gain from retraining "
                                           "noise.")] = 0,
    init: Annotated[Optional[Path], typer.Option(
        "--init", help="A trained reader folder to fine-tune instead of starting from the base MiniLM "
                       "(routerag/policy/weights/minilm-reader: the shipped one); --layers must be its layers.")]
        = None,
    init_member: Annotated[int, typer.Option(min=0, help="Which member of --init's reader to start from "
                                                         "(0 = reader.safetensors).")] = 0,
    export: Annotated[bool, typer.Option("--export", help="Train nothing: write OUT/reader from the latest "
                                                          "checkpoint of a run stopped early.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Train the extractive reader from the training splits; rerun with the same --out to resume. Writes
    OUT/reader (the trained layers in fp16 and reader_card.json); copy it to routerag/policy/weights/minilm-reader
    to ship it."""
    setup_logging(verbose)
    import torch

    from training.reader_data import build_examples, data_summary, question_source
    from training.reader_train import ReaderTrainConfig, train_reader

    torch.set_num_threads(threads)
    for name, path in (("--popqa", popqa), ("--hotpot", hotpot), ("--index", index),
                       *(("--questions", q) for q in questions or []),
                       *(("--questions-index", q) for q in questions_index or []), ("--init", init)):
        if path is not None and not path.exists():
            raise FileNotFoundError(f"{name} {path}: no such file or folder")
    if popqa is None and hotpot is None and not questions:
        raise ValueError("give --popqa, --hotpot or --questions: there is nothing to train on")
    trained = tuple(int(x) for x in layers.split(",") if x.strip())
    if not trained or any(not 0 <= x <= 5 for x in trained):
        raise ValueError(f"--layers {layers!r}: give MiniLM layers between 0 and 5, e.g. 3,4,5")
    examples = build_examples(popqa, hotpot, index, questions or [], questions_index or [])
    console.print(f"{len(examples)} examples: {data_summary(examples)}")
    cfg = ReaderTrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, head_lr=head_lr, trained_layers=trained,
                            max_length=max_length, save_every=save_every, max_steps=max_steps, seed=seed,
                            init=init, init_member=init_member)
    provenance = {"popqa": "first 300 of popqa_dev.json after random.Random(0).shuffle" if popqa else None,
                  "hotpot": "first half of each type of hotpotqa_100.json after random.Random(0).shuffle"
                  if hotpot else None, "retrieved_from": str(index) if index else None,
                  "questions": [question_source(q) for q in questions or []],
                  "questions_retrieved_from": [str(q) for q in questions_index or []] or None}

    def show(row: dict) -> None:
        if row["step"] % 5 == 0 or row["step"] == row["total"]:
            console.print(f"step {row['step']}/{row['total']} epoch {row['epoch']} loss {row['loss']:.3f} "
                          f"{row['elapsed_s']:.0f}s elapsed, ~{row['eta_s']:.0f}s left")

    final = train_reader(examples, out, cfg, provenance=provenance, progress=show, export_only=export)
    console.print(f"reader written to {final}")


@handle_errors
def merge_readers_cmd(
    readers: Annotated[list[Path], typer.Argument(help="Two or more reader folders (each `train-reader`'s "
                                                       "OUT/reader), trained on one base with one --max-length.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The merged reader's folder (replaced if it holds a "
                                                          "reader).")],
) -> None:
    """One reader that averages the span and yes/no logits of several: train one recipe with two --seed values and
    merge them, since a single run's answers move by up to 10 EM points on a set with its seed. Reading costs one
    forward pass per member."""
    from training.reader_train import merge_readers

    card = merge_readers(out, readers)
    console.print(f"reader of {card.members} members written to {out}")
