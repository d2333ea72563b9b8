"""What mode choice can win with the extractive reader, measured without the policy (seconds, not the router's hour).

Per question: one search of the question in each mode (k documents), the reader on each search's documents alone
and on the passage and graph searches' documents together. The table then scores, per set and pooled:

* each fixed mode (what `routerag eval --modes naive-*` scores, up to ties in batched retrieval);
* ``oracle``: the best mode per question, after the fact: the most a router that only picks the mode can reach;
* ``confident``: the mode whose answer the reader is most sure of (reading all three and picking by score);
* ``union``: one read of the passage and graph documents together.

``refusals`` prints refusal precision, recall and EM against the abstention threshold for one mode: the extractive
reader abstains below ``policy.abstain_below`` (the shipped card: 0.01), below the card's ``abstain_unsupported_below``
(0.03) on a span whose sentence does not say what the question asks, and below its ``abstain_unstated_below`` (0 on
the shipped card: off) when no document read says it.

    python benchmarks/mode_oracle.py run INDEX QUESTIONS --out rows/set.jsonl [--reader FOLDER] [--k 3]
    python benchmarks/mode_oracle.py table rows/*.jsonl [--threshold 0.01]
    python benchmarks/mode_oracle.py refusals rows/set.jsonl --mode hybrid
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from routerag.policy.extractive import read_reader_card, shipped_reader_path, span_refused

MODES = ("passage", "graph", "hybrid")
READS = MODES + ("union",)


def load_rows(path: Path) -> list[dict[str, Any]]:
    """``run``'s rows; a truncated or foreign line is a :class:`DatasetError` naming the file and line."""
    from routerag.evaluation.records import read_records

    return read_records(path, required=("answers", *READS))


def read_modes(index: Path, questions: Path, reader_folder: str | None, k: int) -> list[dict[str, Any]]:
    """One row per question: each read's answer (abstention off, so every span keeps its score), its EM, and
    whether its documents held a gold answer (the harness's answer recall)."""
    from routerag.config import Settings
    from routerag.datasets import load_questions
    from routerag.metrics import answer_in_documents, exact_match
    from routerag.policy.answer_types import QUANTITY_TYPES, answer_type
    from routerag.policy.extractive import load_reader
    from routerag.policy.loop import doc_key
    from routerag.policy.support import answer_supported, documents_state_asked
    from routerag.retrieval.retriever import Retriever

    items = load_questions(questions)
    retriever = Retriever(index, Settings().retrieval)
    reader = load_reader(reader_folder, 0.0)  # abstaining off: every span, scored; abstains() applies the rules
    texts = [it.question for it in items]
    found = {m: [r for i in range(0, len(texts), 16) for r in retriever.search(texts[i:i + 16], mode=m, k=k)]
             for m in MODES}
    rows = []
    for j, item in enumerate(items):
        docs = {m: list(found[m][j].docs) for m in MODES}
        union = list({doc_key(d): d for d in docs["passage"] + docs["graph"]}.values())
        row: dict[str, Any] = {"id": item.id, "question": item.question, "answers": list(item.answers),
                               "type": item.meta.get("type")}
        for name, shown in {**docs, "union": union}.items():
            read = reader.read_sync(item.question, shown)
            row[name] = {"answer": read.answer, "score": read.score, "kind": read.kind,
                         "supported": answer_supported(item.question, read.answer or "", read.citation),
                         "stated": documents_state_asked(item.question, shown),
                         "number": answer_type(item.question) in QUANTITY_TYPES,
                         "em": exact_match(read.answer, item.answers) if item.answers and read.answer else 0.0,
                         "in_docs": answer_in_documents([f"{d.title} {d.text}" for d in shown], item.answers)}
        rows.append(row)
    return rows


CARD = read_reader_card(shipped_reader_path())
"""The shipped reader card: its abstention thresholds, ``abstain_below`` replaced by the threshold asked for."""


def abstains(read: dict[str, Any], threshold: float) -> bool:
    """The shipped card's abstention rules with ``abstain_below`` at ``threshold``; yes/no and choice reads always
    answer (rows written before a field existed count as supported and stated, and not as numbers)."""
    if read.get("kind", "span") != "span":
        return False
    return span_refused(read["score"], CARD.model_copy(update={"abstain_below": threshold}),
                        lambda: read.get("supported", True), lambda: read.get("stated", True),
                        number=read.get("number", False))


def scored(row: dict[str, Any], read: dict[str, Any], threshold: float) -> float:
    """The harness's EM for one read: an abstention is right only on an unanswerable question, and an answer only
    when it matches."""
    if not row["answers"]:
        return float(abstains(read, threshold))
    return 0.0 if abstains(read, threshold) else read["em"]


def columns(rows: Sequence[dict[str, Any]], threshold: float) -> dict[str, float]:
    """Summed EM of each fixed read, the oracle over the modes, and the most confident mode."""
    out = {name: sum(scored(r, r[name], threshold) for r in rows) for name in READS}
    out["oracle"] = sum(max(scored(r, r[m], threshold) for m in MODES) for r in rows)
    out["confident"] = sum(scored(r, max((r[m] for m in MODES), key=lambda x: x["score"]), threshold) for r in rows)
    return out


def table(files: Sequence[Path], threshold: float) -> str:
    names = READS + ("oracle", "confident")
    lines = ["| set | n | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    pooled: dict[str, float] = dict.fromkeys(names, 0.0)
    total = 0
    for path in files:
        rows = load_rows(path)
        cols = columns(rows, threshold)
        total += len(rows)
        for name in names:
            pooled[name] += cols[name]
        lines.append(f"| {path.stem} | {len(rows)} | " + " | ".join(f"{100 * cols[n] / len(rows):.1f}" for n in names)
                     + " |")
    if len(files) > 1 and total:
        lines.append(f"| pooled | {total} | " + " | ".join(f"{100 * pooled[n] / total:.1f}" for n in names) + " |")
    return "\n".join(lines)


def refusals(rows: Sequence[dict[str, Any]], mode: str, thresholds: Sequence[float]) -> str:
    """Refusal precision and recall, and EM, as the abstention threshold moves."""
    unanswerable = sum(not r["answers"] for r in rows)
    lines = ["| threshold | refused | precision | recall | EM |", "|---|---|---|---|---|"]
    for t in thresholds:
        refused = [r for r in rows if abstains(r[mode], t)]
        right = sum(not r["answers"] for r in refused)
        precision = f"{right / len(refused):.2f}" if refused else "—"
        recall = f"{right / unanswerable:.2f}" if unanswerable else "—"
        em = 100 * sum(scored(r, r[mode], t) for r in rows) / len(rows)
        lines.append(f"| {t:g} | {len(refused)} | {precision} | {recall} | {em:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="search and read every question of a set")
    run.add_argument("index", type=Path)
    run.add_argument("questions", type=Path)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--reader", help="an extractive reader folder (default: the shipped one)")
    run.add_argument("--k", type=int, default=3)
    tab = sub.add_parser("table", help="EM per set and pooled, from run's rows")
    tab.add_argument("rows", type=Path, nargs="+")
    tab.add_argument("--threshold", type=float, default=CARD.abstain_below)
    ref = sub.add_parser("refusals", help="refusal precision and recall against the abstention threshold")
    ref.add_argument("rows", type=Path)
    ref.add_argument("--mode", choices=READS, default="hybrid")
    args = ap.parse_args(argv)
    if args.command == "run":
        rows = read_modes(args.index, args.questions, args.reader, args.k)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"{len(rows)} questions -> {args.out}")
    elif args.command == "table":
        print(table(args.rows, args.threshold))
    else:
        print(refusals(load_rows(args.rows), args.mode, (0.0005, 0.001, 0.003, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)))


if __name__ == "__main__":
    main()
