"""The router's results tables (docs/results.md) from `routerag eval` records: per held-out set, one row per strategy
run, then the sets pooled, then each router's routing by question type.

    python benchmarks/router_table.py SPEC.json

SPEC.json names the sets and, per set, the rows: a label, the run's folder (a `routerag eval --out` folder, or the
data set's folder inside it) and the strategy whose records to read (``learned``, ``naive-graph``, ...)::

    {"sets": [{"name": "HotpotQA held-out half", "index": "indexes/hotpot",
               "rows": [["the shipped router", "reports/hotpot-shipped", "learned"],
                        ["one hybrid search", "reports/hotpot-fixed", "naive-hybrid"]]}]}

Under each table, each router against the set's best single search (the one with the highest EM there), question by
question, with the sign test's p. The query column counts a router's queries: grounded (the question, a span of it,
or a title, entity or noun chunk of a document the run retrieved; :func:`routerag.policy.grounding.is_grounded`),
the question itself, all. The pooled table weighs every question once, over the sets where the row's label appears
in all of them.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graph_index.store import IndexData
from routerag.evaluation import summarize
from routerag.evaluation.records import read_records, record_documents
from routerag.policy.grounding import is_grounded

HEADER = ("| {name} | n | EM | F1 | answer recall | searches | retrieval ms/q | refusal % | refusal P | refusal R | "
          "refused with answer % | queries: grounded / question / all |")
RULE = "|---|---|---|---|---|---|---|---|---|---|---|---|"


def records_file(folder: Path, strategy: str) -> Path:
    """The strategy's records in an eval folder (its data set's sub-folder when there is one)."""
    direct = folder / f"{strategy}.jsonl"
    if direct.exists():
        return direct
    found = sorted(folder.glob(f"*/{strategy}.jsonl"))
    if not found:
        raise FileNotFoundError(f"no {strategy}.jsonl in {folder}")
    return found[0]


def query_counts(records: list[dict[str, Any]], index: str) -> tuple[int, int, int]:
    """(grounded, the question itself, all) over the router's queries in ``records``."""
    with IndexData(index) as data:
        by_id = {p.id: p for p in data.passages}
        n = grounded = as_question = 0
        for r in records:
            docs = record_documents(r, by_id)
            for q in r["queries"]:
                n += 1
                as_question += q.strip() == r["question"].strip()
                grounded += is_grounded(q, r["question"], docs)
    return grounded, as_question, n


def routing(records: list[dict[str, Any]]) -> list[str]:
    """Per question type: how many, the first search's modes, searches per question, refusals."""
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_type[r.get("type") or "—"].append(r)
    out = []
    for kind, recs in sorted(by_type.items()):
        first = Counter(r["modes"][0] if r["modes"] else "none" for r in recs)
        out.append(f"{kind} ({len(recs)}): first search " + ", ".join(f"{m} {c}" for m, c in first.most_common())
                   + f"; {sum(r['searches'] for r in recs) / len(recs):.2f} searches; "
                   + f"{sum(bool(r['refused']) for r in recs)} refused")
    return out


FIXED = ("naive-passage", "naive-graph", "naive-hybrid", "naive-rag", "two-search", "no-retrieval")
SINGLE = ("naive-passage", "naive-graph", "naive-hybrid")


def paired(label: str, recs: list[dict[str, Any]], other_label: str, other: list[dict[str, Any]]) -> str:
    """Per question, where one row is right (EM) and the other is not, with the exact two-sided sign test's p. Why:
    on 50 questions a 4-point gap is 2 questions; the sign test says whether a gap is more than chance."""
    from scipy.stats import binomtest

    theirs = {r["id"]: r["em"] for r in other}
    wins = sum(1 for r in recs if r["em"] > theirs[r["id"]])
    losses = sum(1 for r in recs if r["em"] < theirs[r["id"]])
    p = binomtest(wins, wins + losses).pvalue if wins + losses else 1.0
    return (f"- {label} against {other_label}, per question: right where it is wrong {wins}, the reverse {losses} "
            f"(sign test p = {p:.2f})")


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def row(label: str, s: dict[str, Any], queries: str) -> str:
    return (f"| {label} | {s['questions']} | {pct(s['em'])} | {pct(s['f1'])} | {pct(s['answer_recall'])} | "
            f"{num(s['searches'])} | {num(s['retrieval_ms'], 1)} | {pct(s['refusal_rate'])} | "
            f"{num(s.get('refusal_precision'))} | {num(s.get('refusal_recall'))} | "
            f"{pct(s.get('refused_with_answer'))} | {queries} |")


def set_table(spec: dict[str, Any], pooled: dict[str, list], bests: list[list[dict[str, Any]]]) -> list[str]:
    """One set's table and its routers' routing lines, every row over the questions all its rows answered (a run with
    ``--limit`` beside a whole one); each row's records are added to ``pooled``, the best single search's to
    ``bests``."""
    out, routes = [HEADER.format(name=spec["name"]), RULE], []
    runs = [(label, records_file(Path(folder), strategy), strategy) for label, folder, strategy in spec["rows"]]
    common = set.intersection(*({r["id"] for r in read_records(path)} for _, path, _ in runs))
    rows = [(label, [r for r in read_records(path) if r["id"] in common], strategy) for label, path, strategy in runs]
    singles = [(label, recs) for label, recs, strategy in rows if strategy in SINGLE]
    best = max(singles, key=lambda lr: sum(r["em"] for r in lr[1]), default=None)
    if best is not None:
        bests.append(best[1])
    for label, recs, strategy in rows:
        pooled[label].append(recs)
        queries = "—"
        if strategy not in FIXED:
            grounded, as_question, n = query_counts(recs, spec["index"])
            queries = f"{grounded} / {as_question} / {n}"
            routes += [f"- {label}: {line}" for line in routing(recs)]
            if best is not None:
                routes.append(paired(label, recs, f"the best single search ({best[0]})", best[1]))
        out.append(row(label, summarize(recs), queries))
    return out + ([""] + routes if routes else [])


def main(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    pooled: dict[str, list] = defaultdict(list)
    bests: list[list[dict[str, Any]]] = []
    for s in spec["sets"]:
        print("\n".join(set_table(s, pooled, bests)) + "\n")
    n_sets = len(spec["sets"])
    print(HEADER.format(name=f"all {n_sets} sets pooled") + "\n" + RULE)
    lines = []
    for label, runs in pooled.items():
        if len(runs) == n_sets:
            recs = [r for run in runs for r in run]
            print(row(label, summarize(recs), "—"))
            if len(bests) == n_sets and recs and recs[0].get("strategy") not in FIXED:  # a router row, as above
                best = [r for run in bests for r in run]
                lines.append(paired(label, recs, "each set's best single search", best))
    if lines:
        print("\n" + "\n".join(lines))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="the sets and rows, as JSON (see the module's docstring)")
    main(parser.parse_args().spec)
