"""A full build over a tiny corpus with imported OpenIE: exact entities, facts, edges and synonymy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graph_index.builder import build_index
from graph_index.graph import ENTITY_PREFIX, FACT, MENTION, PASSAGE_PREFIX, SYNONYM, TITLE
from graph_index.store import IndexData

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture
def curie_index(tmp_path: Path, components) -> IndexData:
    build_index([FIX / "curie.jsonl"], tmp_path / "idx", components.cfg, openie_results=FIX / "curie_openie.json",
                progress=False, components=components)
    return IndexData(tmp_path / "idx")


def edge_map(data: IndexData) -> dict[tuple[str, str], tuple[float, int]]:
    g = data.graph
    names = g.vs["name"]
    out = {}
    for e in g.es:
        a, b = sorted((names[e.source], names[e.target]))
        out[(a, b)] = (round(e["weight"], 4), e["kinds"])
    return out


def test_entities_and_facts_are_exactly_the_normalised_extraction(curie_index: IndexData) -> None:
    assert curie_index.entities == sorted([
        "marie curie", "warsaw", "nobel prize", "ernest hemingway", "chicago",  # titles
        "physicist", "nobel prize in physics", "vistula", "stockholm", "united states of america", "united states",
    ])
    assert curie_index.facts == sorted([
        ("marie curie", "is", "physicist"), ("marie curie", "born in", "warsaw"),
        ("marie curie", "won", "nobel prize in physics"), ("warsaw", "lies on", "vistula"),
        ("nobel prize", "awarded in", "stockholm"), ("ernest hemingway", "lived in", "united states of america"),
        ("chicago", "city in", "united states"),
    ])
    m = curie_index.manifest
    assert m["counts"]["passages"] == 5 and m["counts"]["entities"] == 11 and m["counts"]["facts"] == 7
    assert m["openie"]["imported"] == 5 and m["openie"]["extracted"] == 0


def test_synonymy_edges_link_exactly_the_near_duplicates(curie_index: IndexData) -> None:
    syn = {k: [n for n, _ in v] for k, v in curie_index.synonyms.items()}
    assert syn == {
        "nobel prize": ["nobel prize in physics"], "nobel prize in physics": ["nobel prize"],
        "united states": ["united states of america"], "united states of america": ["united states"],
    }
    edges = edge_map(curie_index)
    w, kinds = edges[(ENTITY_PREFIX + "united states", ENTITY_PREFIX + "united states of america")]
    assert kinds == SYNONYM
    cos = dict(curie_index.synonyms["united states"])["united states of america"]
    assert 0.85 < cos < 0.95 and w == pytest.approx(2 * cos, abs=1e-4)  # both ends keep it
    assert curie_index.manifest["counts"]["synonymy_edges"] == 2


def test_fact_mention_and_title_edges(curie_index: IndexData) -> None:
    edges = edge_map(curie_index)
    curie_pid = curie_index.passages[0].id
    p, e = PASSAGE_PREFIX + curie_pid, lambda s: ENTITY_PREFIX + s
    assert edges[(e("marie curie"), e("warsaw"))] == (2.0, FACT)  # one fact, stored as two parallel edges
    # the passage is linked to every entity it mentions, and to its title entity
    linked = {b for (a, b), _ in edges.items() if a == e("marie curie") and b.startswith(PASSAGE_PREFIX)}
    assert linked == {p}
    # title_share 0.5: the page gets as much weight as the entity's other edges (three facts × 2)
    assert edges[(e("marie curie"), p)] == (6.0, MENTION | TITLE)
    assert edges[(e("warsaw"), p)] == (1.0, MENTION)  # a named entity
    # "physicist" is a common noun (not named, no page of its own): a node through its fact, no mention edge
    assert (e("physicist"), p) not in edges
    assert edges[(e("marie curie"), e("physicist"))] == (2.0, FACT)
    # "Warsaw" passage: title entity warsaw is also mentioned there; Curie's passage mentions warsaw too
    warsaw_passages = {b for (a, b) in edges if a == e("warsaw") and b.startswith(PASSAGE_PREFIX)}
    assert warsaw_passages == {p, PASSAGE_PREFIX + curie_index.passages[1].id}
    assert list(curie_index.entity_passage_counts[[curie_index.entities.index("warsaw")]]) == [2]
    g = curie_index.graph
    assert g.vcount() == 5 + 11 and not g.is_directed()
    assert g.vs["kind"][:5] == ["passage"] * 5


def test_embeddings_are_unit_rows_aligned_with_their_lists(curie_index: IndexData) -> None:
    for arr, n in ((curie_index.passage_emb, 5), (curie_index.entity_emb, 11), (curie_index.fact_emb, 7)):
        assert arr.shape == (n, 384) and arr.dtype == np.float32
        assert np.allclose(np.linalg.norm(arr, axis=1), 1.0, atol=1e-5)
    scores, ids = curie_index.dense.search(np.asarray(curie_index.passage_emb[2:3]), 1)
    assert ids[0][0] == 2 and scores[0][0] == pytest.approx(1.0, abs=1e-5)


def test_title_share_and_common_mentions_are_configurable(tmp_path: Path, components) -> None:
    components.cfg.graph.title_share = 0.75
    components.cfg.graph.common_mention_weight = 0.1
    build_index([FIX / "curie.jsonl"], tmp_path / "idx", components.cfg, openie_results=FIX / "curie_openie.json",
                progress=False, components=components)
    data = IndexData(tmp_path / "idx")
    edges = edge_map(data)
    p = PASSAGE_PREFIX + data.passages[0].id
    assert edges[(ENTITY_PREFIX + "physicist", p)] == (0.1, MENTION)
    # share 0.75: title weight = 3 × the other edges; the weak mention counts among them
    assert edges[(ENTITY_PREFIX + "marie curie", p)][0] == pytest.approx(18.0)


def test_title_link_can_be_disabled(tmp_path: Path, components) -> None:
    components.cfg.graph.title_entity_weight = 0
    build_index([FIX / "curie.jsonl"], tmp_path / "idx", components.cfg, openie_results=FIX / "curie_openie.json",
                progress=False, components=components)
    data = IndexData(tmp_path / "idx")
    assert "chicago" in data.entities  # still extracted from its triple
    assert not any(k & TITLE for k in data.graph.es["kinds"])
