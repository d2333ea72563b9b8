"""Sharded against unsharded retrieval, side by side in one run: the corpus split round-robin into N shards (one
index each, built with the build cache), each served by a real server on localhost (benchmarks/shard_server.py),
queried through :class:`routerag.retrieval.shards.ShardedRetriever` one question at a time; N = 1 is the whole index
behind one server, the reference.

    python benchmarks/shards.py --corpus popqa_corpus.json --corpus 2wiki_corpus.json --questions q.json \
        --shards 1,2,4 --out /tmp/shards

Prints, per N and mode, recall@5 over the gold passages (by title) and the p50 / p95 of one fan-out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from graph_index.builder import build_index
from graph_index.corpus import load_corpus
from routerag.config import Settings
from routerag.datasets import load_questions
from routerag.retrieval.shards import ShardedRetriever

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_shards(corpus: list[Path], n: int, out: Path) -> list[Path]:
    passages, _ = load_corpus(corpus)
    paths = []
    for i in range(n):
        part = out / f"n{n}" / f"part{i}.jsonl"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_text("".join(json.dumps(p.to_json()) + "\n" for p in passages[i::n]))
        idx = out / f"n{n}" / f"shard{i}"
        if not idx.exists():
            build_index([part], idx, Settings(), progress=False)
        paths.append(idx)
    return paths


def serve(paths: list[Path]) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for p in paths:
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "shard_server.py"), str(p), str(port)],
                                      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{url} did not start"
            time.sleep(0.5)
    return procs, urls


async def measure(urls: list[str], items: list, mode: str) -> dict:
    sharded = ShardedRetriever(urls, timeout_s=30)
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
    args = ap.parse_args()
    items = load_questions(args.questions)[: args.limit]
    for n in (int(x) for x in args.shards.split(",")):
        paths = build_shards(args.corpus, n, args.out)
        procs, urls = serve(paths)
        try:
            for mode in ("passage", "graph", "hybrid"):
                row = {"shards": n, "mode": mode, **asyncio.run(measure(urls, items, mode))}
                print(json.dumps(row), flush=True)
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)


if __name__ == "__main__":
    main()
