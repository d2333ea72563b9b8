"""Helpers to compare two index directories part by part (used by the resume and incremental tests)."""

from __future__ import annotations

import numpy as np

from graph_index.store import IndexData


def edges(data: IndexData) -> dict[tuple[str, str], tuple[float, int]]:
    names = data.graph.vs["name"]
    out = {}
    for e in data.graph.es:
        a, b = sorted((names[e.source], names[e.target]))
        out[(a, b)] = (round(e["weight"], 5), e["kinds"])
    return out


def assert_same_index(a: IndexData, b: IndexData, *, atol: float = 0.0) -> None:
    """Same passages, OpenIE, entities, facts, synonyms, edges and embeddings (row for row; within ``atol`` where a
    model's vectors may differ in their last bits with how texts were batched)."""
    assert [p.to_json() for p in a.passages] == [p.to_json() for p in b.passages]
    assert [r.to_json() for r in a.openie] == [r.to_json() for r in b.openie]
    assert a.entities == b.entities
    assert list(a.entity_passage_counts) == list(b.entity_passage_counts)
    assert a.facts == b.facts
    assert a.synonyms == b.synonyms
    assert edges(a) == edges(b)
    assert a.graph.vs["name"] == b.graph.vs["name"]
    for x, y in ((a.passage_emb, b.passage_emb), (a.entity_emb, b.entity_emb), (a.fact_emb, b.fact_emb)):
        assert np.array_equal(np.asarray(x), np.asarray(y)) if not atol else np.allclose(x, y, rtol=0, atol=atol)
    assert a.dense.ntotal == b.dense.ntotal
    counts_a = {k: v for k, v in a.counts.items()}
    assert counts_a == b.counts
