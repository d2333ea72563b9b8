"""Exact against approximate fact matching (``retrieval.fact_index``): recall of the exact top facts, agreement of
the min-max range, end-to-end passage recall, and per-query fact-matching time, side by side in one run.

    python benchmarks/fact_index.py INDEX --questions popqa.json [--questions hotpot.json] [--limit 500]

Prints one JSON object per fact index (exact, hnsw, ivfpq) and the ratios against exact.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from routerag.config import RetrievalConfig
from routerag.datasets import load_questions
from routerag.retrieval import Retriever
from routerag.runtime import configure_threads


def recall_at(docs: list[str], gold: set[str], k: int) -> float | None:
    return len(set(docs[:k]) & gold) / len(gold) if gold else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("index", type=Path)
    ap.add_argument("--questions", type=Path, action="append", required=True)
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--kinds", default="exact,hnsw,ivfpq")
    args = ap.parse_args()
    configure_threads()
    items = [it for f in args.questions for it in load_questions(f)[: args.limit]]
    queries = [it.question for it in items]
    exact = None
    out = {}
    for kind in args.kinds.split(","):
        t0 = time.perf_counter()
        r = Retriever(args.index, RetrievalConfig(fact_index=kind))
        r.warm_up()
        load_s = time.perf_counter() - t0
        q = r.embed(queries)
        per_query = []
        matches = []
        for i in range(len(queries)):
            t = time.perf_counter()
            matches.append(r.fact_scorer.match(q[i:i + 1], 3))
            per_query.append((time.perf_counter() - t) * 1000)
        results = r.search(queries, mode="graph", k=5)
        titles = {d.id: d.title for res in results for d in res.docs}
        rec = [recall_at([titles[d.id] for d in res.docs], {g.title for g in it.supporting}, 5)
               for res, it in zip(results, items)]
        rec = [x for x in rec if x is not None]
        row = {"kind": kind, "load_s": round(load_s, 2), "facts_p50_ms": round(statistics.median(per_query), 3),
               "graph_recall@5": round(float(np.mean(rec)), 4) if rec else None}
        if exact is None:
            exact = matches
        else:
            hits = [len(set(a.top[0]) & set(b.top[0])) / len(a.top[0]) for a, b in zip(exact, matches)]
            row["top3_fact_recall"] = round(float(np.mean(hits)), 4)
            row["min_abs_err"] = round(float(np.mean([abs(a.lo[0] - b.lo[0]) for a, b in zip(exact, matches)])), 5)
        out[kind] = row
        print(json.dumps(row), flush=True)
    base = out.get("exact")
    if base:
        for kind, row in out.items():
            if kind != "exact":
                print(f"{kind}: facts p50 {row['facts_p50_ms'] / base['facts_p50_ms']:.2f}x exact, "
                      f"top-3 fact recall {row['top3_fact_recall']}, graph recall@5 {row['graph_recall@5']} "
                      f"(exact {base['graph_recall@5']})")


if __name__ == "__main__":
    main()
