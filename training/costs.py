"""The retrieval cost table: what one search costs in each mode on this index, measured in isolation.

RouteRAG's stage-2 reward charges each rollout its retrieval time. On 2 shared CPU cores that time is mostly noise:
the ~15 ms between a passage and a graph search drowns in scheduling (two of 14 steps of an earlier run averaged
34 and 63 ms per rollout with every search isolated). So the trainer can price each search by a table instead: the
median time of single searches of each mode, measured once when training starts, alone, interleaved across modes so
that a drift of the machine hits every mode alike, and recorded in the run (``retrieval_costs.json``) so that a
resumed run prices searches as it did before.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graph_index.atomic import write_text_atomic
from routerag.retrieval import Retriever
from routerag.vocabulary import MODES, Mode

COSTS_FILE = "retrieval_costs.json"


def measure_cost_table(retriever: Retriever, queries: Sequence[str], k: int, *, repeats: int = 3,
                       modes: Sequence[Mode] = MODES) -> dict[str, Any]:
    """Median milliseconds of one search per mode, over ``queries`` × ``repeats`` single-query searches, the modes
    interleaved query by query (after one warm-up search per mode)."""
    if not queries:
        raise ValueError("the cost table needs at least one query")
    for mode in modes:  # load the graph, warm the encoder and caches: the first search pays for them
        retriever.search([queries[0]], mode=mode, k=k)
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(repeats):
        for q in queries:
            for mode in modes:
                t0 = time.perf_counter()
                retriever.search([q], mode=mode, k=k)
                samples[mode].append((time.perf_counter() - t0) * 1000)
    return {"ms": {m: round(statistics.median(v), 3) for m, v in samples.items()},
            "p90_ms": {m: round(sorted(v)[int(0.9 * (len(v) - 1))], 3) for m, v in samples.items()},
            "searches_per_mode": len(queries) * repeats, "k": k,
            "index": str(getattr(getattr(retriever, "data", None), "path", "")) or None}


def load_or_measure(out: Path, retriever: Retriever, queries: Sequence[str], k: int, **kwargs: Any) -> dict[str, Any]:
    """The run's table: the one recorded in ``out`` (a resumed run keeps its prices), else a new measurement,
    recorded there."""
    path = Path(out) / COSTS_FILE
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    table = measure_cost_table(retriever, queries, k, **kwargs)
    write_text_atomic(path, json.dumps(table, indent=2) + "\n")
    return table
