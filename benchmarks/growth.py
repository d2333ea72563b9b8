"""Measured growth: synthetic indexes shaped like the real one, at 10k, 100k, 1M passages.

    python benchmarks/growth.py profile indexes/popqa                   # the real index's distributions
    python benchmarks/growth.py build 10000 100000 1000000             # one synthetic index per size
    python benchmarks/growth.py build 1000000 --ann auto --no-f16      # with the scale profile's indexes
    python benchmarks/growth.py serve 10000 100000 1000000             # load each in a fresh process; latency
    python benchmarks/growth.py report                                 # fit, plot, table
    python benchmarks/growth.py report --profiles scale --plot docs/img/growth-scale.png   # the scale profile's
    python benchmarks/growth.py compact 1000000                        # add the compact graph to an older build

Every size writes its own result JSON (``--results``, default ``benchmarks/results/growth``); a size whose JSON exists
is skipped, so a killed run resumes. Indexes go to ``--work`` (default ``indexes/growth``, git-ignored).

The synthetic index (:mod:`benchmarks.growth_synth`) copies the real index's shape — per-passage mention counts,
entity passage counts (degrees), facts per passage, synonym edges per entity, edge weights — and uses random unit
vectors (dim 384) for passages, entities and facts. It is written in the index format (``graph_index.store``'s
JSONL writer, ``np.save`` layout, FAISS flat index, GraphML through python-igraph, a manifest with checksums, published
through ``atomic_directory``), so the real ``IndexData`` and ``Retriever`` load and search it. What "build" measures
here is this generator's write (no OpenIE, no embedding model), not ``routerag build-graph``.

"serve" runs in a child process per size: it opens a ``Retriever`` (the graph part loaded as the first graph query
would), then records RSS split into anonymous and file-backed pages (``/proc/self/status``), whether the embedding
matrices are copies or maps, and latencies measured as ``benchmarks/retrieval_bench.py`` does with query vectors
given: single-query p50/p95 per mode and the PPR stage alone, and batched ms per query.

``serve --profiles default,scale`` opens one ``Retriever`` per retrieval profile (``default`` is the settings'
defaults, ``exact`` and ``scale`` set ``retrieval.profile``) on the same loaded index, in the same process, and times
them side by side: per query, every profile and mode in turn. Each later profile also gets its top-10 overlap with the
first one's results per mode. Load time and RSS are the first profile's; a later profile's ``load_s`` is what it
added (its approximate indexes are read, or built once and written, then). Its result is
``serve_N_default-scale.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "growth"
DEFAULT_WORK = ROOT / "indexes" / "growth"
PLOT = ROOT / "docs" / "img" / "growth.png"


def _status() -> dict[str, float]:
    """This process's memory from /proc/self/status, in MB (VmHWM is the peak resident set)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def cmd_profile(args: argparse.Namespace) -> None:
    from growth_synth import measure_profile

    out = Path(args.results) / "profile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    prof = measure_profile(Path(args.index))
    out.write_text(json.dumps(prof) + "\n")
    print(json.dumps({k: v for k, v in prof.items() if not isinstance(v, list)}))


def cmd_build(args: argparse.Namespace) -> None:
    import resource

    from growth_synth import write_synthetic

    results = Path(args.results)
    prof = json.loads((results / "profile.json").read_text())
    for n in args.sizes:
        res = results / f"build_{n}.json"
        if res.exists():
            print(f"build {n}: done already ({res})")
            continue
        if args.child:
            t = time.perf_counter()
            info = write_synthetic(Path(args.work) / f"p{n}", n, prof, seed=n, f16=not args.no_f16,
                                   ann_write=args.ann, ivf_from_rows=args.ivf_from_rows)
            info["build_s"] = round(time.perf_counter() - t, 1)
            info["build_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
            res.write_text(json.dumps(info, indent=2) + "\n")
            print(f"build {n}: {json.dumps(info)}", flush=True)
        else:  # a fresh process per size, so each peak RSS is its own
            subprocess.run([sys.executable, __file__, "build", str(n), "--child", "--results", args.results,
                            "--work", args.work, "--ann", args.ann, *(["--no-f16"] if args.no_f16 else []),
                            *([] if args.ivf_from_rows is None else ["--ivf-from-rows", str(args.ivf_from_rows)])],
                           check=True)


def cmd_compact(args: argparse.Namespace) -> None:
    """Give indexes built before the compact graph files (graph_index.csr) those files, from the same seed's graph."""
    from growth_synth import add_compact

    prof = json.loads((Path(args.results) / "profile.json").read_text())
    for n in args.sizes:
        t = time.perf_counter()
        add_compact(Path(args.work) / f"p{n}", n, prof, seed=n)
        print(f"compact {n}: {time.perf_counter() - t:.1f} s", flush=True)


def cmd_serve(args: argparse.Namespace) -> None:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for n in args.sizes:
        profiles = args.profiles.split(",")
        suffix = "" if profiles == ["default"] else "_" + "-".join(profiles)
        res = results / f"serve_{n}{suffix}.json"
        if res.exists():
            print(f"serve {n}: done already ({res})")
            continue
        if not args.child:
            subprocess.run([sys.executable, __file__, "serve", str(n), "--child", "--results", args.results,
                            "--work", args.work, "--queries", str(args.queries), "--profiles", args.profiles,
                            "--index", args.index or ""], check=True)
            continue
        path = Path(args.index) if args.index else Path(args.work) / f"p{n}"
        info = serve_one(path, args.queries, results / f"serve_{n}{suffix}.partial.json", profiles)
        res.write_text(json.dumps(info, indent=2) + "\n")
        print(f"serve {n}: {json.dumps(info)}", flush=True)


def _maps_file(a: np.ndarray) -> bool:
    """Whether the array's memory is a file mapping (a np.memmap or a view of one), not an owned copy."""
    import mmap

    while a is not None:
        if isinstance(a, np.memmap) or isinstance(a, mmap.mmap):
            return True
        a = getattr(a, "base", None)
    return False


PROFILES = {"default": {}, "exact": {"profile": "exact"}, "scale": {"profile": "scale"},
            "scale-nprobe64": {"profile": "scale", "ann_nprobe": 64},
            "scale-exact-facts": {"profile": "scale", "fact_index": "exact"}}
"""``serve --profiles``: RetrievalConfig fields per name."""


def _open(path: Path, profile: str, data=None):  # noqa: ANN001, ANN202 - IndexData, Retriever
    from growth_synth import StubEmbedder
    from routerag.config import RetrievalConfig
    from routerag.retrieval import Retriever

    r = Retriever(data if data is not None else path, RetrievalConfig(**PROFILES[profile]), embedder=StubEmbedder())
    r._ensure_graph()
    return r


def serve_one(path: Path, n_queries: int, partial: Path, profiles: list[str] | None = None) -> dict:
    from routerag.runtime import configure_threads

    profiles = profiles or ["default"]
    configure_threads()
    before = _status()
    t = time.perf_counter()
    r = _open(path, profiles[0])
    load_s = time.perf_counter() - t
    after_load = _status()
    others = {}
    for name in profiles[1:]:
        t = time.perf_counter()
        others[name] = _open(path, name, r.data)
        others[name].load_s = time.perf_counter() - t  # type: ignore[attr-defined]
    matrices = {name: (path / name).stat().st_size for name in
                ("passage_embeddings.npy", "entity_embeddings.npy", "fact_embeddings.npy", "fact_embeddings.f16.npy",
                 "passages.faiss", "passages.ann.faiss", "facts.ann.faiss") if (path / name).exists()}
    scorer = r.fact_scorer
    mapped = {"passage_emb": _maps_file(r.passage_emb), "fact_emb": _maps_file(scorer.emb),
              "fact_emb_f16": hasattr(scorer, "half_rows") and _maps_file(scorer.half_rows)
              and scorer.half.data_ptr() == scorer.half_rows.ctypes.data,
              "dense_index_mmap": getattr(r.data, "dense_mapped", False)}
    info = {"load_s": round(load_s, 1), "rss_before_mb": before, "rss_after_load_mb": after_load,
            "mapped": mapped, "profile": r.profile.name, "modes": {}}
    partial.write_text(json.dumps(info, indent=2) + "\n")  # what a run cut short still leaves
    print("loaded", json.dumps(info), flush=True)
    retrievers = {profiles[0]: r, **others}
    modes = _time_modes(retrievers, n_queries, partial, info)
    out = {"passages": r.n_passages, "nodes": r.n_nodes, "counts": r.data.counts, "load_s": round(load_s, 1),
           "rss_before_mb": before, "rss_after_load_mb": after_load, "rss_after_queries_mb": _status(),
           "matrices_bytes": matrices, "matrices_total_mb": round(sum(matrices.values()) / 2**20, 1),
           "mapped": mapped, "profile": r.profile.name, "modes": modes[profiles[0]]}
    if others:
        out["profiles"] = {name: {"resolved": retrievers[name].profile.name if name in others else r.profile.name,
                                  "load_s": round(getattr(retrievers[name], "load_s", load_s), 1),
                                  "modes": modes[name]} for name in profiles}
    return out


def _time_modes(retrievers: dict, n_queries: int, partial: Path, info: dict) -> dict:
    """Per profile and mode: single-query p50/p95 and stage p50s (every profile and mode in turn per query, so
    drift in machine load hits them alike), batched ms per query, and later profiles' top-10 overlap with the
    first's."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((n_queries, 384), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    questions = [f"synthetic question {i}" for i in range(n_queries)]
    names = ("passage", "graph", "hybrid")
    lat = {p: {m: [] for m in names} for p in retrievers}
    stage_lat: dict = {p: {m: {} for m in names} for p in retrievers}
    tops: dict = {p: {m: [] for m in names} for p in retrievers}
    for r in retrievers.values():
        for mode in names:
            r.search(questions[:2], mode=mode, k=5, query_vectors=q[:2])  # warm-up
    for i in range(n_queries):
        for p, r in retrievers.items():
            for mode in names:
                t0 = time.perf_counter()
                res = r.search(questions[i:i + 1], mode=mode, k=10, query_vectors=q[i:i + 1])
                lat[p][mode].append((time.perf_counter() - t0) * 1000)
                tops[p][mode].append([d.id for d in res[0].docs])
                for name, ms in res[0].timings_ms.items():
                    stage_lat[p][mode].setdefault(name, []).append(ms)
    first = next(iter(retrievers))
    modes: dict = {p: {} for p in retrievers}
    for p, r in retrievers.items():
        for mode in names:
            t0 = time.perf_counter()
            r.search(questions, mode=mode, k=5, query_vectors=q)
            batched = (time.perf_counter() - t0) * 1000 / n_queries
            entry = {"p50_ms": round(float(np.percentile(lat[p][mode], 50)), 2),
                     "p95_ms": round(float(np.percentile(lat[p][mode], 95)), 2),
                     "batched_ms_per_query": round(batched, 2), "batch": n_queries,
                     "stage_p50_ms": {k: round(float(np.percentile(v, 50)), 2)
                                      for k, v in stage_lat[p][mode].items()}}
            if p != first:
                entry["top10_overlap_vs_" + first] = round(float(np.mean(
                    [len(set(a) & set(b)) / 10 for a, b in zip(tops[p][mode], tops[first][mode])])), 4)
            modes[p][mode] = entry
            print(p, mode, json.dumps(entry), flush=True)
            partial.write_text(json.dumps(info | {"modes": modes}, indent=2) + "\n")
    return modes


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares of log y on log x: (exponent, log10 coefficient)."""
    b, a = np.polyfit(np.log10(xs), np.log10(ys), 1)
    return float(b), float(a)


def cmd_report(args: argparse.Namespace) -> None:
    results = Path(args.results)
    rows = []
    tail = f"_{args.profiles}" if args.profiles else ""  # serve --profiles' files, e.g. serve_1000000_scale.json
    done = [f for f in results.glob(f"serve_*{tail}.json")
            if f.stem.split("_")[1].isdigit() and f.stem == f"serve_{f.stem.split('_')[1]}{tail}"]
    for f in sorted(done, key=lambda p: int(p.stem.split("_")[1])):
        n = int(f.stem.split("_")[1])
        b = results / f"build_{n}.json"
        if not b.exists():
            continue
        s, bj = json.loads(f.read_text()), json.loads(b.read_text())
        rows.append({"passages": n, "build_s": bj["build_s"], "build_peak_rss_mb": bj["build_peak_rss_mb"],
                     "load_s": s["load_s"], "rss_after_load_mb": s["rss_after_load_mb"]["VmRSS"],
                     "anon_after_load_mb": s["rss_after_load_mb"]["RssAnon"],
                     "load_peak_rss_mb": s["rss_after_load_mb"]["VmHWM"],
                     "rss_after_queries_mb": s["rss_after_queries_mb"]["VmRSS"],
                     "matrices_mb": s["matrices_total_mb"], "disk_mb": bj["disk_mb"],
                     "hybrid_p50_ms": s["modes"]["hybrid"]["p50_ms"], "graph_p50_ms": s["modes"]["graph"]["p50_ms"],
                     "passage_p50_ms": s["modes"]["passage"]["p50_ms"],
                     "ppr_p50_ms": s["modes"]["graph"]["stage_p50_ms"].get("ppr"),
                     "hybrid_batched_ms": s["modes"]["hybrid"]["batched_ms_per_query"]})
    if len(rows) < 2:
        print("need at least two sizes")
        return
    xs = [r["passages"] for r in rows]
    curves = ["build_s", "build_peak_rss_mb", "load_s", "rss_after_load_mb", "anon_after_load_mb", "matrices_mb",
              "hybrid_p50_ms", "graph_p50_ms", "passage_p50_ms", "ppr_p50_ms", "hybrid_batched_ms"]
    fits = {}
    target = 21_000_000
    for c in curves:
        ys = [r[c] for r in rows]
        if any(y is None or y <= 0 for y in ys):
            continue
        b, a = fit(xs, ys)
        # the slope between the two largest sizes: fixed costs (the interpreter, torch) weigh on the smallest
        # size and flatten the all-sizes fit, so this one is the extrapolation to trust
        b2, a2 = fit(xs[-2:], ys[-2:])
        fits[c] = {"exponent": round(b, 3), "at_21M": round(10 ** (a + b * math.log10(target)), 1),
                   "exponent_last2": round(b2, 3), "at_21M_last2": round(10 ** (a2 + b2 * math.log10(target)), 1)}
    out = {"rows": rows, "fits": fits}
    (results / f"report{tail}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    plot(rows, fits, Path(args.plot), args.profiles)


def plot(rows: list[dict], fits: dict, out: Path, profile: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.array([r["passages"] for r in rows], dtype=float)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [("memory (MB)", ["rss_after_load_mb", "anon_after_load_mb", "build_peak_rss_mb", "matrices_mb"]),
              ("single-query latency (ms)", ["hybrid_p50_ms", "graph_p50_ms", "ppr_p50_ms", "passage_p50_ms"]),
              ("seconds", ["build_s", "load_s"])]
    for ax, (title, keys) in zip(axes, panels):
        for key in keys:
            ys = np.array([r[key] or np.nan for r in rows], dtype=float)
            f = fits.get(key)
            label = key + (f" (N^{f['exponent']:.2f}; last two N^{f['exponent_last2']:.2f})" if f else "")
            line, = ax.plot(xs, ys, "o-", label=label)
            if f:
                grid = np.array([xs[-1], 21e6])
                a = np.log10(ys[-1]) - f["exponent_last2"] * np.log10(xs[-1])
                ax.plot(grid, 10 ** (a + f["exponent_last2"] * np.log10(grid)), ":", color=line.get_color())
        ax.axvline(21e6, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("passages (dotted: the two largest sizes' slope, to 21M)")
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    what = f", retrieval profile {profile}" if profile else ""
    fig.suptitle(f"Synthetic indexes with the PopQA index's degree distribution{what} (benchmarks/growth.py)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("profile", "build", "compact", "serve", "report"):
        p = sub.add_parser(name)
        p.add_argument("--results", default=str(DEFAULT_RESULTS))
        p.add_argument("--work", default=str(DEFAULT_WORK))
        p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
        if name == "profile":
            p.add_argument("index")
        if name in ("build", "compact", "serve"):
            p.add_argument("sizes", nargs="+", type=int)
        if name == "build":
            p.add_argument("--ann", default="never", choices=("never", "auto", "always"),
                           help="ann.write: the scale profile's approximate indexes, written as the build does")
            p.add_argument("--no-f16", action="store_true", help="leave out the float16 fact copy (derived)")
            p.add_argument("--ivf-from-rows", type=int, default=None,
                           help="ann.ivf_from_rows for this index (1: inverted files at every size, as at 1M)")
        if name == "serve":
            p.add_argument("--queries", type=int, default=32)
            p.add_argument("--profiles", default="default",
                           help="comma-separated retrieval profiles timed side by side: default, exact, scale")
            p.add_argument("--index", default="", help="serve this index instead of WORK/pN (one size only)")
        if name == "report":
            p.add_argument("--plot", default=str(PLOT))
            p.add_argument("--profiles", default="", help="the serve runs of these --profiles (default: the plain ones)")
    args = ap.parse_args()
    {"profile": cmd_profile, "build": cmd_build, "compact": cmd_compact, "serve": cmd_serve,
     "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
