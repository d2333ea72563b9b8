"""Retrieval quality and speed per mode on a built index.

    python benchmarks/retrieval_bench.py INDEX_DIR QUESTIONS.json [--modes passage,graph,hybrid]
        [--latency 200] [--reference 100] [--variant today:query_encoder=torch] [--push-eps 1e-6,1e-7]
        [--paired 100] [--floors] [--out results.json]

Quality: recall@2/5/10 of the gold supporting passages, and answer-recall@5 (a top-5 passage contains a gold
answer alias). Speed: single-query latency (p50/p95, query embedding included) and batched throughput, each with
its stage breakdown (median ms per single query; ms per query in a batch), and the same pipeline with igraph's
prpack called once per query (HippoRAG 2's way) as the reference.

``--variant NAME:FIELD=VALUE[;FIELD=VALUE]`` runs the same measurements, in the same process and run, for another
configuration (e.g. today's path: ``query_encoder=torch``), with its top-10 agreement against the main one.
``--paired N`` also times single queries of each variant interleaved with the main configuration, question by
question (:func:`paired`), so that a difference smaller than the host's drift between phases still shows.
``--push-eps`` measures forward-push PageRank (``routerag/retrieval/push.py``) against the Chebyshev solver on the
latency queries' own seeds: latency and top-10 agreement per residual threshold. ``--floors`` adds the lower bounds
of ``benchmarks/query_floors.py`` (each stage's work at this machine's best measured rates) beside the measurements.
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
        single_stages: dict[str, list[float]] = {}
        for i in range(min(n_latency, len(questions))):
            t = time.perf_counter()
            one = run(i, i + 1)
            lat.append((time.perf_counter() - t) * 1000)
            for name, ms in one[0].timings_ms.items():
                single_stages.setdefault(name, []).append(ms)
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
                      "single_median_ms_by_stage": {k: round(float(np.median(v)), 3)
                                                    for k, v in single_stages.items()},
                      "batched_ms_per_query_by_stage": {k: round(v / len(res), 3) for k, v in stages.items()}}
    return out


def paired(main: Retriever, other: Retriever, questions: list[str], mode: str, repeats: int = 2) -> dict:
    """One-query latency of two configurations on the same questions, each question searched by both in turn (the
    order alternating), so both see the same state of the machine: the medians, their per-stage medians, and the
    median of the per-question differences (other − main). Searches one after another in separate phases drift
    with the host by more than some of the differences measured here."""
    lat: dict[str, list[float]] = {"main": [], "other": []}
    stages: dict[str, dict[str, list[float]]] = {"main": {}, "other": {}}
    both = (("main", main), ("other", other))
    for q in questions[:8]:  # warm-up
        for _, r in both:
            r.search([q], mode=mode, k=5)
    for rep in range(repeats):
        for i, q in enumerate(questions):
            for name, r in both if (i + rep) % 2 == 0 else both[::-1]:
                t = time.perf_counter()
                res = r.search([q], mode=mode, k=5)
                lat[name].append((time.perf_counter() - t) * 1000)
                for stage, ms in res[0].timings_ms.items():
                    stages[name].setdefault(stage, []).append(ms)
    diff = np.asarray(lat["other"]) - np.asarray(lat["main"])
    return {"questions": len(questions), "repeats": repeats,
            "main_p50_ms": round(float(np.median(lat["main"])), 3),
            "variant_p50_ms": round(float(np.median(lat["other"])), 3),
            "paired_difference_median_ms": round(float(np.median(diff)), 3),
            "main_stages_ms": {k: round(float(np.median(v)), 3) for k, v in stages["main"].items()},
            "variant_stages_ms": {k: round(float(np.median(v)), 3) for k, v in stages["other"].items()}}


def parse_overrides(pairs: list[str]) -> dict:
    """``field=value`` strings as RetrievalConfig fields (numbers, booleans and JSON parsed; the rest strings)."""
    out: dict = {}
    for kv in pairs:
        k, v = kv.split("=", 1)
        if v in ("true", "false"):
            out[k] = v == "true"
        else:
            out[k] = json.loads(v) if v[:1] in "0123456789-[{" else v
    return out


def push_comparison(retriever: Retriever, questions: list[str], eps_list: list[float]) -> dict:
    """Forward push against the Chebyshev solver, one query at a time on each query's own hybrid seeds: median
    latency of each and the share of identical passage top-10 lists (scores normalised alike)."""
    import scipy.sparse as sp

    from routerag.retrieval.facts import top_rows
    from routerag.retrieval.push import PushPPR

    r = retriever
    r._ensure_graph()
    clean = [r._check(q) for q in questions]
    vec = r.embed(clean)
    hits = r.dense_hits(vec, r.cfg.dense_seed_passages) if r.cfg.dense_seed_passages else None
    seeds, _, _ = r.graph_seeds(vec, clean, hits)
    rows = r._passage_rows
    ref, cheb_ms = [], []
    for sd in seeds:
        reset = sp.csc_matrix((np.fromiter(sd.weights.values(), np.float32),
                               (np.fromiter(sd.weights.keys(), np.int64), np.zeros(len(sd.weights), np.int64))),
                              shape=(r.n_nodes, 1))
        t = time.perf_counter()
        ref.append(r.solver.solve(reset, rows=rows, validate=False)[:, 0])
        cheb_ms.append((time.perf_counter() - t) * 1000)
    ref_top = top_rows(np.stack(ref), 10)
    out: dict = {"queries": len(seeds), "chebyshev_p50_ms": round(float(np.median(cheb_ms)), 3), "push": {}}
    for eps in eps_list:
        push = PushPPR(r.solver, eps=eps)
        got, ms, l1 = [], [], []
        for sd in seeds:
            t = time.perf_counter()
            res = push.solve(np.fromiter(sd.weights.keys(), np.int64), np.fromiter(sd.weights.values(), float))
            ms.append((time.perf_counter() - t) * 1000)
            full = np.zeros(r.n_nodes)
            full[res.vertices] = res.scores
            got.append(full[rows])
            l1.append(res.l1_error)
        got_a = np.stack(got).astype(np.float32)
        got_top = top_rows(got_a, 10)
        out["push"][f"{eps:g}"] = {
            "p50_ms": round(float(np.median(ms)), 3), "p95_ms": round(float(np.percentile(ms, 95)), 3),
            "top10_identical_to_chebyshev": round(float(np.mean((got_top == ref_top).all(axis=1))), 4),
            "top5_overlap": round(float(np.mean([len(set(a[:5]) & set(b[:5])) / 5
                                                 for a, b in zip(got_top, ref_top)])), 4),
            "l1_error_p50": float(np.median(l1)), "max_abs_error": float(np.abs(got_a - np.stack(ref)).max())}
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
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:FIELD=VALUE[;FIELD=VALUE]: also measure this configuration (repeatable)")
    ap.add_argument("--paired", type=int, default=0,
                    help="also time one query at a time on this many questions, each variant interleaved with the "
                         "main configuration")
    ap.add_argument("--push-eps", default="", help="comma-separated residual thresholds for forward-push PPR")
    ap.add_argument("--floors", action="store_true", help="also measure the per-stage lower bounds on this machine")
    args = ap.parse_args()
    configure_threads()
    cfg = RetrievalConfig(**parse_overrides(args.set))
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
    if args.variant:
        report["variants"] = {}
    for spec in args.variant:
        name, _, fields = spec.partition(":")
        vcfg = cfg.model_copy(update=parse_overrides([f for f in fields.split(";") if f]))
        other = Retriever(retriever.data, RetrievalConfig(**vcfg.model_dump()))
        other.search([items[0].question], mode="graph", k=1)
        vvec = other.embed(questions) if args.latency else None
        ventry: dict = {"config": {k: v for k, v in vcfg.model_dump(mode="json").items()
                                   if v != report["config"].get(k)}, "modes": {}}
        if vvec is not None and vectors is not None:
            ventry["query_vector_min_cosine_vs_main"] = round(float((vvec * vectors).sum(axis=1).min()), 7)
        for mode in args.modes.split(","):
            entry = quality(other, items, mode)
            a = retriever.search(questions, mode=mode, k=10)
            b = other.search(questions, mode=mode, k=10)
            entry["top10_identical_to_main"] = round(float(np.mean(
                [[d.id for d in x.docs] == [d.id for d in y.docs] for x, y in zip(a, b)])), 4)
            if args.latency:
                entry |= speed(other, questions, mode, args.latency, vvec)
            if args.paired:
                entry["paired_single"] = paired(retriever, other, questions[: args.paired], mode)
            ventry["modes"][mode] = entry
            print(f"variant {name} {mode}", json.dumps(entry), flush=True)
        report["variants"][name] = ventry
        del other
    if args.push_eps:
        report["push_ppr"] = push_comparison(retriever, questions[: max(args.latency, 50)],
                                             [float(e) for e in args.push_eps.split(",")])
        print("push", json.dumps(report["push_ppr"]), flush=True)
    if args.floors:
        from query_floors import floors

        report["floors"] = floors(retriever, questions, report["modes"].get("hybrid"))
        print("floors", json.dumps(report["floors"]), flush=True)
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
        for name, v in report.get("variants", {}).items():
            e2e = v["modes"].get("hybrid", {}).get("end_to_end")
            if e2e:
                report["igraph_reference"][f"speedup_batched_vs_reference_{name}"] = round(e2e["batched_qps"] / ref_qps, 1)
        print("reference", json.dumps(report["igraph_reference"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
