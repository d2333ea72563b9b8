"""Does a second search pay with this reader? Rereads a `two-search` run's documents three ways (issue #36).

    python benchmarks/reader_hops.py RUN/two-search.jsonl INDEX/passages.jsonl

For every question of a `routerag eval --modes two-search` run it reads, with the shipped extractive reader:
the first search's documents (``first``), all documents of both searches (``all``, what the pipeline does), and all
of them joined into one text so that one window can hold both hops (``joined``). It prints the EM of each, and of
the better of ``first`` and ``all`` per question (``oracle``, an upper bound for any rule choosing between them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from routerag.metrics import exact_match
from routerag.policy.extractive import ReaderAnswer, load_reader
from routerag.retrieval.types import RetrievedDoc


def passages_by_id(path: Path, wanted: set[str]) -> dict[str, dict[str, Any]]:
    """Only the passages the run retrieved: an index's passages file can be large."""
    found = {}
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            if row["id"] in wanted:
                found[row["id"]] = row
    return found


def score(answer: ReaderAnswer, golds: list[str]) -> float:
    """EM; an unanswerable question (no gold) scores 1 when the reader abstains, as the harness counts it."""
    if not golds:
        return float(answer.answer is None)
    return exact_match(answer.answer, golds) if answer.answer else 0.0


def reads(reader: Any, record: dict[str, Any], passages: dict[str, dict[str, Any]], k: int) -> dict[str, float]:
    """The EM of one question under each way of reading its documents."""
    rows = [passages[i] for i in record["doc_ids"]]
    docs = [RetrievedDoc(id=r["id"], title=r.get("title", ""), text=r["text"], score=0.0) for r in rows]
    joined = RetrievedDoc(id="joined", title="", score=0.0,
                          text=" ".join(f"{r.get('title', '')}: {r['text']}" for r in rows))
    golds = record["answers"]
    out = {"first": score(reader.read_sync(record["question"], docs[:k]), golds),
           "all": score(reader.read_sync(record["question"], docs), golds),
           "joined": score(reader.read_sync(record["question"], [joined]), golds)}
    out["oracle"] = max(out["first"], out["all"])
    return out


def main(run: str, passages_path: str, k: int = 3) -> None:
    records = [json.loads(line) for line in Path(run).open()]
    passages = passages_by_id(Path(passages_path), {i for r in records for i in r["doc_ids"]})
    reader = load_reader()
    totals: dict[str, float] = {}
    for record in records:
        for way, em in reads(reader, record, passages, k).items():
            totals[way] = totals.get(way, 0.0) + em
    print(f"{len(records)} questions, EM (count):", json.dumps(totals))


if __name__ == "__main__":
    main(*sys.argv[1:3])
