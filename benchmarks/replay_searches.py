"""The retrieval cost of a policy's decisions, measured apart from the run that made them.

    python benchmarks/replay_searches.py INDEX_DIR RECORDS.jsonl [RECORDS.jsonl ...] [-k 3] [--repeats 5]
        [--out results.json]

`routerag eval` records each question's searches (query and mode) and their wall time. That time also depends on
what else ran: how many searches shared a batch, what the machine was doing (on 2 cores the median passage search
took 12.6 ms in one evaluation and 20.3 ms in the next). Comparing two policies (say, before and after stage-2 training) by it compares their runs as much
as their choices. This replays every recorded search alone, one query at a time, through one retriever in one
process, the record files interleaved and their order rotated every repeat, and reports per file the retrieval
milliseconds per question (the mean over questions; the median of the repeats) and per search by mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routerag.config import RetrievalConfig  # noqa: E402
from routerag.datasets import DatasetError  # noqa: E402
from routerag.evaluation.records import read_records  # noqa: E402
from routerag.retrieval import Retriever  # noqa: E402
from routerag.retrieval.types import QueryError  # noqa: E402
from routerag.runtime import configure_threads  # noqa: E402


def load_records(path: Path) -> list[dict]:
    """(id, [(mode, query), …]) per question of a ``routerag eval`` record file."""
    rows = []
    for rec in read_records(path, required=("id", "modes", "queries")):
        if len(rec["modes"]) != len(rec["queries"]):
            raise DatasetError(f"{path}: record {rec['id']}: {len(rec['modes'])} modes for {len(rec['queries'])} "
                               "queries")
        rows.append({"id": str(rec["id"]), "searches": list(zip(rec["modes"], rec["queries"]))})
    return rows


def replay(retriever: Retriever, rows: list[dict], k: int) -> tuple[list[float], dict[str, list[float]]]:
    per_question, per_mode = [], defaultdict(list)
    for row in rows:
        total = 0.0
        for mode, query in row["searches"]:
            t = time.perf_counter()
            try:
                retriever.search([query], mode=mode, k=k)
            except QueryError:
                continue  # the policy's turn failed in the run too
            ms = (time.perf_counter() - t) * 1000
            per_mode[mode].append(ms)
            total += ms
        per_question.append(total)
    return per_question, per_mode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index")
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    configure_threads()
    try:
        files = {str(p): load_records(p) for p in args.records}
    except DatasetError as exc:
        raise SystemExit(str(exc)) from exc
    retriever = Retriever(args.index, RetrievalConfig())
    retriever.warm_up()
    for rows in files.values():  # one untimed pass: caches and lazily built structures
        replay(retriever, rows, args.k)
    means: dict[str, list[float]] = defaultdict(list)
    modes: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in files}
    names = list(files)
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            per_q, per_mode = replay(retriever, files[name], args.k)
            means[name].append(statistics.fmean(per_q) if per_q else 0.0)
            for m, v in per_mode.items():
                modes[name][m].extend(v)
    out = {}
    for name, rows in files.items():
        n_search = sum(len(r["searches"]) for r in rows)
        out[name] = {
            "questions": len(rows), "searches_per_question": round(n_search / max(len(rows), 1), 3),
            "retrieval_ms_per_question": round(statistics.median(means[name]), 2),
            "repeats_ms_per_question": [round(x, 2) for x in means[name]],
            "mode_searches": {m: len(v) // args.repeats for m, v in modes[name].items()},
            "ms_per_search_by_mode": {m: round(statistics.median(v), 2) for m, v in modes[name].items()},
        }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
