"""Graph-aware shards (issue 39): ``build-graph --shards N`` splits the corpus along the graph's communities, and a
sharded graph search seeds every shard from one global seeding so that their PageRank scores compare."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import httpx
import igraph as ig
import numpy as np
import pytest

from graph_index.builder import Components
from graph_index.partition import (
    SHARDS_FILE,
    assign_shards,
    build_shards,
    community_levels,
    cut_statistics,
)
from routerag.config import Settings
from routerag.retrieval import Retriever
from routerag.retrieval.shard_seeds import (
    global_seeds,
    rank_with_seeds,
    seed_candidates,
)

from .helpers.server_helpers import FIX
from .test_shards import QUERIES, front_app, retrieve, shard_app


def two_topics(n_per: int = 6) -> ig.Graph:
    """Passages 0..2n-1 interleaved between two topics (even: topic A, odd: B), each topic's passages all linked to
    its two entities; one passage of each also names the other topic's first entity (a weak cross link)."""
    n = 2 * n_per
    ents = {"a1": n, "a2": n + 1, "b1": n + 2, "b2": n + 3}
    edges = [(p, ents[e]) for p in range(n) for e in (("a1", "a2") if p % 2 == 0 else ("b1", "b2"))]
    edges += [(0, ents["b1"]), (1, ents["a1"])]
    g = ig.Graph(n=n + 4, edges=edges)
    g.es["weight"] = [1.0] * g.ecount()
    return g


def test_communities_keep_a_topic_on_one_shard_where_round_robin_cuts_every_one() -> None:
    g = two_topics()
    shard = assign_shards(community_levels(g, seed=0), 12, 2, max_imbalance=0.0)
    assert np.bincount(shard).tolist() == [6, 6]
    assert len({shard[p] for p in range(0, 12, 2)}) == 1 and len({shard[p] for p in range(1, 12, 2)}) == 1
    cut = cut_statistics(g, shard)
    halves = cut_statistics(g, np.arange(12) // 6)  # by order: each topic split in two
    assert cut["passage_pairs_cut"] == pytest.approx(12 / 72, abs=1e-4)  # only the two cross links' pairs
    assert halves["passage_pairs_cut"] > 0.5 and halves["entities_on_several_shards"] == 1.0


def test_a_community_larger_than_a_shard_is_split_to_keep_the_balance() -> None:
    g = two_topics(10)
    shard = assign_shards(community_levels(g, seed=0), 20, 4, max_imbalance=0.0)
    assert np.bincount(shard, minlength=4).tolist() == [5, 5, 5, 5]


def test_one_shard_seeded_globally_is_the_unsharded_graph_search(retriever: Retriever) -> None:
    """The two stages over a single shard are exactly the index's own graph search: the same ranking, and scores
    equal up to the reset's total mass (the shard scales by it instead of normalising)."""
    cfg = retriever.cfg
    seeds = [s.to_json() for s in global_seeds([seed_candidates(retriever, QUERIES)], cfg)]
    staged = rank_with_seeds(retriever, QUERIES, seeds, 5)
    for mine, own in zip(staged, retriever.search(QUERIES, "graph", 5)):
        reached = [d for d in own.docs if d.score > 0]  # passages no mass reaches tie at 0, in either order
        assert len(reached) >= 2 and [d.id for d in mine.docs[:len(reached)]] == [d.id for d in reached]
        ratio = np.asarray([d.score for d in mine.docs[:len(reached)]]) / np.asarray([d.score for d in reached])
        assert np.allclose(ratio, ratio[0], rtol=1e-3)


@pytest.fixture(scope="module")
def graph_shards(tmp_path_factory, minilm, spacy_extractor) -> Path:
    root = tmp_path_factory.mktemp("graph-shards")
    cfg = Settings(cache_dir=root / "cache")
    build_shards([FIX / "twohop.jsonl"], root / "out", cfg, 2, progress=False,
                 components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return root / "out"


def test_build_shards_writes_every_passage_once_and_records_the_split(graph_shards: Path) -> None:
    record = json.loads((graph_shards / SHARDS_FILE).read_text())
    assert [s["name"] for s in record["shards"]] == ["shard-000", "shard-001"]
    assert record["partition"]["method"] == "communities" and sum(record["partition"]["passages"]) == 10
    titles = [json.loads(line)["title"] for line in (FIX / "twohop.jsonl").read_text().splitlines()]
    held = [p.title for s in record["shards"] for p in Retriever(graph_shards / s["name"]).passages]
    assert sorted(held) == sorted(titles)
    with pytest.raises(FileExistsError):
        build_shards([FIX / "twohop.jsonl"], graph_shards, Settings(), 2, progress=False)


def test_a_sharded_graph_search_merges_pagerank_masses_from_one_seeding(graph_shards: Path, minilm) -> None:
    paths = [graph_shards / "shard-000", graph_shards / "shard-001"]
    with ExitStack() as stack:
        urls = [stack.enter_context(live(shard_app(p, minilm))) for p in paths]
        front = stack.enter_context(live(front_app(urls)))
        for mode in ("graph", "hybrid"):
            r = retrieve(front, mode)
            assert r.status_code == 200, r.text
            assert [s["ok"] for s in r.json()["shards"]] == [True, True]
            assert all(len(row) == 3 for row in r.json()["result"])
        scores = [h["score"] for row in retrieve(front, "graph").json()["result"] for h in row]
        assert not np.allclose(scores[0], 1 / 61)  # masses, not the rank fusion's 1 / (60 + rank)
        seeds = httpx.post(f"{urls[0]}/retrieve/shard", json={"queries": QUERIES[:1], "stage": "seeds"}).json()
        assert set(seeds["seeds"][0]) == {"dense", "facts", "fact_range", "named"}
        bad = httpx.post(f"{urls[0]}/retrieve/shard", json={"queries": QUERIES[:2], "stage": "rank", "seeds": []})
        assert bad.status_code == 400 and "one seeding per query" in bad.text


def live(app):
    from .helpers.server_helpers import live_server

    return live_server(app)


def test_the_cli_refuses_shards_with_ray_and_more_shards_than_passages(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from routerag.cli import app

    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    res = runner.invoke(app, ["build-graph", str(FIX / "twohop.jsonl"), "-o", str(tmp_path / "o"), "--shards", "2",
                              "--ray", "local"])
    assert res.exit_code == 2 and "does not combine with --ray" in res.output
    res = runner.invoke(app, ["build-graph", str(FIX / "twohop.jsonl"), "-o", str(tmp_path / "o"), "--shards", "11"])
    assert res.exit_code != 0 and "more than the corpus's 10 passages" in res.output
    assert not (tmp_path / "o" / SHARDS_FILE).exists()
