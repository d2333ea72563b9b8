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
from graph_index.config import ShardConfig
from graph_index.partition import (
    SHARDS_FILE,
    assign_shards,
    build_shards,
    community_levels,
    cut_statistics,
    halo_rows,
)
from routerag.config import Settings
from routerag.retrieval import Retriever
from routerag.retrieval.shard_seeds import (
    global_seeds,
    owned_mask,
    rank_with_seeds,
    seed_candidates,
)
from routerag.retrieval.shards import fuse, merge_by_score
from routerag.vocabulary import MODES

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


def test_the_halo_holds_the_other_shards_passages_linked_through_an_entity_strongest_first() -> None:
    g = two_topics()  # a1 and b1 link 7 passages each: their topic's six and one of the other topic's
    shard = np.arange(12) % 2  # split by topic: evens (A) on shard 0, odds (B) on shard 1
    wide = halo_rows(g, shard, ShardConfig(halo_max_entity_passages=7, halo_fraction=1.0))
    # passage 0 names b1, so b1 pulls every B passage into shard 0's halo, and a1 every A passage into shard 1's
    assert [h.tolist() for h in wide] == [list(range(1, 12, 2)), list(range(0, 12, 2))]
    # passage 1 shares both a1 and b1 with shard 0: the strongest link, kept when the halo holds one passage
    assert halo_rows(g, shard, ShardConfig(halo_max_entity_passages=7, halo_fraction=1 / 6))[0].tolist() == [1]
    hubs = halo_rows(g, shard, ShardConfig(halo_max_entity_passages=6, halo_fraction=1.0))  # a1, b1 above the cap
    assert [h.tolist() for h in hubs] == [[], []]
    assert [len(h) for h in halo_rows(g, shard, ShardConfig(halo_max_entity_passages=0))] == [0, 0]


def test_the_front_reads_seeding_candidates_of_a_shard_from_before_halos() -> None:
    """A shard not yet upgraded reports an entity's passages and one weight (all its edges'): read as its own."""
    fact = {"fact": ["tarsk", "trades", "amber"], "score": 0.9,
            "ends": [["tarsk", 2.0, 3.0], ["amber", 1.0, 1.0]]}
    old = {"dense": [["p1", 0.8]], "facts": [fact], "fact_range": [0.1, 0.9], "named": [["tarsk", 2.0, 3, 1, 3.0]]}
    new = {"dense": [["p1", 0.8], ["p2", 0.5], ["p3", 0.2]], "facts": [{**fact, "ends": [["tarsk", 1.0, 1.0, 2.0], None]}],
           "fact_range": [0.0, 0.9], "named": [["tarsk", 1.0, 3, 1, 1.0, 2.0]]}
    [seeds] = global_seeds([[old], [new]], Settings().retrieval)
    assert seeds.strength == {"tarsk": 3.0 + 1.0 + 2.0, "amber": 1.0}
    # p1, reported by both shards (a halo copy), is one of the top 3 once: p1, p2, p3 min-max normalised
    assert seeds.passages == pytest.approx({"p1": Settings().retrieval.passage_node_weight,
                                            "p2": Settings().retrieval.passage_node_weight / 2})


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


def test_build_shards_gives_every_passage_one_owner_and_lists_each_halo(graph_shards: Path) -> None:
    record = json.loads((graph_shards / SHARDS_FILE).read_text())
    assert [s["name"] for s in record["shards"]] == ["shard-000", "shard-001"]
    assert record["partition"]["method"] == "communities" and sum(record["partition"]["passages"]) == 10
    titles = [json.loads(line)["title"] for line in (FIX / "twohop.jsonl").read_text().splitlines()]
    owned, halo = [], []
    for s in record["shards"]:
        r = Retriever(graph_shards / s["name"])
        mine = owned_mask(r)
        assert (len(r.passages), int((~mine).sum())) == (s["passages"] + s["halo"], s["halo"])
        assert r.data.manifest.get("halo", []) == [p.id for p, m in zip(r.passages, mine) if not m]
        owned += [p.title for p, m in zip(r.passages, mine) if m]
        halo += [p.title for p, m in zip(r.passages, mine) if not m]
    assert sorted(owned) == sorted(titles)  # each passage owned by exactly one shard
    assert halo and record["partition"]["halo"] == [s["halo"] for s in record["shards"]]
    with pytest.raises(FileExistsError):
        build_shards([FIX / "twohop.jsonl"], graph_shards, Settings(), 2, progress=False)


def test_a_sharded_graph_search_merges_pagerank_masses_from_one_seeding(graph_shards: Path, retriever: Retriever,
                                                                        minilm) -> None:
    paths = [graph_shards / "shard-000", graph_shards / "shard-001"]
    with ExitStack() as stack:
        urls = [stack.enter_context(live(shard_app(p, minilm))) for p in paths]
        front = stack.enter_context(live(front_app(urls)))
        for mode in MODES:  # the shards hold halo passages: each still answers once
            r = retrieve(front, mode)
            assert r.status_code == 200, r.text
            assert [s["ok"] for s in r.json()["shards"]] == [True, True]
            rows = [[h["document"]["id"] for h in row] for row in r.json()["result"]]
            assert all(len(row) == len(set(row)) == 3 for row in rows), mode
        whole = [[d.id for d in res.docs] for res in retriever.search(QUERIES, "passage", 3)]
        assert [[h["document"]["id"] for h in row] for row in retrieve(front, "passage").json()["result"]] == whole
        scores = [h["score"] for row in retrieve(front, "graph").json()["result"] for h in row]
        assert not np.allclose(scores[0], 1 / 61)  # masses, not the rank fusion's 1 / (60 + rank)
        seeds = httpx.post(f"{urls[0]}/retrieve/shard", json={"queries": QUERIES[:1], "stage": "seeds"}).json()
        assert set(seeds["seeds"][0]) == {"dense", "facts", "fact_range", "named"}
        bad = httpx.post(f"{urls[0]}/retrieve/shard", json={"queries": QUERIES[:2], "stage": "rank", "seeds": []})
        assert bad.status_code == 400 and "one seeding per query" in bad.text


def sharded_search(paths: list[Path], minilm, mode: str, k: int) -> list[list]:
    """The front's two stages over the shards, in process (as benchmarks/shards.py --in-process)."""
    shards = [Retriever(p, Settings().retrieval, embedder=minilm) for p in paths]
    cfg = shards[0].cfg
    passages = [merge_by_score([r.docs for r in rows], 2 * k)
                for rows in zip(*(s.search(QUERIES, "passage", 2 * k) for s in shards))]
    seeds = [g.to_json() for g in global_seeds([seed_candidates(s, QUERIES) for s in shards], cfg)]
    graph = [merge_by_score([r.docs for r in rows], 2 * k)
             for rows in zip(*(rank_with_seeds(s, QUERIES, seeds, 2 * k) for s in shards))]
    if mode == "passage":
        return [p[:k] for p in passages]
    return [g[:k] for g in graph] if mode == "graph" else [fuse([p, g], k, cfg.rrf_k) for p, g in zip(passages, graph)]


def test_halo_passages_answer_once_and_passage_search_is_unchanged(graph_shards: Path, retriever: Retriever,
                                                                    minilm) -> None:
    paths = [graph_shards / "shard-000", graph_shards / "shard-001"]
    whole = {mode: [[d.id for d in r.docs] for r in retriever.search(QUERIES, mode, 10)] for mode in MODES}
    for mode in MODES:
        got = [[d.id for d in docs] for docs in sharded_search(paths, minilm, mode, 10)]
        assert all(len(row) == len(set(row)) for row in got), mode  # a halo copy is never a second hit
        assert all(len(row) == 10 for row in got) or mode == "graph"  # a shard no seed reaches answers nothing
        if mode == "passage":
            assert got == whole["passage"]  # exact: the dense union's top k is the unsharded top k
    shards = [Retriever(p, embedder=minilm) for p in paths]
    seeds = [g.to_json() for g in global_seeds([seed_candidates(s, QUERIES) for s in shards], retriever.cfg)]
    ranked = [rank_with_seeds(s, QUERIES, seeds, 10) for s in shards]
    twice = 0
    for q in range(len(QUERIES)):  # a passage both shards score is kept once, at the higher score
        scores: dict[str, list[float]] = {}
        for per_shard in ranked:
            for d in per_shard[q].docs:
                scores.setdefault(d.id, []).append(d.score)
        merged = merge_by_score([per_shard[q].docs for per_shard in ranked], 20)
        assert {d.id: d.score for d in merged} == {pid: max(s) for pid, s in scores.items()}
        twice += sum(len(s) > 1 for s in scores.values())
    assert twice  # a halo passage answered on both shards


def test_an_update_of_a_shard_keeps_its_halo(graph_shards: Path, tmp_path: Path, minilm, spacy_extractor) -> None:
    import shutil

    from graph_index.builder import add_to_index

    shutil.copytree(graph_shards, tmp_path / "out", symlinks=True)
    shard = tmp_path / "out" / "shard-000"
    before = Retriever(shard, embedder=minilm).data.manifest["halo"]
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"title": "Ossel", "text": "The Ossel waterway runs past Tarsk to the sea."}) + "\n")
    cfg = Settings(cache_dir=tmp_path / "cache")
    add_to_index(shard, [extra], cfg, progress=False,
                 components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    after = Retriever(shard, embedder=minilm)
    assert after.data.manifest["halo"] == before and len(after.passages) == 7
    assert int((~owned_mask(after)).sum()) == len(before)  # the new passage is the shard's own


@pytest.fixture(scope="module")
def no_halo_shards(tmp_path_factory, minilm, spacy_extractor) -> Path:
    """The same split without halos (``shards.halo_max_entity_passages = 0``)."""
    root = tmp_path_factory.mktemp("no-halo")
    cfg = Settings(cache_dir=root / "cache", shards={"halo_max_entity_passages": 0})
    build_shards([FIX / "twohop.jsonl"], root / "out", cfg, 2, progress=False,
                 components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return root / "out"


def test_the_halo_gives_back_the_paths_the_cut_loses(graph_shards: Path, no_halo_shards: Path,
                                                     retriever: Retriever, minilm) -> None:
    """The fixture's split cuts one link (its halos: one passage each); through it, each owner's PageRank
    reaches across the cut and the merged graph ranking is the unsharded one wherever mass reaches; without
    the halo it is not."""
    whole = [[d.id for d in r.docs if d.score > 0] for r in retriever.search(QUERIES, "graph", 5)]
    record = json.loads((no_halo_shards / SHARDS_FILE).read_text())
    assert record["partition"]["halo"] == [0, 0] and record["partition"]["passage_pairs_cut"] > 0

    def ranked(root: Path) -> list[list[str]]:
        got = sharded_search([root / "shard-000", root / "shard-001"], minilm, "graph", 5)
        return [[d.id for d in docs][:len(w)] for docs, w in zip(got, whole)]

    assert ranked(graph_shards) == whole
    assert ranked(no_halo_shards) != whole


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
