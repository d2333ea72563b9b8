"""Whole-graph Personalized PageRank on CUDA (torch.sparse) against the CPU path, on the synthetic graph of N passages.

    python benchmarks/ppr_devices.py --passages 1000000 --out ppr_devices.json      # CUDA and CPU, if CUDA is there
    python benchmarks/ppr_devices.py --passages 100000 --devices cpu                # CPU only

The graph is the one ``growth.py build N`` writes (``synth_graph.synthetic_graph`` with seed N and the real index's
profile), built in memory: this script needs numpy, scipy and torch only, so it runs on a lent GPU machine that has
none of the index's stack. The solver is the retriever's own (``routerag/retrieval/ppr.py``, loaded from its file
so that FAISS is not imported), with the retriever's defaults (damping 0.5, tolerance 1e-5). One solver is built
(reverse Cuthill-McKee order, the operator), and its operator is copied to the GPU, so both devices solve the same
system. Queries seed like a graph search: a few entities (a query's top facts' ends) and a few passages (the dense
seeds), with random weights.

Measured per device: one query at a time (p50, p95; on CUDA including the copies to and from the GPU and the
synchronisation), and batches of 16, 64 and 256 queries (ms per query); then the agreement of the two devices' top 10
passages and their largest score difference.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from synth_graph import synthetic_graph  # noqa: E402

PROFILE = ROOT / "benchmarks" / "results" / "growth" / "profile.json"


def load_ppr_module():  # noqa: ANN201 - a module
    """``routerag.retrieval.ppr`` from its file: the package's ``__init__`` would import the retriever and FAISS."""
    spec = importlib.util.spec_from_file_location("routerag_ppr", ROOT / "routerag" / "retrieval" / "ppr.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def seed_resets(n: int, n_ent: int, queries: int, rng: np.random.Generator) -> sp.csc_matrix:
    """``queries`` reset vectors: 5 entities and 3 passages each, with random positive weights."""
    rows, cols = [], []
    for q in range(queries):
        rows += [*(n + rng.choice(n_ent, 5, replace=False)), *rng.choice(n, 3, replace=False)]
        cols += [q] * 8
    vals = rng.uniform(0.1, 1.0, len(rows)).astype(np.float32)
    return sp.csc_matrix((vals, (rows, cols)), shape=(n + n_ent, queries))


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def time_single(solver, resets: sp.csc_matrix, rows: np.ndarray, count: int) -> dict[str, float]:  # noqa: ANN001
    """p50 / p95 ms of one query at a time (after two warm-ups)."""
    for q in range(2):
        solver.solve(resets[:, q], rows)
    times = []
    for q in range(count):
        _sync(solver.device)
        t = time.perf_counter()
        solver.solve(resets[:, q], rows)
        _sync(solver.device)
        times.append((time.perf_counter() - t) * 1e3)
    return {"p50_ms": round(float(np.percentile(times, 50)), 2), "p95_ms": round(float(np.percentile(times, 95)), 2)}


def time_batches(solver, resets: sp.csc_matrix, rows: np.ndarray, sizes: list[int]) -> dict[str, float]:  # noqa: ANN001
    """ms per query for a batch of each size (best of two)."""
    out = {}
    for b in sizes:
        best = float("inf")
        for _ in range(2):
            _sync(solver.device)
            t = time.perf_counter()
            solver.solve(resets[:, :b], rows)
            _sync(solver.device)
            best = min(best, time.perf_counter() - t)
        out[f"batch{b}_ms_per_query"] = round(best * 1e3 / b, 3)
    return out


def on_cuda(solver):  # noqa: ANN001, ANN201
    """The same solver (order, operator) with its operator on the GPU."""
    gpu = copy.copy(solver)
    gpu.device = "cuda"
    gpu._torch_M = solver._torch_M.to("cuda")
    return gpu


def agreement(cpu, gpu, resets: sp.csc_matrix, rows: np.ndarray, queries: int) -> dict[str, Any]:  # noqa: ANN001
    a, b = cpu.solve(resets[:, :queries], rows), gpu.solve(resets[:, :queries], rows)
    same = [set(np.argsort(-a[:, q])[:10]) == set(np.argsort(-b[:, q])[:10]) for q in range(queries)]
    return {"queries": queries, "top10_equal": int(sum(same)), "max_abs_diff": float(np.abs(a - b).max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--single", type=int, default=30, help="queries timed one at a time per device")
    ap.add_argument("--batches", default="16,64,256")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch

    ppr = load_ppr_module()
    prof = json.loads(PROFILE.read_text())
    result: dict[str, Any] = {"passages": args.passages, "host": platform.node(), "torch": torch.__version__,
                              "threads": torch.get_num_threads(),
                              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    t = time.perf_counter()
    sg = synthetic_graph(args.passages, prof, seed=args.passages)
    adjacency = ppr.undirected_adjacency(sg.vertices, sg.src, sg.dst, sg.weights)
    result["graph"] = {"vertices": sg.vertices, "edges": len(sg.src), "seconds": round(time.perf_counter() - t, 1)}
    print(json.dumps(result), flush=True)
    t = time.perf_counter()
    cpu = ppr.PPRSolver(adjacency, damping=0.5, tol=1e-5, device="cpu")
    result["solver_build_s"] = round(time.perf_counter() - t, 1)
    result["steps"] = cpu.steps
    resets = seed_resets(sg.n, sg.n_ent, max(256, args.single + 2), np.random.default_rng(1))
    rows = np.arange(sg.n)
    sizes = [int(s) for s in args.batches.split(",") if s]
    solvers = {"cpu": cpu}
    if "cuda" in args.devices and torch.cuda.is_available():
        solvers["cuda"] = on_cuda(cpu)
    for name, solver in solvers.items():
        if name not in args.devices:
            continue
        result[name] = {**time_single(solver, resets, rows, args.single), **time_batches(solver, resets, rows, sizes)}
        print(name, json.dumps(result[name]), flush=True)
    if "cuda" in solvers:
        result["agreement"] = agreement(cpu, solvers["cuda"], resets, rows, 64)
    print(json.dumps(result, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
