"""``POST /explain`` and the ``/ui`` page's files, in process (no browser): the evidence subgraph's shape and bounds,
its agreement with the search it explains, and the errors (auth, unknown index, bad mode, a sharded index)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from routerag.retrieval.explain import ExplainLimits, edge_kind, explain
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy

Q = "Where was Joran Veld born?"
KEY = {"Authorization": "Bearer explain-key"}


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture(scope="module")
def app(index: Path, retriever: Retriever):
    settings = Settings(server={"api_key": "explain-key"})
    engine = Engine(index, settings, generator=RoutingPolicy(), retriever=retriever)
    engine.warm_up()
    return create_app(engine, settings)


def call(runner: asyncio.Runner, app: Any, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            return await c.request(method, url, **kw)

    return runner.run(go())


def test_explain_shows_the_seeds_paths_and_mass_behind_a_graph_search(runner, app, retriever: Retriever) -> None:
    r = call(runner, app, "POST", "/explain", headers=KEY, json={"query": Q, "mode": "graph", "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"query", "mode", "index", "docs", "facts", "nodes", "edges", "paths", "fallback",
                         "truncated", "omitted", "limits", "graph", "ms"}
    searched = retriever.search([Q], mode="graph", k=3)[0]
    assert [d["id"] for d in body["docs"]] == [d.id for d in searched.docs] and body["index"] == "idx"
    nodes = {n["id"]: n for n in body["nodes"]}
    assert len(nodes) == len(body["nodes"]) <= 40 and not body["truncated"]
    # the top passages are drawn, ranked, and their PageRank mass is the score the search ranked them by
    tops = sorted((n for n in nodes.values() if n["rank"] is not None), key=lambda n: n["rank"])
    assert [n["label"] for n in tops] == [d.title for d in searched.docs]
    assert [n["mass"] for n in tops] == pytest.approx([d.score for d in searched.docs], rel=1e-3)
    # the seed facts and entities with their weights: the question's person is seeded by name and by fact
    assert body["facts"][0]["subject"] == "joran veld" and body["facts"][0]["score"] == pytest.approx(1.0)
    joran = next(n for n in nodes.values() if n["label"] == "joran veld")
    assert joran["kind"] == "entity" and joran["seed_weight"] > 0 and set(joran["seed_from"]) == {"fact", "query"}
    assert all(0 <= n["x"] <= 1 and 0 <= n["y"] <= 1 for n in nodes.values())
    # every drawn edge joins drawn vertices; the seed fact's edge is a relation carrying its score
    assert all(e["source"] in nodes and e["target"] in nodes for e in body["edges"])
    born = next(e for e in body["edges"] if "born in" in e["relations"] and {e["source"], e["target"]} == {
        joran["id"], next(n["id"] for n in nodes.values() if n["label"] == "tarsk")})
    assert born["kind"] == "relation" and born["seed_fact"] == pytest.approx(1.0)
    # paths run from an entity seed to their passage over drawn edges, strongest first
    first = body["paths"][0]
    assert first["title"] == "Joran Veld" and first["paths"]
    for passage in body["paths"]:
        scores = [p["score"] for p in passage["paths"]]
        assert scores == sorted(scores, reverse=True) and len(scores) <= 2
        for path in passage["paths"]:
            assert path["nodes"][-1] == passage["node"] and nodes[path["nodes"][0]]["seed_from"]
            assert len(path["nodes"]) - 1 <= 4
            pairs = {frozenset((e["source"], e["target"])) for e in body["edges"] if e["on_path"]}
            assert all(frozenset(p) in pairs for p in zip(path["nodes"], path["nodes"][1:]))


def test_the_subgraph_stays_within_its_limits_and_says_what_it_left_out(runner, app) -> None:
    r = call(runner, app, "POST", "/explain", headers=KEY,
             json={"query": Q, "mode": "hybrid", "k": 5, "max_nodes": 7, "max_seeds": 2})
    body = r.json()
    assert r.status_code == 200 and body["mode"] == "hybrid"
    assert len(body["nodes"]) <= 7 and body["truncated"] and body["limits"]["max_nodes"] == 7
    assert body["omitted"]["seeds"] > 0
    assert sum(1 for n in body["nodes"] if n["kind"] == "entity" and n["seed_weight"] > 0) <= 2
    drawn = {n["id"] for n in body["nodes"]}
    assert all(set(p["nodes"]) <= drawn for passage in body["paths"] for p in passage["paths"])
    r = call(runner, app, "POST", "/explain", headers=KEY, json={"query": Q, "max_nodes": 1000})
    assert r.status_code == 422 and "max_nodes" in r.json()["error"]["message"]


def test_explain_errors(runner, app) -> None:
    ok = {"query": Q, "mode": "graph"}
    r = call(runner, app, "POST", "/explain", json=ok)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert call(runner, app, "POST", "/explain", json=ok, headers={"Authorization": "Bearer nope"}).status_code == 401
    r = call(runner, app, "POST", "/explain", headers=KEY, json={**ok, "index": "elsewhere"})
    assert r.status_code == 404 and "no index named 'elsewhere'" in r.json()["error"]["message"]
    r = call(runner, app, "POST", "/explain", headers=KEY, json={**ok, "mode": "passage"})
    assert r.status_code == 422 and r.json()["error"]["type"] == "validation_error"
    assert call(runner, app, "POST", "/explain", headers=KEY, json={**ok, "k": 0}).status_code == 422
    assert call(runner, app, "POST", "/explain", headers=KEY, json={**ok, "query": "  "}).status_code == 422
    assert call(runner, app, "POST", "/explain", headers=KEY, json={**ok, "topk": 3}).status_code == 422
    r = call(runner, app, "POST", "/explain", headers={**KEY, "Content-Type": "text/plain"}, content=b'{"query": "x"}')
    assert r.status_code == 415


def test_a_sharded_index_has_no_graph_to_explain(runner, index: Path, retriever: Retriever) -> None:
    from routerag.retrieval.shards import ShardedRetriever

    settings = Settings()
    engine = Engine(None, settings, generator=RoutingPolicy(),
                    shards=ShardedRetriever(["http://127.0.0.1:9"], timeout_s=1))
    app = create_app({"far": engine}, settings)
    r = call(runner, app, "POST", "/explain", json={"query": Q})
    assert r.status_code == 409 and "served from shards" in r.json()["error"]["message"]


def test_the_page_is_public_and_its_data_calls_are_not(runner, app) -> None:
    for path, media in (("/ui", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/style.css", "text/css")):
        r = call(runner, app, "GET", path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(media), path
        assert "default-src 'none'" in r.headers["content-security-policy"]
    page = call(runner, app, "GET", "/ui").text
    assert "http://" not in page and "https://" not in page  # nothing from elsewhere
    script = call(runner, app, "GET", "/ui/app.js").text
    assert "Authorization" in script and "sessionStorage" in script and "innerHTML" not in script
    assert call(runner, app, "GET", "/indexes").status_code == 401
    spec = call(runner, app, "GET", "/openapi.json").json()
    assert "/explain" in spec["paths"] and "/ui" not in spec["paths"]


def test_edge_kinds_mark_synonyms() -> None:
    assert edge_kind(8) == ("synonym", ["synonym"])
    assert edge_kind(1 | 8) == ("relation", ["fact", "synonym"])
    assert edge_kind(2 | 4) == ("passage-entity", ["mention", "title"])


def test_explain_refuses_passage_mode_and_bounds_paths_by_hops(retriever: Retriever) -> None:
    from routerag.retrieval.types import QueryError

    with pytest.raises(QueryError, match="graph or hybrid"):
        explain(retriever, Q, "passage")
    found = explain(retriever, Q, "graph", 3, ExplainLimits(max_hops=1, paths_per_passage=5))
    assert all(len(p.nodes) == 2 for pp in found.paths for p in pp.paths)
    none = explain(retriever, Q, "graph", 3, ExplainLimits(paths_per_passage=0, context_nodes=0))
    assert all(not pp.paths for pp in none.paths) and not any(e.on_path for e in none.edges)


def test_both_pagerank_backends_explain_alike(index: Path, retriever: Retriever, minilm) -> None:
    from routerag.config import RetrievalConfig

    reference = Retriever(index, RetrievalConfig(ppr_backend="igraph"), embedder=minilm)
    ours, theirs = explain(retriever, Q, "graph", 3), explain(reference, Q, "graph", 3)
    evidence = [n.id for n in ours.nodes if n.rank is not None or n.seed_from]
    assert evidence == [n.id for n in theirs.nodes if n.rank is not None or n.seed_from]
    mass = {n.id: n.mass for n in theirs.nodes}  # (context vertices of equal mass may differ: ties)
    assert [n.mass for n in ours.nodes if n.id in mass] == pytest.approx(
        [mass[n.id] for n in ours.nodes if n.id in mass], rel=1e-3, abs=1e-6)
    assert [[p.nodes for p in pp.paths] for pp in ours.paths] == [[p.nodes for p in pp.paths] for pp in theirs.paths]
