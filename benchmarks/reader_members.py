"""What a merged extractive reader costs to read with: one member against the shipped reader's members, side by side.

    python benchmarks/reader_members.py [--reader FOLDER] [--rounds 20]

Reads the sample corpus's questions, each with three of its passages, alternating a one-member reader (the folder's
first weight file) and the whole folder, in one process, and prints ms per question for each and their ratio.
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

from routerag.policy.extractive import ExtractiveReader, shipped_reader_path  # noqa: E402
from routerag.retrieval.types import RetrievedDoc  # noqa: E402


def sample_reads() -> list[tuple[str, list[RetrievedDoc]]]:
    """Each sample question with three passages of the sample corpus (the same three for every reader)."""
    samples = ROOT / "routerag" / "samples"
    rows = [json.loads(line) for line in (samples / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    docs = [RetrievedDoc(str(i), r["title"], r["text"], 0.0) for i, r in enumerate(rows)]
    questions = [json.loads(line)["question"]
                 for line in (samples / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    return [(q, docs[i % len(docs):i % len(docs) + 3] or docs[:3]) for i, q in enumerate(questions)]


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
            t0 = time.perf_counter()
            for question, docs in reads:
                reader.read_sync(question, docs)
            times[name].append(1000 * (time.perf_counter() - t0) / len(reads))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ms in medians.items():
        print(f"{name}: {ms:.1f} ms per question (median of {args.rounds} rounds of {len(reads)} questions)")
    first, second = medians.values()
    print(f"ratio: {second / first:.2f}")


if __name__ == "__main__":
    main()
