"""What a merged extractive reader costs to read with: one member against the shipped reader's members, side by side;
and what a choice question ("Which opened first, A or B?") costs against a plain one over the same passages.

    python benchmarks/reader_members.py [--reader FOLDER] [--rounds 20]

Reads the sample corpus's questions, each with three of its passages, alternating a one-member reader (the folder's
first weight file) and the whole folder, in one process, and prints ms per question for each and their ratio. Then
reads choice questions and plain questions naming the same two things over the same six passages, alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLES = ROOT / "routerag" / "samples"

from routerag.policy.extractive import ExtractiveReader, shipped_reader_path  # noqa: E402
from routerag.retrieval.types import RetrievedDoc  # noqa: E402


def corpus_docs() -> list[RetrievedDoc]:
    rows = [json.loads(line) for line in (SAMPLES / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    return [RetrievedDoc(str(i), r["title"], r["text"], 0.0) for i, r in enumerate(rows)]


def sample_reads() -> list[tuple[str, list[RetrievedDoc]]]:
    """Each sample question with three passages of the sample corpus (the same three for every reader)."""
    docs = corpus_docs()
    questions = [json.loads(line)["question"]
                 for line in (SAMPLES / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    return [(q, docs[i % len(docs):i % len(docs) + 3] or docs[:3]) for i, q in enumerate(questions)]


CHOICE_PAIRS = [("Which opened first, the Halvard Opera House or the Tessaly Conservatory?",
                 "When did the Halvard Opera House open, and the Tessaly Conservatory?"),
                ("Who was born first, Marisol Vantreigh or Idris Calloway?",
                 "When were Marisol Vantreigh and Idris Calloway born?")]
"""A choice question and a plain one naming the same two things: the choice path's option search and year rule are
the difference."""
CHOICE_PAGES = ("Marisol Vantreigh", "Idris Calloway", "Halvard Opera House", "Tessaly Conservatory", "Kestrel Harbor",
                "The Glass Lighthouse")
"""The six passages every question of :data:`CHOICE_PAIRS` is read with: the four things named, and two beside them."""


def timed(reader: ExtractiveReader, reads: list[tuple[str, list[RetrievedDoc]]]) -> float:
    """ms per question for one pass over ``reads``."""
    t0 = time.perf_counter()
    for question, docs in reads:
        reader.read_sync(question, docs)
    return 1000 * (time.perf_counter() - t0) / len(reads)


def print_ratio(times: dict[str, list[float]], rounds: int, per_round: int) -> None:
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ms in medians.items():
        print(f"{name}: {ms:.1f} ms per question (median of {rounds} rounds of {per_round} questions)")
    first, second = medians.values()
    print(f"ratio: {second / first:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reader", type=Path, default=shipped_reader_path())
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    whole = ExtractiveReader(args.reader)
    one = ExtractiveReader(args.reader)
    one.card = one.card.model_copy(update={"members": 1})
    one.model = one.model.members[0] if hasattr(one.model, "members") else one.model
    reads = sample_reads()
    times: dict[str, list[float]] = {"one member": [], f"{whole.card.members} members": []}
    for _ in range(args.rounds):
        for name, reader in zip(times, (one, whole)):
            times[name].append(timed(reader, reads))
    print_ratio(times, args.rounds, len(reads))
    passages = [d for d in corpus_docs() if d.title in CHOICE_PAGES]
    kinds = {"plain question": [(plain, passages) for _, plain in CHOICE_PAIRS],
             "choice question": [(choice, passages) for choice, _ in CHOICE_PAIRS]}
    times = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, kind_reads in kinds.items():
            times[name].append(timed(whole, kind_reads))
    print_ratio(times, args.rounds, len(CHOICE_PAIRS))


if __name__ == "__main__":
    main()
