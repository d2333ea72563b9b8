"""Graph search over shards with one global seeding, so the shards' PageRank scores compare.

An unsharded graph search seeds its PageRank from the whole index: the dense top N min-max normalised over those N,
the top facts min-max normalised over all facts, each seed entity's weight divided by its passage count. A shard
that seeds from its own part alone normalises against its own best, so its weak fifth passage looks as strong as
another shard's best: scores do not compare, and only a rank fusion was left. Two stages fix that:

1. ``seeds``: each shard reports its raw candidates (:func:`seed_candidates`): its dense top N with scores, its top
   facts with raw scores, end entities and their local passage counts, its fact score range, the entities the query
   names. Scores are inner products of one embedder, so they compare across shards.
2. The front merges them into the seeding one index would have made (:func:`global_seeds`): the global dense top N
   and top facts, normalised over the global ranges; each entity's passage count summed over the shards that
   reported it.
3. ``rank``: every shard runs PageRank from that same seeding restricted to its vertices (:func:`rank_with_seeds`),
   with the reset *not* renormalised per shard: PageRank is linear in its reset, so a shard's scores are its share
   of the mass one graph would give, and the front merges all shards' lists by score.

When no link crosses shards (a graph-aware split keeps most inside one) this equals the unsharded search; an entity
on several shards is seeded on each, and a path through it that crosses shards is lost. Hence the *halo*
(:func:`graph_index.partition.halo_rows`): a shard also holds the other shards' passages that share a non-hub entity
with its own (their ids in its manifest's ``halo``), so its graph reaches across the cut. Each shard then
approximates the one-graph PageRank over the part of the graph it holds, from every seed it holds (a halo passage
seeds as well), and answers with every passage it holds (:func:`rank_with_seeds`); the front keeps each passage
once, at its highest score: a halo bounded in size reaches across a cut from one side or the other, and the copy
whose shard holds more of the paths to it scores it higher (measured: the highest beat the owner's score, 0.70 to
0.69 graph recall@5 at 4 shards, docs/research/2026-11-28-shard-halo.md). Counts and edge weights a shard reports
are its own passages', so summed over the shards they are the whole corpus's, halo or not; the dense candidates are
merged by passage id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graph_index.normalize import normalize_phrase
from routerag.config import RetrievalConfig

from .retriever import Retriever, _minmax_rows
from .types import RetrievalResult, RetrievedDoc

MAX_NAME_WORDS = 8
"""Longest entity name, in words, a query is matched against (as :meth:`IndexData.entities_in`)."""


def seed_candidates(retriever: Retriever, queries: list[str]) -> list[dict[str, Any]]:
    """Per query this shard's raw seeding material (stage 1; see the module's notes), as JSON."""
    retriever._ensure_graph()
    cfg, data = retriever.cfg, retriever.data
    q = retriever.embed(queries)
    seed_n = min(max(cfg.dense_seed_passages, 0), retriever.n_passages)
    dense = retriever.dense_hits(q, seed_n) if seed_n else None
    names = data.vertex_label
    counts, own_w, _, entity_w = _owned_links(retriever)
    out: list[dict[str, Any]] = [{"dense": [], "facts": [], "fact_range": None, "named": []} for _ in queries]
    if dense is not None:
        for r in range(len(queries)):
            out[r]["dense"] = [[retriever.passages[i].id, float(s)] for s, i in zip(dense[0][r], dense[1][r]) if i >= 0]
    if len(retriever.facts) and cfg.fact_top_k > 0:
        m = retriever.fact_scorer.match(q, cfg.fact_top_k)
        for r in range(len(queries)):
            out[r]["fact_range"] = [float(m.lo[r]), float(m.hi[r])]
            out[r]["facts"] = [{"fact": list(retriever.facts[int(j)]), "score": float(x),
                                "ends": [[names(int(v)), float(counts[v]), float(own_w[v]), float(entity_w[v])]
                                         if v >= 0 else None
                                         for v in retriever.fact_ends[int(j)]]}
                               for j, x in zip(m.top[r], m.scores[r])]
    if cfg.query_entity_weight > 0:
        for r, query in enumerate(queries):
            out[r]["named"] = [[name, float(counts[v]), start, n, float(own_w[v]), float(entity_w[v])]
                              for name, v, start, n in _named(data, query)]
    return out


def _named(data: Any, query: str) -> list[tuple[str, int, int, int]]:
    """Every entity of this shard the query names verbatim, overlapping or not, as (name, vertex, first word,
    words): the front picks the longest non-overlapping ones over all shards, as one index's
    :meth:`~graph_index.store.IndexData.entities_in` picks among its own (a shard without "new york city" would
    otherwise seed "york")."""
    words = normalize_phrase(query).split()
    spans = [(" ".join(words[i:i + n]), i, n) for n in range(min(MAX_NAME_WORDS, len(words)), 0, -1)
             for i in range(len(words) - n + 1)]
    vertices = data.entity_vertex([name for name, _, _ in spans])  # one lookup in the mapped name table
    return [(name, int(v), i, n) for (name, i, n), v in zip(spans, vertices) if v >= 0]


def _named_globally(cands: list[dict[str, Any]]) -> list[str]:
    """The longest non-overlapping names among every shard's matches (longest first, then leftmost)."""
    spans = sorted({(int(n), int(start), name) for c in cands for name, _, start, n, *_ in c["named"]},
                   key=lambda s: (-s[0], s[1]))
    taken: set[int] = set()
    chosen = []
    for n, start, name in spans:
        cover = set(range(start, start + n))
        if not cover & taken:
            taken |= cover
            chosen.append(name)
    return chosen


def owned_mask(retriever: Retriever) -> np.ndarray:
    """Per passage row whether this shard owns it (False: a halo passage it holds for a neighbour; cached)."""
    owned = getattr(retriever, "_shard_owned", None)
    if owned is None:
        halo = set(retriever.data.manifest.get("halo", ()))
        owned = np.ones(retriever.n_passages, dtype=bool)
        if halo:
            owned = np.fromiter((p.id not in halo for p in retriever.passages), bool, retriever.n_passages)
        retriever._shard_owned = owned  # type: ignore[attr-defined]
    return owned


def _owned_links(retriever: Retriever) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per vertex (cached): the passages it is linked to that this shard owns, the weight of its edges to those,
    to every passage this shard holds, and to other entities. An entity's seed divides between shards by these
    weights (the walk's first step from it). Summed over the shards, the owned columns are the corpus's (a
    passage mentioning an entity without an edge, a common noun at ``common_mention_weight`` 0, is counted where it
    is held); entity–entity edges are the same on every shard that holds the facts making them, so the front
    takes their largest."""
    cached = getattr(retriever, "_shard_links", None)
    if cached is None:
        adj = retriever.data.compact_graph.adjacency()
        n = retriever.n_passages
        owned = owned_mask(retriever)
        halo = adj[:, np.flatnonzero(~owned)]
        counts = np.asarray(retriever.entity_passages, dtype=np.float64) - np.asarray((halo > 0).sum(axis=1)).ravel()
        to_passages = np.asarray(adj[:, :n].sum(axis=1), dtype=np.float64).ravel()
        to_own = to_passages - np.asarray(halo.sum(axis=1), dtype=np.float64).ravel()
        to_entities = np.asarray(adj[:, n:].sum(axis=1), dtype=np.float64).ravel()
        cached = (counts, to_own, to_passages, to_entities)
        retriever._shard_links = cached  # type: ignore[attr-defined]
    return cached


@dataclass(slots=True)
class GlobalSeeds:
    """One query's seeding over all shards: passage id → weight, entity name → weight, and each seed entity's
    edge weight over the corpus (:func:`_entity_totals`). A shard seeds the share of an entity that its edges of it
    carry, as PageRank on one graph would send it: an entity on two shards is not seeded twice over, and one whose
    every passage a shard holds, through its halo, is seeded whole there."""

    passages: dict[str, float]
    entities: dict[str, float]
    strength: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"passages": self.passages, "entities": self.entities,
                "strength": {name: self.strength[name] for name in self.entities if name in self.strength}}


def global_seeds(per_shard: list[list[dict[str, Any]]], cfg: RetrievalConfig) -> list[GlobalSeeds]:
    """Stage 2: each query's candidates from every shard that answered, as the seeding one index would make."""
    return [_one_query([shard[r] for shard in per_shard], cfg) for r in range(len(per_shard[0]))]


def _one_query(cands: list[dict[str, Any]], cfg: RetrievalConfig) -> GlobalSeeds:
    passages, strength = _entity_totals(cands)
    seeds = GlobalSeeds({}, {}, strength)
    best: dict[str, float] = {}
    for c in cands:  # a halo passage is reported by its owner and by its neighbours: once, by id
        for pid, score in c["dense"]:
            best[pid] = max(score, best.get(pid, score))
    dense = sorted(best.items(), key=lambda d: -d[1])[: cfg.dense_seed_passages]
    if dense:
        norm = _minmax_rows(np.asarray([[s for _, s in dense]], dtype=np.float32))[0] * cfg.passage_node_weight
        for (pid, _), w in zip(dense, norm):
            if w > 0:
                seeds.passages[pid] = seeds.passages.get(pid, 0.0) + float(w)
    _fact_seeds(cands, cfg, passages, seeds)
    if cfg.query_entity_weight > 0:
        for name in _named_globally(cands):
            w = cfg.query_entity_weight / max(passages.get(name, 0.0), 1.0)
            seeds.entities[name] = seeds.entities.get(name, 0.0) + w
    return seeds


def _entity_totals(cands: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Entity name → its passages, and its edge weight, over the corpus: each shard's own passages and their
    edges summed, plus the largest entity–entity weight a shard reported (see :func:`_owned_links`)."""
    count: dict[str, float] = {}
    own: dict[str, float] = {}
    shared: dict[str, float] = {}
    for c in cands:
        # a shard of the release before halos reports one edge weight, all its edges': read as its own
        local = {end[0]: (end[1], end[2], end[3] if len(end) > 3 else 0.0)
                 for f in c["facts"] for end in f["ends"] if end is not None}
        local.update({row[0]: (row[1], row[4], row[5] if len(row) > 5 else 0.0) for row in c["named"]})
        for name, (n, w, e) in local.items():
            count[name] = count.get(name, 0.0) + n
            own[name] = own.get(name, 0.0) + w
            shared[name] = max(shared.get(name, 0.0), e)
    return count, {name: own[name] + shared[name] for name in own}


def _fact_seeds(cands: list[dict[str, Any]], cfg: RetrievalConfig, passages: dict[str, float],
                seeds: GlobalSeeds) -> None:
    """HippoRAG 2's phrase weights from the global top facts, min-max normalised over every shard's facts."""
    ranges = [c["fact_range"] for c in cands if c["fact_range"] is not None]
    if not ranges or cfg.fact_top_k <= 0:
        return
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    span = hi - lo if hi > lo else 1.0
    best: dict[tuple[str, ...], dict[str, Any]] = {}
    for c in cands:
        for f in c["facts"]:
            key = tuple(f["fact"])
            if key not in best or f["score"] > best[key]["score"]:
                best[key] = f
    chosen = sorted(best.values(), key=lambda f: (-f["score"], tuple(f["fact"])))[: cfg.fact_top_k]
    total: dict[str, float] = {}
    times: dict[str, int] = {}
    for f in chosen:
        score = (f["score"] - lo) / span
        for end in f["ends"]:
            if end is None:
                continue
            n = passages.get(end[0], 0.0)
            total[end[0]] = total.get(end[0], 0.0) + (score / n if n > 0 else score)
            times[end[0]] = times.get(end[0], 0) + 1
    kept = sorted(((v, total[v] / times[v]) for v in total), key=lambda kv: (-kv[1], kv[0]))
    if cfg.entity_seed_top_k:
        kept = kept[: cfg.entity_seed_top_k]
    for name, w in kept:
        if w > 0:
            seeds.entities[name] = seeds.entities.get(name, 0.0) + w


def rank_with_seeds(retriever: Retriever, queries: list[str], seeds: list[dict[str, Any]], k: int
                    ) -> list[RetrievalResult]:
    """Stage 3: each query's top ``k`` passages of this shard (its halo's too: the front keeps a passage's highest
    score) by PageRank from the global seeding, from every seed it holds, scaled by the seed mass this shard holds
    (comparable across shards; 0 where it holds none)."""
    retriever._ensure_graph()
    rows = _passage_rows(retriever)
    _, _, to_passages, to_entities = _owned_links(retriever)
    strength = to_passages + to_entities
    out = []
    for query, seed in zip(queries, seeds, strict=True):
        reset: dict[int, float] = {}
        for pid, w in seed.get("passages", {}).items():
            if pid in rows and w > 0:
                reset[rows[pid]] = reset.get(rows[pid], 0.0) + float(w)
        total = seed.get("strength", {})
        entities = seed.get("entities", {})
        for (name, w), v in zip(entities.items(), retriever.data.entity_vertex(list(entities))):
            if v >= 0 and w > 0:
                share = min(strength[v] / total[name], 1.0) if total.get(name, 0) > 0 else 1.0
                reset[v] = reset.get(v, 0.0) + float(w) * share
        mass = sum(reset.values())
        docs: list[RetrievedDoc] = []
        if mass > 0:
            scores = retriever.ppr(reset)[: retriever.n_passages] * mass
            for i in np.argsort(-scores, kind="stable")[:k]:
                p = retriever.passages[int(i)]
                docs.append(RetrievedDoc(p.id, p.title, p.text, float(scores[i])))
        out.append(RetrievalResult(query, "graph", docs, {}))
    return out


def _passage_rows(retriever: Retriever) -> dict[str, int]:
    rows = getattr(retriever, "_shard_passage_rows", None)
    if rows is None:
        rows = {p.id: i for i, p in enumerate(retriever.passages)}
        retriever._shard_passage_rows = rows  # type: ignore[attr-defined]
    return rows
