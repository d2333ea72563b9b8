"""Index build cost, stage by stage, against the raw encode time of the same texts.

    python benchmarks/build_bench.py build OUT_DIR CORPUS... [--json results.json]
    python benchmarks/build_bench.py compare-openie CORPUS OPENIE_RESULTS [--json results.json]

``build`` runs ``routerag build-graph`` with the CPU defaults and an empty cache in a child process (so its peak
RSS is its own), then times ``SentenceTransformer.encode`` alone on exactly the texts the build embedded
(passages, entities, facts). The target: every stage but OpenIE within 1.25× that raw encode time.

``compare-openie`` builds the same corpus twice — CPU extractor, and imported LLM OpenIE — and reports entities,
facts and how many of the LLM's entities the CPU extractor also found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_build(out: Path, corpus: list[str], extra: list[str], cache: Path) -> dict:
    env = dict(os.environ, ROUTERAG_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-m", "routerag", "build-graph", *corpus, "--out", str(out), "--force", "--json", *extra]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"build failed:\n{proc.stderr[-3000:]}")
    manifest = json.loads(proc.stdout)
    manifest["wall_s"] = round(wall, 1)
    return manifest


def raw_encode_seconds(index: Path) -> dict:
    """Time the bare model on the texts the build embedded, in the same batch size."""
    import numpy as np  # noqa: F401

    from graph_index.graph import fact_text
    from graph_index.store import IndexData
    from graph_index.embedders.sentence_transformers import embedded_minilm_path
    from sentence_transformers import SentenceTransformer

    data = IndexData(index)
    model = SentenceTransformer(str(embedded_minilm_path()), device="cpu")
    texts = {
        "passages": [p.content for p in data.passages],
        "entities": list(data.entities),
        "facts": [fact_text(f) for f in data.facts],
    }
    out = {}
    for name, batch in texts.items():
        t = time.perf_counter()
        model.encode(batch, batch_size=64, show_progress_bar=False, convert_to_numpy=True)
        out[name] = round(time.perf_counter() - t, 2)
    out["total"] = round(sum(out.values()), 2)
    return out


def cmd_build(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        m = run_build(Path(args.out), args.corpus, [], Path(cache))
    t = m["timings_s"]
    raw = raw_encode_seconds(Path(args.out))
    non_openie = sum(v for k, v in t.items() if k != "openie")
    encode = t["embed_passages"] + t["embed_entities"] + t["embed_facts"]
    result = {
        "corpus": args.corpus, "counts": m["counts"], "timings_s": t, "wall_s": m["wall_s"],
        "peak_rss_mb": m["peak_rss_mb"], "raw_encode_s": raw,
        "all_but_openie_s": round(non_openie, 1),
        "all_but_openie_over_raw_encode": round(non_openie / raw["total"], 3),
        "embedding_stages_over_raw_encode": round(encode / raw["total"], 3),
        "openie_passages_per_s": round(m["counts"]["passages"] / t["openie"], 1),
    }
    return result


def cmd_compare(args: argparse.Namespace) -> dict:
    from graph_index.normalize import normalize_phrase
    from graph_index.store import IndexData

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for name, extra in (("cpu", []), ("llm_imported", ["--openie-results", args.openie])):
            m = run_build(Path(tmp) / name, [args.corpus], extra, cache)
            data = IndexData(Path(tmp) / name)
            named = {normalize_phrase(e) for r in data.openie for e in r.entities} - {""}
            out[name] = {"entities": m["counts"]["entities"], "named_entities": len(named), "facts": m["counts"]["facts"],
                         "synonymy_edges": m["counts"]["synonymy_edges"], "edges": m["counts"]["edges"],
                         "openie_s": m["timings_s"]["openie"], "_named": named, "_nodes": set(data.entities)}
        llm, cpu = out["llm_imported"], out["cpu"]
        out["llm_named_entities_found_by_cpu"] = len(llm["_named"] & cpu["_nodes"])
        out["share_of_llm_named_entities_found_by_cpu"] = round(len(llm["_named"] & cpu["_nodes"]) / len(llm["_named"]), 3)
        out["llm_nodes_found_by_cpu"] = len(llm["_nodes"] & cpu["_nodes"])
        out["share_of_llm_nodes_found_by_cpu"] = round(len(llm["_nodes"] & cpu["_nodes"]) / len(llm["_nodes"]), 3)
        for v in (llm, cpu):
            v.pop("_named")
            v.pop("_nodes")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out")
    b.add_argument("corpus", nargs="+")
    b.add_argument("--json")
    c = sub.add_parser("compare-openie")
    c.add_argument("corpus")
    c.add_argument("openie")
    c.add_argument("--json")
    args = ap.parse_args()
    result = cmd_build(args) if args.cmd == "build" else cmd_compare(args)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
