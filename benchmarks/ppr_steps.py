"""The PageRank solver's whole-product Chebyshev steps against the five-pass form they replaced, side by side on the
same solver and the same queries' seeds (issue 19); with ``--chunks``, the column-chunk widths of a batched solve
instead; with ``--chunk-workers``, a batch's chunks on single-threaded workers against one after another on torch's
threads.

    python benchmarks/ppr_steps.py INDEX QUESTIONS.json [--limit 500] [--repeats 5] [--chunks 16,32]
        [--chunk-workers]

Each step of the solver used to make five passes over the dense block (x += s; r += d S s; r -= s; s *= a;
s += b r); it now makes three (``PPRSolver._torch_steps``: M = d S − I in one product, the step kept as c · u).
Reported: batched (the retriever's batch of 256, in its chunks) and single-query solve time for both, alternating
within one process, the largest score difference between them and the share of identical passage top-10 lists.
``--chunks`` (per width, ``ppr.CHUNK``) and ``--chunk-workers`` report the batched time per query of each setting,
its median ratio to the first setting's pass that ran just before it, and the same agreement figures against the
first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routerag.datasets import load_questions  # noqa: E402
from routerag.retrieval import Retriever  # noqa: E402
from routerag.retrieval.facts import top_rows  # noqa: E402
from routerag.runtime import configure_threads  # noqa: E402


def five_pass_steps(solver, xt, rt, st, rho: float, start: int) -> None:  # noqa: ANN001
    """The step as it was before: the reference."""
    d = solver.damping
    sigma = 1.0 / d
    accumulate = rt.addmv_ if rt.dim() == 1 else rt.addmm_
    s_op = solver._reference_S
    for _ in range(start, solver.steps):
        xt += st
        accumulate(s_op, st, alpha=d)
        rt.sub_(st)
        rho_next = 1.0 / (2 * sigma - rho)
        st.mul_(rho_next * rho).add_(rt, alpha=2 * rho_next / d)
        rho = rho_next


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("questions")
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--single", type=int, default=100)
    ap.add_argument("--chunks", default="", help="compare these column-chunk widths instead, e.g. 16,32")
    ap.add_argument("--chunk-workers", action="store_true",
                    help="compare chunks on single-threaded workers with chunks one after another instead")
    args = ap.parse_args()
    configure_threads()
    r = Retriever(args.index)
    r.warm_up()
    r._ensure_graph()
    solver = r.solver
    s = solver.S
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        solver._reference_S = torch.sparse_csr_tensor(torch.from_numpy(s.indptr.astype(np.int32)),
                                                      torch.from_numpy(s.indices.astype(np.int32)),
                                                      torch.from_numpy(s.data), size=s.shape)
    questions = [it.question for it in load_questions(args.questions, limit=args.limit)]
    vec = r.embed(questions)
    hits = r.dense_hits(vec, r.cfg.dense_seed_passages) if r.cfg.dense_seed_passages else None
    seeds, _, _ = r.graph_seeds(vec, questions, hits)
    rows = [v for sd in seeds for v in sd.weights]
    cols = [i for i, sd in enumerate(seeds) for _ in sd.weights]
    vals = [w for sd in seeds for w in sd.weights.values()]
    reset = sp.csc_matrix((np.asarray(vals, np.float32), (rows, cols)), shape=(r.n_nodes, len(seeds)))
    batch = r.cfg.batch_size
    if args.chunks:  # widths, the first the reference
        compare_settings(solver, reset, r._passage_rows, batch,
                         {w: {"CHUNK": int(w)} for w in args.chunks.split(",")}, args.repeats)
        return
    if args.chunk_workers:  # chunks one after another on torch's threads, then side by side on workers
        compare_settings(solver, reset, r._passage_rows, batch,
                         {"sequential": {"_torch_threads": lambda: 1}, "workers": {}}, args.repeats)
        return
    three = type(solver)._torch_steps

    def solve_all(steps) -> tuple[np.ndarray, float]:  # noqa: ANN001
        solver._torch_steps = steps.__get__(solver)
        t = time.perf_counter()
        out = solve_batched(solver, reset, r._passage_rows, batch)
        return out, time.perf_counter() - t

    def solve_single(steps, n: int) -> list[float]:  # noqa: ANN001
        solver._torch_steps = steps.__get__(solver)
        ms = []
        for i in range(n):
            t = time.perf_counter()
            solver.solve(reset[:, i], rows=r._passage_rows, validate=False)
            ms.append((time.perf_counter() - t) * 1000)
        return ms

    runs: dict[str, list[float]] = {"five_pass": [], "three_pass": []}
    single: dict[str, list[float]] = {"five_pass": [], "three_pass": []}
    results = {}
    for _ in range(args.repeats):  # alternate, so drift in the machine's speed hits both alike
        for name, steps in (("five_pass", five_pass_steps), ("three_pass", three)):
            results[name], sec = solve_all(steps)
            runs[name].append(sec)
            single[name] += solve_single(steps, min(args.single, len(questions)))
    del solver._torch_steps
    a, b = results["five_pass"], results["three_pass"]
    n = a.shape[1]
    report = {"queries": n, "batch": batch, "steps": solver.steps,
              "batched_ms_per_query": {k: round(float(np.median(v)) * 1000 / n, 3) for k, v in runs.items()},
              "single_p50_ms": {k: round(float(np.median(v)), 3) for k, v in single.items()},
              "max_abs_score_difference": float(np.abs(a - b).max()),
              "max_score": float(a.max()),
              "top10_identical": round(float(np.mean((top_rows(a.T, 10) == top_rows(b.T, 10)).all(axis=1))), 4)}
    report["batched_speedup"] = round(report["batched_ms_per_query"]["five_pass"]
                                      / report["batched_ms_per_query"]["three_pass"], 2)
    print(json.dumps(report, indent=1))


def solve_batched(solver, reset: sp.csc_matrix, rows: np.ndarray, batch: int) -> np.ndarray:  # noqa: ANN001
    """All queries' passage scores, solved ``batch`` columns at a time as the retriever does."""
    return np.concatenate([solver.solve(reset[:, i:i + batch], rows=rows, validate=False)
                           for i in range(0, reset.shape[1], batch)], axis=1)


def compare_settings(solver, reset: sp.csc_matrix, rows: np.ndarray, batch: int,  # noqa: ANN001
                     settings: dict[str, dict[str, object]], repeats: int) -> None:
    """Batched solves under each setting (names in ``routerag.retrieval.ppr`` set to values, restored after),
    alternating within each repeat so drift hits all alike; each pass's times are printed as it ends, so the
    machine's spells show, then the medians, each setting's median ratio to the first one's pass just before it,
    and agreement with the first."""
    from routerag.retrieval import ppr

    saved = {name: getattr(ppr, name) for values in settings.values() for name in values}
    times: dict[str, list[float]] = {label: [] for label in settings}
    results: dict[str, np.ndarray] = {}
    try:
        for _ in range(repeats):
            for label, values in settings.items():
                for name, value in saved.items():
                    setattr(ppr, name, values.get(name, value))
                t = time.perf_counter()
                results[label] = solve_batched(solver, reset, rows, batch)
                times[label].append(time.perf_counter() - t)
            print(json.dumps({k: round(v[-1] * 1000 / reset.shape[1], 3) for k, v in times.items()}), flush=True)
    finally:
        for name, value in saved.items():
            setattr(ppr, name, value)
    n, first = reset.shape[1], next(iter(settings))
    base_top = top_rows(results[first].T, 10)
    print(json.dumps({"queries": n, "batch": batch, "chunk": ppr.CHUNK, "repeats": repeats, "settings": {
        label: {"batched_ms_per_query": round(float(np.median(times[label])) * 1000 / n, 3),
                "best_ms_per_query": round(min(times[label]) * 1000 / n, 3),
                "median_ratio_to_first": round(float(np.median(np.asarray(times[label]) / np.asarray(times[first]))),
                                               3),
                "max_abs_score_difference": float(np.abs(results[label] - results[first]).max()),
                "top10_identical": round(float(np.mean((top_rows(results[label].T, 10) == base_top).all(axis=1))), 4)}
        for label in settings}}, indent=1))


if __name__ == "__main__":
    main()
