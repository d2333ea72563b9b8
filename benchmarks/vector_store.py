"""FAISS against Milvus (``retrieval.vector_store``) on one index, side by side in one run: recall@5 over the gold
passages (by title) and p50 / p95 of one query at a time in every mode, query vectors computed once and shared, so
only the vector search differs; plus the time to open the index on Milvus (the first open uploads its vectors).

    python benchmarks/vector_store.py /work/idx/popqa --questions ../shared/data/popqa/popqa_dev.json \\
        --milvus-uri /tmp/routerag-milvus.db
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from routerag.config import RetrievalConfig
from routerag.datasets import load_questions
from routerag.retrieval import Retriever


def held_out(path: Path) -> list:
    """PopQA's held-out 200 (notes/SPLITS.md: shuffled with seed 0, items 300 to 500)."""
    items = load_questions(path)
    random.Random(0).shuffle(items)
    return items[300:500]


def measure(r: Retriever, items: list, vectors, mode: str) -> dict:
    lat, rec = [], []
    for it, v in zip(items, vectors):
        t = time.perf_counter()
        [res] = r.search([it.question], mode, 5, query_vectors=v[None, :])
        lat.append((time.perf_counter() - t) * 1000)
        gold = {g.title for g in it.supporting}
        if gold:
            rec.append(len({d.title for d in res.docs} & gold) / len(gold))
    lat.sort()
    return {"recall@5": round(statistics.mean(rec), 4), "p50_ms": round(statistics.median(lat), 2),
            "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("index", type=Path)
    ap.add_argument("--questions", type=Path, required=True)
    ap.add_argument("--milvus-uri", default="/tmp/routerag-milvus.db")
    args = ap.parse_args()
    items = held_out(args.questions)
    faiss = Retriever(args.index, RetrievalConfig())
    vectors = faiss.embed([it.question for it in items])
    t = time.perf_counter()
    milvus = Retriever(args.index, RetrievalConfig(vector_store="milvus", milvus_uri=args.milvus_uri),
                       embedder=faiss.embedder)
    milvus.warm_up()  # the fact collection too
    print(json.dumps({"milvus_open_s": round(time.perf_counter() - t, 1)}), flush=True)
    faiss.warm_up()
    for mode in ("passage", "graph", "hybrid"):
        for name, r in (("faiss", faiss), ("milvus", milvus)):
            print(json.dumps({"store": name, "mode": mode, **measure(r, items, vectors, mode)}), flush=True)


if __name__ == "__main__":
    main()
