"""Sharded against unsharded retrieval, side by side in one run: the corpus split into N shards by
``routerag build-graph --shards N`` (:func:`graph_index.partition.build_shards`; ``--method communities`` or
``round-robin``; built with the build cache), each served by a real server on localhost
(benchmarks/shard_server.py), queried through :class:`routerag.retrieval.shards.ShardedRetriever` one question at a
time; N = 1 is the whole index behind one server (``--whole`` an index already built), the reference.
``--merge rrf`` makes the front merge graph and hybrid rankings by rank alone (the merge before the global
seeding), for comparison (with ``--halo-max-entity-passages 0``: RRF would count a halo copy twice).
``--halo-max-entity-passages`` and ``--halo-fraction`` set the shards' halo (``shards.halo_*``; 0: none).
``--in-process`` calls the shards' retrievers through the same two stages and merges in one process, all questions
as one batch (no servers: recall only, no latency).

    python benchmarks/shards.py --corpus popqa_corpus.json --corpus 2wiki_corpus.json --questions q.json \
        --heldout popqa --shards 1,2,4 --out /tmp/shards

Prints each split's statistics and shard sizes, then per N and mode recall@5 over the gold passages (by title) and
the p50 / p95 of one fan-out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from graph_index.partition import SHARDS_FILE, build_shards
from routerag.config import Settings
from routerag.datasets import load_questions
from routerag.retrieval import Retriever
from routerag.retrieval.shard_seeds import (
    global_seeds,
    rank_with_seeds,
    seed_candidates,
)
from routerag.retrieval.shards import ShardedRetriever, fuse, merge_by_score

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard_indexes(corpus: list[Path], n: int, out: Path, shards: dict) -> list[Path]:
    """The N shard indexes of ``corpus`` under ``out/METHOD-hHALO-FRACTION-nN``, built unless they exist; prints
    the split's statistics and each shard's size."""
    root = out / f"{shards['method']}-h{shards['halo_max_entity_passages']}-{shards['halo_fraction']}-n{n}"
    if not (root / SHARDS_FILE).exists():
        build_shards(corpus, root, Settings(shards=shards), n, progress=False, force=True)
    record = json.loads((root / SHARDS_FILE).read_text())
    paths = sorted(root.glob("shard-*"))
    mib = [round(sum(f.stat().st_size for f in p.resolve().iterdir() if f.is_file()) / 2**20, 1) for p in paths]
    print(json.dumps({"shards": n, **record["partition"], "MiB": mib}), flush=True)
    return paths


def in_process(paths: list[Path], items: list, depth_factor: int) -> dict[str, list[list]]:
    """Every mode's merged top 5 per question, the shards' retrievers called in this process through the two
    stages the front runs (:meth:`ShardedRetriever._seeded_search`), all questions as one batch."""
    cfg = Settings().retrieval
    first = Retriever(paths[0], cfg)
    shards = [first] + [Retriever(p, cfg, embedder=first.embedder) for p in paths[1:]]
    queries = [it.question for it in items]
    if len(shards) == 1:  # the whole index: its own search, the reference
        return {mode: [r.docs for r in first.search(queries, mode, 5)] for mode in ("passage", "graph", "hybrid")}
    depth = 5 * depth_factor
    passages = [merge_by_score([r.docs for r in rows], depth) for rows in
                zip(*(s.search(queries, "passage", depth) for s in shards))]
    seeds = [g.to_json() for g in global_seeds([seed_candidates(s, queries) for s in shards], cfg)]
    graph = [merge_by_score([r.docs for r in rows], depth) for rows in
             zip(*(rank_with_seeds(s, queries, seeds, depth) for s in shards))]
    return {"passage": [p[:5] for p in passages], "graph": [g[:5] for g in graph],
            "hybrid": [fuse([p, g], 5, cfg.rrf_k) for p, g in zip(passages, graph)]}


def recall(items: list, lists: list[list]) -> float:
    rec = []
    for it, docs in zip(items, lists):
        gold = {g.title for g in it.supporting}
        if gold:
            rec.append(len({d.title for d in docs} & gold) / len(gold))
    return round(statistics.mean(rec), 4)


def serve(paths: list[Path], procs: list[subprocess.Popen]) -> list[str]:
    """A shard server per index (appended to ``procs`` as started, so the caller stops them even when one does
    not come up); their URLs once all answer /ready."""
    urls = []
    for p in paths:
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "shard_server.py"), str(p), str(port)],
                                      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        deadline = time.monotonic() + 900
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{url} did not start"
            time.sleep(0.5)
    return urls


async def measure(urls: list[str], items: list, mode: str, merge: str) -> dict:
    sharded = ShardedRetriever(urls, timeout_s=30)
    if merge == "rrf":
        sharded.seeded = False
    lat, rec = [], []
    try:
        for it in items:
            t = time.perf_counter()
            [res], reports = await sharded.search([it.question], mode, 5)
            lat.append((time.perf_counter() - t) * 1000)
            assert all(r.ok for r in reports), reports
            gold = {g.title for g in it.supporting}
            if gold:
                rec.append(len({d.title for d in res.docs} & gold) / len(gold))
    finally:
        await sharded.aclose()
    lat.sort()
    return {"recall@5": round(statistics.mean(rec), 4), "p50_ms": round(statistics.median(lat), 2),
            "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, action="append", required=True)
    ap.add_argument("--questions", type=Path, required=True)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("/tmp/routerag-shards"))
    ap.add_argument("--method", choices=["communities", "round-robin"], default="communities")
    ap.add_argument("--merge", choices=["seeded", "rrf"], default="seeded")
    ap.add_argument("--whole", type=Path, help="The unsharded index for N = 1 (else built like a shard).")
    ap.add_argument("--halo-max-entity-passages", type=int, default=Settings().shards.halo_max_entity_passages)
    ap.add_argument("--halo-fraction", type=float, default=Settings().shards.halo_fraction)
    ap.add_argument("--in-process", action="store_true", help="No servers: recall only.")
    ap.add_argument("--heldout", choices=["popqa"], help="Take PopQA's held-out 200 (notes/SPLITS.md: shuffled "
                                                          "with seed 0, items 300 to 500) instead of the first.")
    args = ap.parse_args()
    items = load_questions(args.questions)
    if args.heldout == "popqa":
        random.Random(0).shuffle(items)
        items = items[300:500]
    items = items[: args.limit]
    shards = {"method": args.method, "halo_max_entity_passages": args.halo_max_entity_passages,
              "halo_fraction": args.halo_fraction}
    for n in (int(x) for x in args.shards.split(",")):
        paths = [args.whole] if n == 1 and args.whole else shard_indexes(args.corpus, n, args.out, shards)
        if args.in_process:
            lists = in_process(paths, items, Settings().retrieval.rrf_depth)
            for mode in ("passage", "graph", "hybrid"):
                print(json.dumps({"shards": n, **shards, "mode": mode, "recall@5": recall(items, lists[mode])}),
                      flush=True)
            continue
        procs: list[subprocess.Popen] = []
        try:
            urls = serve(paths, procs)
            for mode in ("passage", "graph", "hybrid"):
                row = {"shards": n, **shards, "merge": args.merge, "mode": mode,
                       **asyncio.run(measure(urls, items, mode, args.merge))}
                print(json.dumps(row), flush=True)
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)


if __name__ == "__main__":
    main()
