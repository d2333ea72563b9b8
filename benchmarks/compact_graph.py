"""The compact serving graph against the code before it: same rankings, less memory, faster loads.

    python benchmarks/compact_graph.py rankings CODE INDEX QUESTIONS.json OUT.json   # top 10 + recall per mode
    python benchmarks/compact_graph.py load CODE INDEX                                # load time and memory
    python benchmarks/compact_graph.py compare BEFORE.json AFTER.json                # rankings identical?

``CODE`` is the repository root whose code runs (a checkout of the commit before, e.g. ``git worktree add
/tmp/before main``, or this one), so the two sides run the same script. ``load`` opens a synthetic index of
``benchmarks/growth.py`` as its ``serve`` does (``Retriever`` with the graph part loaded) and prints the load time and
``/proc/self/status`` (RssAnon is the anonymous part) and its CPU seconds (which a busy host does not inflate as it
does the wall time), then searches two queries. A first load of an index without the
compact graph files converts it (once): load it twice, or give it the files first (``growth.py compact``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def _use(code: str) -> None:
    root = Path(code).resolve()
    sys.path[:0] = [str(root), str(root / "benchmarks")]


def cmd_rankings(code: str, index: str, questions: str, out: str) -> None:
    _use(code)
    from retrieval_bench import quality
    from routerag.config import RetrievalConfig
    from routerag.datasets import load_questions
    from routerag.retrieval import Retriever
    from routerag.runtime import configure_threads

    configure_threads()
    items = load_questions(questions)
    t = time.perf_counter()
    r = Retriever(index, RetrievalConfig())
    r._ensure_graph()
    res: dict = {"code": code, "load_s": round(time.perf_counter() - t, 2), "modes": {}, "rankings": {}}
    for mode in ("passage", "graph", "hybrid"):
        res["modes"][mode] = quality(r, items, mode)
        found = r.search([it.question for it in items], mode=mode, k=10)
        res["rankings"][mode] = [[(d.id, d.score) for d in x.docs] for x in found]
        print(mode, res["modes"][mode], flush=True)
    Path(out).write_text(json.dumps(res))


def cmd_load(code: str, index: str) -> None:
    _use(code)
    from growth import _status
    from growth_synth import StubEmbedder
    from routerag.config import RetrievalConfig
    from routerag.retrieval import Retriever
    from routerag.runtime import configure_threads

    configure_threads()
    before = _status()
    t, cpu = time.perf_counter(), _cpu_s()
    r = Retriever(Path(index), RetrievalConfig(), embedder=StubEmbedder())
    r._ensure_graph()
    load_s, load_cpu_s = time.perf_counter() - t, _cpu_s() - cpu
    after = _status()
    q = np.random.default_rng(7).standard_normal((2, 384)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    found = r.search(["a", "b"], mode="hybrid", k=5, query_vectors=q)
    print(json.dumps({"code": code, "index": index, "load_s": round(load_s, 1), "load_cpu_s": round(load_cpu_s, 1),
                      "rss_before_mb": before,
                      "rss_after_load_mb": after, "top5": [[d.id for d in x.docs] for x in found]}), flush=True)


def _cpu_s() -> float:
    """This process's CPU seconds (user + system, all threads): a load's cost that a busy host does not inflate, as
    it does the wall time."""
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def cmd_compare(before: str, after: str) -> None:
    a, b = json.loads(Path(before).read_text()), json.loads(Path(after).read_text())
    for mode in a["rankings"]:
        ra, rb = a["rankings"][mode], b["rankings"][mode]
        print(json.dumps({"mode": mode, "questions": len(ra), "identical_ids_and_scores": ra == rb,
                          "recall@5": [a["modes"][mode]["recall@5"], b["modes"][mode]["recall@5"]]}))


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    {"rankings": cmd_rankings, "load": cmd_load, "compare": cmd_compare}[cmd](*rest)
