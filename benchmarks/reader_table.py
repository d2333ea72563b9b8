"""The issue-40 table (docs/results.md): the generative and the extractive reader on the same documents, one row per
held-out set and reader, from `routerag eval` reports (REPORTS/<set>-generative and REPORTS/<set>-extractive, each
run with one `--modes naive-*` strategy; the extractive one with ROUTERAG_POLICY__READER=extractive).

    python benchmarks/reader_table.py REPORTS popqa hotpot twowiki sample
"""

from __future__ import annotations

import sys
from pathlib import Path

from routerag.evaluation import summarize
from routerag.evaluation.records import read_records


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def row(folder: Path) -> list[str] | None:
    """The set's one strategy, summarised from its records (a run still going counts what it finished)."""
    files = sorted(folder.glob("*/*.jsonl"))
    if not files:
        return None
    s = summarize(read_records(files[0]))
    return [files[0].stem, str(s["questions"]), pct(s["em"]), pct(s["f1"]), pct(s["answer_recall"]),
            pct(s["refusal_rate"]), pct(s["refusal_recall"]), f"{s['generation_ms']:.0f}"]


def main(reports: Path, sets: list[str]) -> None:
    print("| held-out set | strategy | reader | n | EM | F1 | answer recall | abstained % | abstained when unanswerable % "
          "| reader ms/q |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in sets:
        for reader in ("generative", "extractive"):
            cells = row(reports / f"{name}-{reader}")
            if cells is not None:
                print(f"| {name} | {cells[0]} | {reader} | " + " | ".join(cells[1:]) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
