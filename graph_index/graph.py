"""The knowledge graph in HippoRAG 2's structure, as an undirected weighted igraph.

Vertices: one per passage (in passage order), then one per entity (sorted by normalised name). Edges, one per
vertex pair with the weights summed over what links the pair:

* fact: subject — object of every extracted triple, weight 2 per occurrence (HippoRAG 2 stores each fact as two
  parallel edges);
* mention: passage — every entity extracted from it, weight ``mention_weight`` (1, as in HippoRAG 2) for a
  specific entity (named somewhere in the corpus, or the title of a page) and ``common_mention_weight`` for any
  other (a common noun such as "form");
* title: passage — the entity its title names, weighted so that the title page(s) together get ``title_share``
  of the entity's edge weight (at least ``title_entity_weight``; the larger of this and a mention weight counts,
  not their sum);
* synonym: entity — entity with cosine ≥ threshold, weight cosine × the number of ends keeping the pair.

``kinds`` on each edge is a bitmask of the above, so retrieval and statistics can tell the edges apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import igraph as ig

from .config import GraphConfig
from .corpus import Passage

from .normalize import is_stopword_phrase, normalize_phrase
from .openie.base import OpenIEResult, Triple

FACT, MENTION, TITLE, SYNONYM = 1, 2, 4, 8
KIND_NAMES = {FACT: "fact", MENTION: "mention", TITLE: "title", SYNONYM: "synonym"}
FACT_WEIGHT = 2.0
PASSAGE_PREFIX, ENTITY_PREFIX = "p:", "e:"


@dataclass(slots=True)
class GraphContent:
    """Normalised OpenIE of a whole corpus: what the graph is made of, before synonymy."""

    entities: list[str]
    """Sorted entity names (normalised)."""
    facts: list[Triple]
    """Sorted unique normalised triples."""
    passage_entities: list[list[str]]
    """Per passage: the entities extracted from it (its mentions), sorted."""
    title_entity: list[str | None]
    fact_counts: Counter = field(default_factory=Counter)
    """(subject, object) → number of (passage, triple) occurrences."""
    specific: set[str] = field(default_factory=set)
    """Entities named by some extractor's NER, or titles of passages."""

    def entity_passage_counts(self) -> list[int]:
        """Per entity, how many passages link to it (by mention or title): HippoRAG 2 divides a seed entity's
        weight by this, so that hub entities do not swamp the PageRank."""
        counts = dict.fromkeys(self.entities, 0)
        for ents, title in zip(self.passage_entities, self.title_entity):
            linked = set(ents)
            if title is not None:
                linked.add(title)
            for e in linked:
                counts[e] += 1
        return [counts[e] for e in self.entities]


def entity_vertices(g: ig.Graph) -> dict[str, int]:
    """Normalised entity name → its vertex in ``g`` (vertex names carry :data:`ENTITY_PREFIX`, which stays here,
    with the code that writes it)."""
    return {n[len(ENTITY_PREFIX):]: i for i, n in enumerate(g.vs["name"]) if n.startswith(ENTITY_PREFIX)}


def fact_text(fact: Triple) -> str:
    """The sentence a fact is embedded as (queries are matched against these)."""
    return " ".join(fact)


def collect_content(passages: Sequence[Passage], results: Sequence[OpenIEResult], cfg: GraphConfig) -> GraphContent:
    """Normalise every passage's entities and triples and gather the corpus-level node and fact sets."""
    collector = ContentCollector(cfg)
    collector.add(passages, results)
    return collector.finish()


class ContentCollector:
    """:func:`collect_content` a batch of passages at a time, so a streaming build keeps what the graph needs (node
    names, facts, per-passage mentions) and never the passages or their OpenIE. Each name is kept as one string
    object however many passages mention it."""

    def __init__(self, cfg: GraphConfig) -> None:
        self.cfg = cfg
        self.entities: set[str] = set()
        self.facts: set[Triple] = set()
        self.passage_entities: list[list[str]] = []
        self.titles: list[str | None] = []
        self.fact_counts: Counter = Counter()
        self.specific: set[str] = set()
        self._nodes: dict[str, str] = {}
        """Normalised phrase → its node name (the one shared string), or "" for one that cannot be a node."""

    def _node(self, text: str) -> str:
        """The node name of a phrase, or "" for one that cannot be a node (empty, or only function words)."""
        k = normalize_phrase(text)
        name = self._nodes.get(k)
        if name is None:
            name = self._nodes[k] = "" if not k or is_stopword_phrase(k) else k
        return name

    def add(self, passages: Sequence[Passage], results: Sequence[OpenIEResult]) -> None:
        """Take the next passages (in index order) with their OpenIE."""
        for passage, res in zip(passages, results, strict=True):
            mentioned: set[str] = set()
            triples: set[Triple] = set()
            for s, r, o in res.triples:
                t = (self._node(s), normalize_phrase(r), self._node(o))
                if t[0] and t[2] and t[1]:
                    triples.add(t)
                    mentioned.add(t[0])
                    mentioned.add(t[2])
            for e in res.entities:
                k = self._node(e)
                if k:
                    mentioned.add(k)
                    self.specific.add(k)
            title = self._node(passage.title)
            if title:
                self.specific.add(title)
            if self.cfg.title_entity_weight <= 0:
                title = ""
            self.titles.append(title or None)
            if title:
                self.entities.add(title)
            self.entities |= mentioned
            self.facts |= triples
            for s, _, o in triples:
                if s != o:
                    self.fact_counts[(s, o) if s < o else (o, s)] += 1
            self.passage_entities.append(sorted(mentioned))

    def finish(self) -> GraphContent:
        """The corpus's content, over every passage added."""
        return GraphContent(entities=sorted(self.entities), facts=sorted(self.facts),
                            passage_entities=self.passage_entities, title_entity=self.titles,
                            fact_counts=self.fact_counts, specific=self.specific & self.entities)


def build_graph(
    passage_ids: Sequence[str],
    content: GraphContent,
    synonyms: dict[tuple[str, str], float],
    cfg: GraphConfig,
) -> ig.Graph:
    """Assemble the igraph graph from the passages' ids (vertex i is passage i), the corpus content and the synonym
    edges."""
    n_pass = len(passage_ids)
    ent_index = {e: n_pass + j for j, e in enumerate(content.entities)}
    weights: dict[tuple[int, int], float] = {}
    kinds: dict[tuple[int, int], int] = {}

    def add(a: int, b: int, w: float, kind: int, combine: str = "sum") -> None:
        if a == b or w <= 0:
            return
        pair = (a, b) if a < b else (b, a)
        old = weights.get(pair)
        if old is None:
            weights[pair] = w
        elif combine == "max":
            weights[pair] = max(old, w)
        else:
            weights[pair] = old + w
        kinds[pair] = kinds.get(pair, 0) | kind

    for (s, o), count in content.fact_counts.items():
        add(ent_index[s], ent_index[o], FACT_WEIGHT * count, FACT)
    for p, ents in enumerate(content.passage_entities):
        for e in ents:
            w = cfg.mention_weight if e in content.specific else cfg.common_mention_weight
            add(p, ent_index[e], w, MENTION, "max")
    for (a, b), w in synonyms.items():
        add(ent_index[a], ent_index[b], w, SYNONYM)
    _add_title_edges(content, ent_index, weights, cfg, add)

    pairs = sorted(weights)
    g = ig.Graph(n=n_pass + len(content.entities), edges=pairs, directed=False)
    # Prefixed names keep passage ids and entity names from colliding ("paris" the id vs "paris" the city).
    g.vs["name"] = [PASSAGE_PREFIX + pid for pid in passage_ids] + [ENTITY_PREFIX + e for e in content.entities]
    g.vs["kind"] = ["passage"] * n_pass + ["entity"] * len(content.entities)
    g.es["weight"] = [weights[p] for p in pairs]
    g.es["kinds"] = [kinds[p] for p in pairs]
    return g


def _add_title_edges(content: GraphContent, ent_index: dict[str, int], weights: dict[tuple[int, int], float],
                     cfg: GraphConfig, add) -> None:  # noqa: ANN001
    """Link each passage to its title entity with a share of the entity's other edge weight (see ``title_share``).

    Run after every other edge is in, since the weight depends on the entity's degree.
    """
    pages: dict[int, list[int]] = {}
    for p, title in enumerate(content.title_entity):
        if title is not None:
            pages.setdefault(ent_index[title], []).append(p)
    other: dict[int, float] = dict.fromkeys(pages, 0.0)
    for (a, b), w in weights.items():
        for v, u in ((a, b), (b, a)):
            if v in other and u not in pages[v]:
                other[v] += w
    ratio = cfg.title_share / (1 - cfg.title_share)
    for v, ps in pages.items():
        w = max(cfg.title_entity_weight, ratio * other[v] / len(ps))
        for p in ps:
            add(p, v, w, TITLE, "max")


def graph_stats(g: ig.Graph) -> dict[str, int | float]:
    """Counts that say whether a graph is healthy: edges per kind, isolated passages, components."""
    kinds = g.es["kinds"] if g.ecount() else []
    per_kind = {name: sum(1 for k in kinds if k & bit) for bit, name in KIND_NAMES.items()}
    is_passage = [k == "passage" for k in g.vs["kind"]] if g.vcount() else []
    degree = g.degree()
    n_passages = sum(is_passage)
    isolated = sum(1 for d, isp in zip(degree, is_passage) if isp and d == 0)
    comps = g.connected_components() if g.vcount() else []
    return {
        "nodes": g.vcount(),
        "edges": g.ecount(),
        "passage_nodes": n_passages,
        "entity_nodes": g.vcount() - n_passages,
        **{f"{name}_edges": n for name, n in per_kind.items()},
        "isolated_passages": isolated,
        "components": len(comps),
        "largest_component": max((len(c) for c in comps), default=0),
        "mean_entity_degree": round(
            sum(d for d, isp in zip(degree, is_passage) if not isp) / max(g.vcount() - n_passages, 1), 3),
    }
