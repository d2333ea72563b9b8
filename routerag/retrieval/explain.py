"""Why a graph search ranked its passages as it did: the evidence subgraph behind one query.

A graph (or hybrid) search seeds a Personalized PageRank with entities (the ends of the facts that match the query,
and the entities it names) and passages (their dense scores), and ranks passages by the mass that reaches them. This
module recomputes those seeds and the PageRank over the whole graph, then picks the part of the graph a person can
read: the top passages, the heaviest entity seeds, the strongest paths from the seeds to each top passage, and a few
heavy neighbours, at most ``max_nodes`` vertices in all, laid out for drawing.

A path's strength is the product of its vertices' PageRank mass relative to the heaviest vertex: every vertex a
path passes through costs ``-log(mass / max mass)``, so the cheapest paths run through the vertices the walk
actually visits most. Paths are searched among the ``candidates`` heaviest vertices only, which bounds the cost on
a large graph (the vertices a strong path passes through are heavy by construction).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any

import networkx as nx
import numpy as np

from graph_index.csr import CompactGraph
from graph_index.graph import FACT, KIND_NAMES, PASSAGE_PREFIX, SYNONYM

from .retriever import Retriever, Seeds
from .types import QueryError, RetrievedDoc

EXPLAIN_MODES = ("graph", "hybrid")
_EPS = 1e-3
"""Added to every step's cost, so a path never wanders through vertices of (almost) maximal mass for free."""


@dataclass(frozen=True, slots=True)
class ExplainLimits:
    """How much of the graph an explanation shows (defaults keep one drawing readable)."""

    max_nodes: int = 40
    max_seeds: int = 8
    """Entity seeds shown, heaviest first (the others still count in the PageRank)."""
    paths_per_passage: int = 2
    max_hops: int = 4
    """Edges on a path from a seed to a passage."""
    context_nodes: int = 6
    """Heavy vertices next to the evidence, added while there is room."""
    candidates: int = 300
    """The heaviest vertices the path search may pass through."""


@dataclass(slots=True)
class ExplainNode:
    id: int
    kind: str
    """``entity`` or ``passage``."""
    label: str
    mass: float
    """PageRank mass (all vertices sum to 1)."""
    seed_weight: float = 0.0
    """Reset weight before normalisation; 0 for a vertex that is no seed."""
    seed_from: list[str] = field(default_factory=list)
    """``fact``, ``query``, ``dense`` or ``uniform``."""
    rank: int | None = None
    """1-based rank among the search's results, for a top passage."""
    x: float = 0.0
    y: float = 0.0


@dataclass(slots=True)
class ExplainEdge:
    source: int
    target: int
    kind: str
    """``relation`` (an extracted fact), ``synonym`` (similar entity names) or ``passage-entity``."""
    kinds: list[str]
    """Every link the edge stands for (``fact``, ``mention``, ``title``, ``synonym``)."""
    weight: float
    relations: list[str] = field(default_factory=list)
    seed_fact: float | None = None
    """The score of the best seed fact this edge carries."""
    on_path: bool = False


@dataclass(slots=True)
class EvidencePath:
    nodes: list[int]
    """From an entity seed to the passage."""
    score: float
    """Product of the vertices' mass relative to the heaviest vertex (what paths are ranked by)."""
    weakest: float
    """The smallest PageRank mass on the path."""


@dataclass(slots=True)
class PassagePaths:
    node: int
    title: str
    rank: int
    paths: list[EvidencePath]


@dataclass(slots=True)
class SeedFact:
    subject: str
    relation: str
    object: str
    score: float
    nodes: list[int]
    """The subject's and object's vertices that are drawn."""


@dataclass(slots=True)
class Explanation:
    query: str
    mode: str
    docs: list[RetrievedDoc]
    facts: list[SeedFact]
    nodes: list[ExplainNode]
    edges: list[ExplainEdge]
    paths: list[PassagePaths]
    fallback: str | None
    truncated: bool
    """Something was left out to stay within the limits (see ``omitted``)."""
    omitted: dict[str, int]
    limits: ExplainLimits
    graph: dict[str, int]
    """The whole graph's size, for scale."""
    ms: float

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["docs"] = [d.to_json() for d in self.docs]
        return out


def explain(retriever: Retriever, query: str, mode: str = "graph", k: int | None = None,
            limits: ExplainLimits | None = None) -> Explanation:
    """The evidence subgraph of ``query``'s ``mode`` search (graph or hybrid) for its top ``k`` passages."""
    t0 = time.perf_counter()
    if mode not in EXPLAIN_MODES:
        raise QueryError(f"mode {mode!r} has no graph to explain; choose graph or hybrid")
    limits = limits or ExplainLimits()
    vector = retriever.embed([query])  # once, for the search and its seeds
    result = retriever.search([query], mode=mode, k=k, query_vectors=vector)[0]  # type: ignore[arg-type]
    seeds, facts, fallback = retriever.query_seeds(query, vector)
    mass = retriever.ppr(seeds.weights)
    data = retriever.data
    g = data.compact_graph
    tops = g.names.lookup([PASSAGE_PREFIX + d.id for d in result.docs]).tolist()  # passage i is vertex i
    entity_seeds = _entity_seeds(seeds)
    shown_seeds = entity_seeds[: limits.max_seeds]
    found = _strongest_paths(g, mass, shown_seeds, tops, limits)

    chosen: list[int] = []
    omitted = {"passages": 0, "seeds": len(entity_seeds) - len(shown_seeds), "paths": 0}

    def fits(vs: list[int]) -> bool:
        new = [v for v in dict.fromkeys(vs) if v not in chosen]
        if len(chosen) + len(new) > limits.max_nodes:
            return False
        chosen.extend(new)
        return True

    for v in tops:
        if not fits([v]):
            omitted["passages"] += 1
    for v in shown_seeds:
        if not fits([v]):
            omitted["seeds"] += 1
    kept: dict[int, list[EvidencePath]] = {v: [] for v in tops}
    for r in range(limits.paths_per_passage):  # every passage's best path before any second best
        for v in tops:
            if r < len(found[v]):
                if v in chosen and fits(found[v][r].nodes):
                    kept[v].append(found[v][r])
                else:
                    omitted["paths"] += 1
    for v in _heavy_neighbours(g, mass, chosen, limits.context_nodes):
        if not fits([v]):
            break

    edges = _edges(retriever, chosen, facts)
    on_path = {frozenset(p) for ps in kept.values() for path in ps for p in zip(path.nodes, path.nodes[1:])}
    for e in edges:
        e.on_path = frozenset((e.source, e.target)) in on_path
    nodes = _nodes(retriever, chosen, mass, seeds, tops)
    _layout(nodes, edges, [v for v in shown_seeds if v in chosen], [v for v in tops if v in chosen])
    drawn = set(chosen)
    ends = data.entity_vertex([e for (s, _, o), _ in facts for e in (s, o)]).reshape(-1, 2).tolist()
    seed_facts = [SeedFact(s, r, o, round(float(score), 6), [v for v in vs if v in drawn])
                  for ((s, r, o), score), vs in zip(facts, ends)]
    paths = [PassagePaths(v, retriever.passages[v].title, i + 1, kept[v]) for i, v in enumerate(tops) if v in drawn]
    return Explanation(query=result.query, mode=mode, docs=result.docs, facts=seed_facts, nodes=nodes, edges=edges,
                       paths=paths, fallback=fallback, truncated=any(omitted.values()), omitted=omitted,
                       limits=limits, graph={"nodes": g.vcount(), "edges": g.ecount()},
                       ms=round((time.perf_counter() - t0) * 1000, 3))


def edge_kind(bits: int) -> tuple[str, list[str]]:
    """An edge's kind for drawing (a fact wins over a synonym, which wins over a passage link) and every link it
    stands for."""
    names = [name for bit, name in KIND_NAMES.items() if bits & bit]
    if bits & FACT:
        return "relation", names
    if bits & SYNONYM:
        return "synonym", names
    return "passage-entity", names


def _entity_seeds(seeds: Seeds) -> list[int]:
    """Vertices seeded as entities (by a fact or by name), heaviest first."""
    origins = seeds.origins or {}
    found = [v for v, how in origins.items() if "fact" in how or "query" in how]
    return sorted(found, key=lambda v: (-seeds.weights[v], v))


def _strongest_paths(g: CompactGraph, mass: np.ndarray, seeds: list[int], tops: list[int],
                     limits: ExplainLimits) -> dict[int, list[EvidencePath]]:
    """Per top passage, up to ``paths_per_passage`` cheapest simple paths from any seed (see the module docstring)."""
    out: dict[int, list[EvidencePath]] = {v: [] for v in tops}
    if not seeds or limits.paths_per_passage < 1:
        return out
    heaviest = float(mass.max()) or 1.0
    n = min(limits.candidates, len(mass))
    pool = set(np.argsort(-mass, kind="stable")[:n].tolist()) | set(seeds) | set(tops)
    pool = {v for v in pool if mass[v] > 0}
    cost = {v: -math.log(float(mass[v]) / heaviest) for v in pool}
    graph = nx.Graph()
    for u, v, _, _ in g.edges_within(pool):
        graph.add_edge(u, v, cost=(cost[u] + cost[v]) / 2 + _EPS)
    seeded = set(seeds)
    source = -1  # a virtual vertex joined to every seed: one search finds the best path from any of them
    for s in seeds:
        if s in graph:
            graph.add_edge(source, s, cost=cost[s] / 2)
    if source not in graph:
        return out
    for p in tops:
        if p not in graph or not nx.has_path(graph, source, p):
            continue
        for path in islice(nx.shortest_simple_paths(graph, source, p, weight="cost"), 4 * limits.paths_per_passage):
            nodes = path[1:]
            # (a path through a second seed is a longer copy of that seed's own path)
            if len(nodes) - 1 <= limits.max_hops and not seeded.intersection(nodes[1:]):
                share = math.prod(float(mass[v]) / heaviest for v in nodes)
                weakest = min(float(mass[v]) for v in nodes)
                out[p].append(EvidencePath(nodes, round(share, 8), round(weakest, 8)))
            if len(out[p]) == limits.paths_per_passage:
                break
    return out


def _heavy_neighbours(g: CompactGraph, mass: np.ndarray, chosen: list[int], n: int) -> list[int]:
    """The ``n`` heaviest vertices next to ``chosen`` and not in it."""
    if n < 1 or not chosen:
        return []
    near = g.neighbours(chosen) - set(chosen)
    return sorted(near, key=lambda v: (-mass[v], v))[:n]


def _nodes(retriever: Retriever, chosen: list[int], mass: np.ndarray, seeds: Seeds, tops: list[int]
           ) -> list[ExplainNode]:
    drawn = set(chosen)
    names = {v: retriever.data.vertex_label(v) for v in drawn if v >= retriever.n_passages}
    rank = {v: i + 1 for i, v in enumerate(tops)}
    origins = seeds.origins or {}
    out = []
    for v in chosen:
        passage = v < retriever.n_passages
        out.append(ExplainNode(id=v, kind="passage" if passage else "entity",
                               label=retriever.passages[v].title if passage else names.get(v, str(v)),
                               mass=round(float(mass[v]), 8), seed_weight=round(float(seeds.weights.get(v, 0.0)), 6),
                               seed_from=list(origins.get(v, [])), rank=rank.get(v)))
    return out


def _edges(retriever: Retriever, chosen: list[int], facts: list[tuple[tuple[str, str, str], float]]
           ) -> list[ExplainEdge]:
    """Every graph edge between drawn vertices, with the relations of the facts it carries."""
    data = retriever.data
    drawn = np.asarray(sorted(chosen), dtype=np.int64)
    ends = data.fact_ends
    inside = np.flatnonzero(np.isin(ends[:, 0], drawn) & np.isin(ends[:, 1], drawn)) if len(ends) else []
    relations: dict[frozenset[int], list[str]] = {}
    scores: dict[frozenset[int], float] = {}
    seed_score = dict(facts)
    for j in inside:
        pair = frozenset(int(v) for v in ends[j])
        triple = data.facts[j]
        relations.setdefault(pair, []).append(triple[1])
        if triple in seed_score:
            scores[pair] = max(scores.get(pair, 0.0), seed_score[triple])
    out = []
    for u, v, weight, bits in data.compact_graph.edges_within(drawn.tolist()):
        kind, kinds = edge_kind(bits)
        pair = frozenset((u, v))
        out.append(ExplainEdge(source=u, target=v, kind=kind, kinds=kinds, weight=round(weight, 6),
                               relations=sorted(set(relations.get(pair, []))),
                               seed_fact=round(scores[pair], 6) if pair in scores else None))
    return out


def _layout(nodes: list[ExplainNode], edges: list[ExplainEdge], seeds: list[int], tops: list[int]) -> None:
    """Positions in [0, 1]²: Kamada–Kawai (drawn distance follows graph distance, which suits a few dozen
    vertices), started from the seeds in a column on the left and the top passages on the right, and mirrored if
    need be so that the seeds lie, on average, left of the top passages (evidence first, results after). The
    layout has no randomness: the same subgraph is drawn the same way every time."""
    graph = nx.Graph()
    graph.add_nodes_from(n.id for n in nodes)
    graph.add_edges_from((e.source, e.target) for e in edges)
    placed = set(seeds) | set(tops)
    start: dict[int, tuple[float, float]] = {}
    for column, x in ((seeds, -1.0), ([n.id for n in nodes if n.id not in placed], 0.0), (tops, 1.0)):
        for i, v in enumerate(column):
            start[v] = (x, 1.0 - 2.0 * (i + 0.5) / len(column))
    pos = dict(start)
    if len(graph) > 2:
        hops = dict(nx.all_pairs_shortest_path_length(graph))
        far = max((d for row in hops.values() for d in row.values()), default=0) + 1
        # vertices in different components sit one step beyond the longest distance, not at infinity
        dist = {u: {v: hops[u].get(v, far) for v in graph} for u in graph}
        pos = nx.kamada_kawai_layout(graph, dist=dist, pos=start)
    xs = [float(p[0]) for p in pos.values()]
    ys = [float(p[1]) for p in pos.values()]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    mirror = bool(seeds and tops) and (sum(float(pos[v][0]) for v in seeds) / len(seeds)
                                       > sum(float(pos[v][0]) for v in tops) / len(tops))
    for n in nodes:
        x, y = (float(c) for c in pos[n.id])
        fx = (x - x0) / (x1 - x0) if x1 > x0 else 0.5
        n.x = round(0.05 + 0.9 * (1 - fx if mirror else fx), 4)
        n.y = round(0.05 + 0.9 * ((y - y0) / (y1 - y0) if y1 > y0 else 0.5), 4)
