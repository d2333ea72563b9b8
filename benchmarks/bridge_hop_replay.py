"""What `policy.search_bridge_below` would do to a finished run, for several thresholds, without the policy.

    python benchmarks/bridge_hop_replay.py INDEX_DIR RECORDS.jsonl [RECORDS.jsonl ...] [--tau 0.05 --tau 0.1 ...]
        [--budget 2] [--reader FOLDER] [--out rows.jsonl]

The loop's bridge hop (`routerag/policy/loop.py`, `_search_bridge`) comes after the trajectory's own searches: the
reader reads what they found and, when it answers with a free span scoring below the threshold, the loop searches
the first search's top document's new entity (`new_entity`), in that search's mode, for documents not shown yet, and
the reader reads everything. Neither step depends on the policy once its searches are recorded, so a `routerag eval`
record (its ``doc_ids`` in retrieval order, its ``modes``, its ``searches``) is enough: this reads each record's
documents with the shipped reader or ``--reader``'s card (its score decides), runs the hop once with the real
retriever, reads again, and prints per file and pooled the EM (a right refusal counts 1) at every threshold, with
the number of hops. A record that searched ``--budget`` times (the card's 2) or read a choice or yes/no answer is
not hopped from, as in the loop.
The re-read without the hop should reproduce the recorded EM: ``replayed`` counts the records where it does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routerag.datasets import DatasetError  # noqa: E402
from routerag.evaluation.records import (read_records, reader_for_replay, record_documents,  # noqa: E402
                                         reread_em)

REQUIRED = ("id", "question", "answers", "em", "doc_ids", "modes", "searches")
TAUS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3)


def replay(record: dict[str, Any], retriever: Any, reader: Any, passages: dict[str, Any], k: int) -> dict[str, Any]:
    """The record's read (score, kind, EM) and, where a bridge exists, the EM after the hop."""
    from routerag.policy.grounding import new_entity
    from routerag.policy.loop import doc_key, unseen_documents

    docs = record_documents(record, passages, strict=True)
    read = reader.read_sync(record["question"], docs)
    row = {"id": record["id"], "em": record["em"], "em_read": reread_em(record, read.answer), "score": read.score,
           "abstained": read.abstained, "kind": read.kind, "searches": record["searches"]}
    bridge = new_entity(record["question"], docs[0]) if docs and record["modes"] else None
    if bridge is not None:
        shown = {doc_key(d) for d in docs}
        found = retriever.search([bridge], mode=record["modes"][0], k=k + len(shown))[0].docs
        row["bridge"] = bridge
        hopped = reader.read_sync(record["question"], docs + unseen_documents(found, shown, k))
        row["em_hop"] = reread_em(record, hopped.answer)
    return row


def hops(row: dict[str, Any], tau: float, budget: int) -> bool:
    """Whether the loop would hop from this read at ``tau`` (the loop's `_search_bridge` conditions)."""
    unsure = not row["abstained"] and row["score"] < tau
    return unsure and row["kind"] == "span" and row["searches"] < budget and "em_hop" in row


def table(files: dict[str, list[dict[str, Any]]], taus: Sequence[float], budget: int) -> list[str]:
    names = list(files) + (["pooled"] if len(files) > 1 else [])
    rows = {**files, "pooled": [r for rs in files.values() for r in rs]}
    lines = ["| threshold | " + " | ".join(f"{n} (n {len(rows[n])})" for n in names) + " | hops |",
             "|---" * (len(names) + 2) + "|"]
    for tau in (0.0, *taus):
        cells = []
        for n in names:
            em = sum(r["em_hop"] if hops(r, tau, budget) else r["em_read"] for r in rows[n])
            cells.append(f"{100 * em / max(len(rows[n]), 1):.1f}")
        count = sum(hops(r, tau, budget) for r in rows["pooled"])
        lines.append(f"| {tau:g}{' (off)' if tau == 0 else ''} | " + " | ".join(cells) + f" | {count} |")
    lines.append("replayed: " + ", ".join(f"{n} {sum(r['em_read'] == r['em'] for r in rs)}/{len(rs)}"
                                          for n, rs in files.items()))
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index", type=Path, help="the index the run searched")
    ap.add_argument("records", type=Path, nargs="+", help="<strategy>.jsonl files of `routerag eval`")
    ap.add_argument("--tau", type=float, action="append", help=f"thresholds (default {', '.join(map(str, TAUS))})")
    ap.add_argument("--budget", type=int, default=2, help="the loop's budget (the embedded router's card: 2)")
    ap.add_argument("-k", type=int, default=3, help="documents per search (the card's k)")
    ap.add_argument("--reader", default="shipped",
                    help="a reader folder (reader_card.json and weights), or 'shipped' (the packaged reader)")
    ap.add_argument("--out", type=Path, help="also write every replayed record here (JSON lines)")
    args = ap.parse_args(argv)

    from routerag.retrieval import Retriever

    reader = reader_for_replay(args.reader)
    retriever = Retriever(args.index)
    passages = {p.id: p for p in retriever.data.passages}
    files: dict[str, list[dict[str, Any]]] = {}
    out = args.out.open("w", encoding="utf-8") if args.out else None
    for path in args.records:
        try:
            records = read_records(path, required=REQUIRED)
        except DatasetError as exc:  # a truncated or foreign line: its file and line, no traceback
            raise SystemExit(str(exc)) from None
        try:
            rows = [replay(rec, retriever, reader, passages, args.k) for rec in records]
        except DatasetError as exc:  # a run over another index
            raise SystemExit(f"{path}: {exc}") from None
        files[f"{path.parent.name}/{path.stem}"] = rows
        for row in rows if out else []:
            out.write(json.dumps({"file": str(path), **row}) + "\n")
    if out:
        out.close()
    print("\n".join(table(files, args.tau or TAUS, args.budget)))


if __name__ == "__main__":
    main()
