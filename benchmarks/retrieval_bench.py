"""Retrieval quality and speed per mode on a built index.

    python benchmarks/retrieval_bench.py INDEX_DIR QUESTIONS.json [--modes passage,graph,hybrid]
        [--latency 200] [--reference 100] [--out results.json]

Quality: recall@2/5/10 of the gold supporting passages, and answer-recall@5 (a top-5 passage contains a gold
answer alias). Speed: single-query latency (p50/p95, query embedding included) and batched throughput, and the
same pipeline with igraph's prpack called once per query (HippoRAG 2's way) as the reference.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routerag.config import RetrievalConfig  # noqa: E402
from routerag.datasets import load_questions  # noqa: E402
from routerag.retrieval import Retriever  # noqa: E402
from routerag.runtime import configure_threads  # noqa: E402


def norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


def quality(retriever: Retriever, items, mode: str) -> dict:
    hash_of = {p.id: p.hash for p in retriever.passages}
    results = retriever.search([it.question for it in items], mode=mode, k=10)
    rec = {2: [], 5: [], 10: []}
    ans = []
    fallbacks = 0
    for it, res in zip(items, results):
        got = [(d.title, hash_of[d.id]) for d in res.docs]
        for k in rec:
            r = it.support_recall(got, k)
            if r is not None:
                rec[k].append(r)
        texts = [norm(d.title + " " + d.text) for d in res.docs[:5]]
        ans.append(any(f" {norm(a)} " in f" {t} " for a in it.answers for t in texts if norm(a)))
        fallbacks += res.fallback is not None
    return {f"recall@{k}": round(float(np.mean(v)), 4) for k, v in rec.items() if v} | {
        "answer_recall@5": round(float(np.mean(ans)), 4), "graph_fallbacks": fallbacks}


BATCH_REPEATS = 3
"""Batched throughput is the median of this many passes over all questions."""


def speed(retriever: Retriever, questions: list[str], mode: str, n_latency: int, vectors: np.ndarray) -> dict:
    """Latency and throughput twice: end to end (the query encoder included) and for the retrieval engine alone
    (query vectors given, as when the caller batches encoding across requests)."""
    out = {}
    for label, use_vectors in (("end_to_end", False), ("engine", True)):
        def run(lo: int, hi: int):
            return retriever.search(questions[lo:hi], mode=mode, k=5,
                                    query_vectors=vectors[lo:hi] if use_vectors else None)

        run(0, 8)  # warm-up
        lat = []
        for i in range(min(n_latency, len(questions))):
            t = time.perf_counter()
            run(i, i + 1)
            lat.append((time.perf_counter() - t) * 1000)
        runs = []
        for _ in range(BATCH_REPEATS):
            t = time.perf_counter()
            res = run(0, len(questions))
            runs.append(time.perf_counter() - t)
        elapsed = float(np.median(runs))
        stages: dict[str, float] = {}
        for r in res:
            for name, ms in r.timings_ms.items():
                stages[name] = stages.get(name, 0.0) + ms
        out[label] = {"p50_ms": round(float(np.percentile(lat, 50)), 2),
                      "p95_ms": round(float(np.percentile(lat, 95)), 2),
                      "batched_qps": round(len(questions) / elapsed, 1),
                      "batched_qps_runs": [round(len(questions) / x, 1) for x in runs],
                      "batched_ms_per_query_by_stage": {k: round(v / len(res), 3) for k, v in stages.items()}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("questions")
    ap.add_argument("--modes", default="passage,graph,hybrid")
    ap.add_argument("--latency", type=int, default=0, help="single-query latency over this many questions")
    ap.add_argument("--reference", type=int, default=0, help="igraph per-query reference over this many questions")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], help="RetrievalConfig field=value (repeatable)")
    args = ap.parse_args()
    configure_threads()
    overrides = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        overrides[k] = json.loads(v) if v[:1] in "0123456789-[{tf" and v not in ("true", "false") else v
        if v in ("true", "false"):
            overrides[k] = v == "true"
    cfg = RetrievalConfig(**overrides)
    items = load_questions(args.questions, limit=args.limit)
    t = time.perf_counter()
    retriever = Retriever(args.index, cfg)
    retriever.search([items[0].question], mode="graph", k=1)
    load_s = time.perf_counter() - t
    report = {"index": args.index, "questions": args.questions, "n": len(items), "config": cfg.model_dump(mode="json"),
              "load_s": round(load_s, 2), "counts": retriever.data.counts, "machine": platform.processor() or
              platform.machine(), "modes": {}}
    questions = [it.question for it in items]
    vectors = retriever.embed(questions) if args.latency else None
    for mode in args.modes.split(","):
        entry = quality(retriever, items, mode)
        if args.latency:
            entry |= speed(retriever, questions, mode, args.latency, vectors)
        report["modes"][mode] = entry
        print(mode, json.dumps(entry), flush=True)
    if args.reference:
        # the straightforward way: one query at a time, igraph's prpack for the PageRank (HippoRAG 2)
        ref = Retriever(retriever.data, cfg.model_copy(update={"ppr_backend": "igraph"}), embedder=retriever.embedder)
        qs = questions[: args.reference]
        t = time.perf_counter()
        ref_res = [ref.search([q], mode="hybrid", k=10)[0] for q in qs]
        ref_qps = len(qs) / (time.perf_counter() - t)
        ours = retriever.search(qs, mode="hybrid", k=10)
        same_top10 = float(np.mean([[d.id for d in a.docs] == [d.id for d in b.docs] for a, b in zip(ours, ref_res)]))
        report["igraph_reference"] = {"queries": len(qs), "hybrid_qps_per_query_igraph": round(ref_qps, 1),
                                      "top10_identical": same_top10}
        hybrid = report["modes"].get("hybrid", {})
        if "end_to_end" in hybrid:
            report["igraph_reference"]["speedup_batched_vs_reference"] = round(
                hybrid["end_to_end"]["batched_qps"] / ref_qps, 1)
        print("reference", json.dumps(report["igraph_reference"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
