"""The scale profile's PageRank (forward push, ``routerag/retrieval/push.py``) against the whole-graph Chebyshev
solve, one query at a time, on the synthetic graph of N passages.

    python benchmarks/push_scale.py --passages 1000000 --eps 1e-6,3e-7 --out push_1m.json

The graph is the one ``growth.py build N`` writes (``synth_graph.synthetic_graph`` with seed N and the real index's
profile), built in memory, so no index (nor its load time) is needed; the solver is the retriever's (damping 0.5,
tolerance 1e-5) and push runs on its operator, as the retriever's scale profile does. Queries seed like a graph search
(``ppr_devices.seed_resets``: 5 entities and 3 passages, random weights). Per query, in turn: the Chebyshev solve
and push at each ``eps``; recorded: p50/p95 ms, edge visits, the reported L1 error, and the share of the
Chebyshev top 5 and top 10 passages push keeps.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ppr_devices import PROFILE, seed_resets  # noqa: E402
from synth_graph import synthetic_graph  # noqa: E402

from routerag.retrieval.ppr import PPRSolver, undirected_adjacency  # noqa: E402
from routerag.retrieval.push import PushPPR  # noqa: E402
from routerag.runtime import configure_threads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--eps", default="1e-6,3e-7")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    configure_threads()
    prof = json.loads(PROFILE.read_text())
    t = time.perf_counter()
    sg = synthetic_graph(args.passages, prof, seed=args.passages)
    solver = PPRSolver(undirected_adjacency(sg.vertices, sg.src, sg.dst, sg.weights), damping=0.5, tol=1e-5,
                       device="cpu")
    result: dict = {"passages": args.passages, "vertices": sg.vertices, "edges": len(sg.src),
                    "setup_s": round(time.perf_counter() - t, 1), "host": platform.node(), "queries": args.queries}
    print(json.dumps(result), flush=True)
    resets = seed_resets(sg.n, sg.n_ent, args.queries, np.random.default_rng(1))
    eps_list = [float(e) for e in args.eps.split(",")]
    pushes = {e: PushPPR(solver, eps=e) for e in eps_list}
    rows = np.arange(sg.n)
    cheb_ms: list[float] = []
    stats: dict = {e: {"ms": [], "edges": [], "l1": [], "top5": [], "top10": []} for e in eps_list}
    for q in range(args.queries):
        col = resets[:, q]
        t = time.perf_counter()
        ref = solver.solve(col, rows=rows, validate=False)[:, 0]
        cheb_ms.append((time.perf_counter() - t) * 1000)
        ref_top = np.lexsort((rows, -ref))[:10]
        for e, push in pushes.items():
            t = time.perf_counter()
            top, _, res = push.top(col.indices.astype(np.int64), col.data.astype(np.float64), sg.n, 10)
            s = stats[e]
            s["ms"].append((time.perf_counter() - t) * 1000)
            s["edges"].append(res.edges)
            s["l1"].append(res.l1_error)
            s["top5"].append(len(set(top[:5]) & set(ref_top[:5])) / 5)
            s["top10"].append(len(set(top) & set(ref_top)) / 10)
    result["chebyshev"] = {"p50_ms": round(float(np.median(cheb_ms)), 1), "p95_ms": round(float(np.percentile(cheb_ms, 95)), 1)}
    result["push"] = {f"{e:g}": {"p50_ms": round(float(np.median(s["ms"])), 2),
                                 "p95_ms": round(float(np.percentile(s["ms"], 95)), 2),
                                 "edges_p50": int(np.median(s["edges"])), "l1_error_p50": float(np.median(s["l1"])),
                                 "top5_kept": round(float(np.mean(s["top5"])), 4),
                                 "top10_kept": round(float(np.mean(s["top10"])), 4)} for e, s in stats.items()}
    print(json.dumps(result, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
