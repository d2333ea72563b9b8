"""Two extractive readers compared on the same trajectories, without running the policy again.

    python benchmarks/reread_records.py INDEX_DIR RUN_DIR --reader FOLDER [--reader FOLDER ...] [--out rows.jsonl]

`routerag eval` records which documents each question's trajectory read (``doc_ids``). The searches do not depend
on the reader's refusal rule: with the same policy, a second reader card changes only the final read. So a card (its
abstention thresholds, say) can be measured on a finished run in minutes instead of the router's hour, and paired,
question by question, against the card that ran. This reads every record of every ``<set>/<strategy>.jsonl`` under
``RUN_DIR`` again with each ``--reader`` (a folder with ``reader_card.json``; ``shipped`` for the packaged reader),
scores the answers as the harness does (a right refusal counts 1), and prints per set and strategy, and pooled per
strategy: EM, refusals, refusal precision and recall, and refusals whose documents held the answer.

Cards with the same weight files share one forward pass per record (:class:`SharedForward`): four rule variants of
one reader cost little more than one.

Records whose trajectory never reached the reader (``finish`` ``no_answer`` or ``error``) keep their recorded
outcome. ``changed`` counts the records whose first reader's answer differs from the recorded one: 0 when the first
``--reader`` is the card that ran (the check that the replay is faithful).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routerag.datasets import DatasetError  # noqa: E402
from routerag.evaluation.records import (read_records, reader_for_replay, record_documents,  # noqa: E402
                                         refusal_scores, reread_em)

REQUIRED = ("id", "question", "answers", "prediction", "refused", "em", "doc_ids")
"""What a record must hold to be read again (every `routerag eval` record since documents were recorded)."""
NOT_READ = ("no_answer", "error")
"""Trajectories that ended before the reader read: their recorded outcome stands under every card."""


class SharedForward:
    """The span model's forward pass, kept for the last input: readers whose cards differ only in their rules
    (thresholds, ``whole_names``) run the same weights on the same windows, so the second and later cards re-read a
    record without a second pass (the pass is most of a read's time)."""

    def __init__(self, model: Any) -> None:
        self.model, self._key, self._out = model, None, None

    def __call__(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
        key = (tuple(input_ids.shape), input_ids.numpy().tobytes(), token_type_ids.numpy().tobytes())
        if key != self._key:
            self._key, self._out = key, self.model(input_ids, attention_mask, token_type_ids)
        return self._out


def share_forward(readers: dict[str, Any]) -> None:
    """Readers with the same weight files (by content) share one :class:`SharedForward`."""
    import hashlib

    from routerag.policy.extractive import member_files

    shared: dict[tuple[str, ...], SharedForward] = {}
    for reader in readers.values():
        key = tuple(hashlib.sha256((reader.folder / f).read_bytes()).hexdigest() for f in member_files(reader.card))
        reader.model = shared.setdefault(key, SharedForward(reader.model))


def run_files(run_dir: Path) -> list[Path]:
    """Every ``<set>/<strategy>.jsonl`` record file of a ``routerag eval`` output folder."""
    files = sorted(p for p in run_dir.glob("*/*.jsonl"))
    if not files:
        raise SystemExit(f"{run_dir}: no <set>/<strategy>.jsonl records (the --out folder of `routerag eval`)")
    return files


def reread(record: dict[str, Any], reader: Any, passages: dict[str, Any]) -> dict[str, Any]:
    """The record's outcome under ``reader``: its documents (in the order read, whole, as the loop gives the
    extractive reader) read again and scored as the harness scores."""
    if record.get("finish") in NOT_READ:
        return {"prediction": record["prediction"], "refused": record["refused"], "em": record["em"]}
    try:
        docs = record_documents(record, passages, strict=True)  # distinct already
    except DatasetError as e:
        raise SystemExit(str(e)) from None
    read = reader.read_sync(record["question"], docs)
    return {"prediction": read.answer, "refused": read.abstained, "em": reread_em(record, read.answer)}


def scores(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """EM (%), refusals and the harness's refusal scores over re-read records."""
    n = len(records)
    out: dict[str, Any] = {"n": n, "em": 100 * sum(r["em"] for r in records) / n if n else None,
                           "refused": sum(1 for r in records if r["refused"])}
    out.update(refusal_scores(records))
    return out


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def table(results: dict[tuple[str, str], dict[str, list[dict[str, Any]]]], readers: Sequence[str]) -> list[str]:
    """Markdown rows: each set and strategy, then each strategy pooled over the sets, one row per reader."""
    lines = ["| set | strategy | reader | n | EM | refused | precision | recall | refused with answer % | changed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    pooled: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    rows = list(results.items())
    for (qset, strategy), by_reader in rows:
        for name in readers:
            pooled[strategy][name].extend(by_reader[name])
    rows += [(("pooled", strategy), by_reader) for strategy, by_reader in pooled.items()]
    for (qset, strategy), by_reader in rows:
        for name in readers:
            recs = by_reader[name]
            s = scores(recs)
            rwa = None if s["refused_with_answer"] is None else 100 * s["refused_with_answer"]
            changed = sum(1 for r in recs if r["changed"])
            lines.append(f"| {qset} | {strategy} | {name} | {s['n']} | {_fmt(s['em'], 1)} | {s['refused']} | "
                         f"{_fmt(s['refusal_precision'])} | {_fmt(s['refusal_recall'])} | {_fmt(rwa, 1)} | "
                         f"{changed} |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index", type=Path, help="the index the run searched")
    ap.add_argument("run", type=Path, help="a `routerag eval --out` folder")
    ap.add_argument("--reader", action="append", required=True,
                    help="a reader folder (reader_card.json and weights), or 'shipped'; repeat to compare")
    ap.add_argument("--out", type=Path, help="also write every re-read record here (JSON lines)")
    args = ap.parse_args(argv)

    from graph_index.store import IndexData

    with IndexData(args.index) as data:  # only the passages: no retriever (FAISS, graph, embedder) to load
        passages = {p.id: p for p in data.passages}
    readers = {name: reader_for_replay(name) for name in dict.fromkeys(args.reader)}
    share_forward(readers)
    first = next(iter(readers))
    results: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    out = args.out.open("w", encoding="utf-8") if args.out else None
    for path in run_files(args.run):
        try:
            records = read_records(path, required=REQUIRED)
        except DatasetError as exc:  # a truncated or foreign line: say which file and line, no traceback
            raise SystemExit(str(exc)) from None
        by_reader: dict[str, list[dict[str, Any]]] = {name: [] for name in readers}
        for rec in records:  # every card on one record before the next: they share its forward pass
            for name, reader in readers.items():
                new = {**rec, **reread(rec, reader, passages), "reader": name}
                new["changed"] = name == first and (new["refused"] != rec["refused"] or
                                                    (not rec["refused"] and new["prediction"] != rec["prediction"]))
                by_reader[name].append(new)
                if out:
                    out.write(json.dumps(new) + "\n")
        results[(path.parent.name, path.stem)] = by_reader
    if out:
        out.close()
    print("\n".join(table(results, list(readers))))


if __name__ == "__main__":
    main()
