"""``routerag build-graph --shards N``: the corpus split into N shards along the knowledge graph's communities, so
that the passages a multi-hop path joins land on one shard, then one index built per shard.

A first cheap pass extracts every passage's OpenIE (through the build cache, which the shard builds then hit) and
assembles the passage–entity graph without synonymy or embeddings (:func:`~graph_index.graph.build_graph` over
:func:`~graph_index.graph.collect_content`). Louvain's multilevel modularity clustering (igraph's
``community_multilevel``, weighted) groups passages with the entities they share; the communities are packed into N
shards, largest first onto the lightest shard, and a community too large for one shard is split along its finer
levels (the hierarchy Louvain returns), then by passage order. A round-robin split (``shards.method``), kept as the
baseline, cuts a fact's two passages apart N−1 times in N; what the graph split cuts is reported as ``cut``.

No split cuts nothing: an entity whose passages lie on two shards is two vertices, one on each, and a PageRank walk
through it cannot cross. So each shard also holds a *halo* (:func:`halo_rows`): the other shards' passages that
share a non-hub entity with its own, the most strongly linked first, bounded (``shards.halo_*``). A shard's graph
then reaches across the cut, and a sharded search keeps each passage at its highest score over the shards that
hold it (:mod:`routerag.retrieval.shard_seeds`); the halo's ids are listed in the shard's manifest (``halo``).

Each shard is an ordinary index (``OUT/shard-000`` …), built by :func:`~graph_index.builder.build_index` from its
own JSONL part; ``OUT/shards.json`` lists them with the partition's statistics.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import igraph as ig
import numpy as np
import scipy.sparse as sp

from .config import BuildConfig, ShardConfig
from .corpus import Passage, load_corpus
from .graph import build_graph, collect_content
from .openie.base import OpenIEResult

log = logging.getLogger(__name__)

SHARDS_FILE = "shards.json"


def shard_name(i: int) -> str:
    return f"shard-{i:03d}"


def passage_graph(passages: Sequence[Passage], results: Sequence[OpenIEResult], cfg: BuildConfig) -> ig.Graph:
    """The index's graph without synonymy edges: what the partition reads (vertex i is passage i)."""
    content = collect_content(passages, results, cfg.graph)
    return build_graph([p.id for p in passages], content, {}, cfg.graph)


def community_levels(g: ig.Graph, seed: int) -> list[np.ndarray]:
    """Louvain's hierarchy over ``g``'s vertices, finest level first: per level, each vertex's community."""
    import random

    state = random.getstate()
    random.seed(seed)  # igraph's community code draws from Python's RNG
    try:
        levels = g.community_multilevel(weights="weight" if g.ecount() else None, return_levels=True)
    finally:
        random.setstate(state)
    if not levels:
        return [np.arange(g.vcount())]
    return [np.asarray(level.membership, dtype=np.int64) for level in levels]


def _groups(members: np.ndarray, levels: list[np.ndarray], depth: int, cap: int) -> list[np.ndarray]:
    """``members`` (passage rows) as groups of at most ``cap``: their community at level ``depth``, each too large a
    community split again at the next finer level, and at the finest by order."""
    if len(members) <= cap:
        return [members]
    if depth < 0:
        return [members[i:i + cap] for i in range(0, len(members), cap)]
    labels = levels[depth][members]
    order = np.argsort(labels, kind="stable")
    cuts = np.flatnonzero(np.diff(labels[order])) + 1
    parts = np.split(members[order], cuts)
    if len(parts) == 1:
        return _groups(members, levels, depth - 1, cap)
    return [g for part in parts for g in _groups(part, levels, depth - 1, cap)]


def assign_shards(levels: list[np.ndarray], n_passages: int, n_shards: int, max_imbalance: float) -> np.ndarray:
    """Per passage its shard: the coarsest communities packed largest first onto the lightest shard, none larger
    than a shard may hold (``(1 + max_imbalance) · P / N``)."""
    cap = max(1, math.ceil(n_passages / n_shards * (1 + max_imbalance)))
    rows = np.arange(n_passages)
    groups = _groups(rows, [lv[:n_passages] for lv in levels], len(levels) - 1, cap)
    groups.sort(key=lambda g: (-len(g), int(g[0])))
    load = np.zeros(n_shards, dtype=np.int64)
    shard = np.empty(n_passages, dtype=np.int64)
    for group in groups:
        fits = np.flatnonzero(load + len(group) <= cap)
        s = int(fits[np.argmin(load[fits])]) if len(fits) else int(np.argmin(load))
        shard[group] = s
        load[s] += len(group)
    return shard


def cut_statistics(g: ig.Graph, shard: np.ndarray) -> dict[str, float]:
    """How much of the graph a split cuts: entities whose passages lie on more than one shard, and passage pairs
    joined through an entity (one edge each, weighted as the PageRank walks them) that are split."""
    n_pass = len(shard)
    spanning = entities = 0
    for v in range(n_pass, g.vcount()):
        ps = {shard[u] for u in g.neighbors(v) if u < n_pass}
        if ps:
            entities += 1
            spanning += len(ps) > 1
    pairs = cut = 0
    for v in range(n_pass, g.vcount()):
        owners = np.asarray([shard[u] for u in g.neighbors(v) if u < n_pass])
        if len(owners) > 1:
            counts = np.bincount(owners)
            total = len(owners) * (len(owners) - 1) // 2
            pairs += total
            cut += total - int((counts * (counts - 1) // 2).sum())
    return {"entities_on_several_shards": round(spanning / max(entities, 1), 4),
            "passage_pairs_cut": round(cut / max(pairs, 1), 4)}


def incidence(g: ig.Graph, n_pass: int) -> sp.csr_matrix:
    """Passages × entities, each passage–entity edge's weight (mention or title); entity–entity edges left out."""
    edges = np.asarray(g.get_edgelist(), dtype=np.int64).reshape(-1, 2)
    weights = np.asarray(g.es["weight"] if g.ecount() else [], dtype=np.float64)
    edges.sort(axis=1)
    links = (edges[:, 0] < n_pass) & (edges[:, 1] >= n_pass)
    return sp.csr_matrix((weights[links], (edges[links, 0], edges[links, 1] - n_pass)),
                         shape=(n_pass, g.vcount() - n_pass))


def halo_rows(g: ig.Graph, shard: np.ndarray, cfg: ShardConfig) -> list[np.ndarray]:
    """Per shard, the rows of the other shards' passages it also holds: those that share an entity linked to at
    most ``halo_max_entity_passages`` passages with one of its own, at most ``halo_fraction`` × its own passages,
    the most strongly linked first: a passage's link through a shared entity weighs its share of the entity's
    passage edges (what a walk at the entity sends it: a page through its title entity weighs most), summed over
    the shared entities. Hubs stay out: a walk through one spreads thin, and it would pull half the corpus in."""
    n_shards = int(shard.max()) + 1
    if cfg.halo_max_entity_passages <= 0 or cfg.halo_fraction <= 0 or n_shards < 2:
        return [np.empty(0, dtype=np.int64) for _ in range(n_shards)]
    inc = incidence(g, len(shard))
    count = np.diff(inc.tocsc().indptr)
    keep = np.flatnonzero((count >= 2) & (count <= cfg.halo_max_entity_passages))
    inc = inc[:, keep].tocsr()
    share = inc @ sp.diags(1.0 / np.asarray(inc.sum(axis=0)).ravel())  # each entity's edges as fractions
    out = []
    for s in range(n_shards):
        own = shard == s
        touched = np.asarray(inc[np.flatnonzero(own)].sum(axis=0)).ravel() > 0
        score = share @ touched.astype(np.float64)
        score[own] = 0
        rows = np.flatnonzero(score > 0)
        rows = rows[np.lexsort((rows, -score[rows]))][: math.ceil(cfg.halo_fraction * int(own.sum()))]
        out.append(np.sort(rows))
    return out


def partition(passages: Sequence[Passage], results: Sequence[OpenIEResult], cfg: BuildConfig, n_shards: int
              ) -> tuple[np.ndarray, list[np.ndarray], dict[str, Any]]:
    """Per passage its shard (``shards.method``), per shard its halo's rows (:func:`halo_rows`), and the split's
    statistics."""
    g = passage_graph(passages, results, cfg)
    n = len(passages)
    if cfg.shards.method == "round-robin":
        shard = np.arange(n) % n_shards
        stats: dict[str, Any] = {"method": "round-robin"}
    else:
        levels = community_levels(g, cfg.shards.seed)
        shard = assign_shards(levels, n, n_shards, cfg.shards.max_imbalance)
        stats = {"method": "communities", "communities": len(np.unique(levels[-1][:n])),
                 "modularity": round(float(g.modularity(levels[-1].tolist(), weights="weight")), 4)
                 if g.ecount() else 0.0}
    stats["passages"] = np.bincount(shard, minlength=n_shards).tolist()
    stats.update(cut_statistics(g, shard))
    halo = halo_rows(g, shard, cfg.shards)
    stats["halo"] = [len(h) for h in halo]
    return shard, halo, stats


def build_shards(corpus_paths: Sequence[str | Path], out: Path, cfg: BuildConfig, n_shards: int, *,
                 force: bool = False, progress: bool = True, components: Any = None,
                 openie_results: Path | None = None) -> dict[str, Any]:
    """Build ``n_shards`` indexes under ``out`` (one directory each) from one corpus, split by :func:`partition`;
    returns what ``out/shards.json`` records. The first pass's extraction fills the build cache, so the shard
    builds extract nothing again."""
    from .builder import Components, _extract
    from .openie.imported import load_openie_results

    if n_shards < 1:
        raise ValueError("--shards must be at least 1")
    out = Path(out)
    if (out / SHARDS_FILE).exists() and not force:
        raise FileExistsError(f"{out} already holds shards; pass --force to replace them")
    comp = components or Components(cfg)
    passages, _ = load_corpus(corpus_paths, **cfg.corpus.model_dump())
    if n_shards > len(passages):
        raise ValueError(f"--shards {n_shards} is more than the corpus's {len(passages)} passages")
    preset = load_openie_results(openie_results) if openie_results else None
    results, _ = _extract(comp, passages, preset, progress=progress)
    shard, halo, stats = partition(passages, results, cfg, n_shards)
    log.info("partition: %s", stats)
    return _write_shards(passages, shard, halo, out, cfg, comp, stats, force=force, progress=progress,
                         openie_results=openie_results)


def _write_shards(passages: Sequence[Passage], shard: np.ndarray, halo: list[np.ndarray], out: Path,
                  cfg: BuildConfig, comp: Any, stats: dict[str, Any], *, force: bool, progress: bool,
                  openie_results: Path | None) -> dict[str, Any]:
    """Each shard's passages, then its halo's, as a JSONL part, built into ``out/shard-NNN``; then
    ``out/shards.json``."""
    from .atomic import write_text_atomic
    from .builder import build_index

    out.mkdir(parents=True, exist_ok=True)
    entries = []
    with tempfile.TemporaryDirectory(prefix=".parts-", dir=out) as tmp:
        for i in range(int(shard.max()) + 1):
            part = Path(tmp) / f"{shard_name(i)}.jsonl"
            rows = np.flatnonzero(shard == i)
            held = np.concatenate([rows, halo[i]])
            part.write_text("".join(json.dumps(passages[r].to_json()) + "\n" for r in held), encoding="utf-8")
            build_index([part], out / shard_name(i), cfg, force=force, progress=progress, components=comp,
                        openie_results=openie_results, halo=[passages[r].id for r in halo[i]])
            entries.append({"name": shard_name(i), "passages": len(rows), "halo": len(halo[i])})
    record = {"shards": entries, "partition": stats}
    write_text_atomic(out / SHARDS_FILE, json.dumps(record, indent=2) + "\n")
    return record
