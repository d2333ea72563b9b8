"""Sharded retrieval (issue 18): a front server fans each query out to real shard servers on localhost, merges by
score (passage) or by Reciprocal Rank Fusion (graph, hybrid), and degrades, without failing, when a shard fails or
is slow."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from graph_index.builder import Components, build_index
from routerag.config import RetrievalConfig, Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from routerag.retrieval.types import RetrievedDoc
from routerag.retrieval.shards import ShardedRetriever, merge
from server.app import create_app

from .helpers.server_helpers import FIX, RoutingPolicy, live_server

QUERIES = ["Where was Joran Veld born?", "What does Tarsk trade?", "Which river flows through Brannock?"]


def test_merge_passage_by_score_and_graph_by_rank_fusion() -> None:
    a = [RetrievedDoc("a1", "A1", "", 0.9), RetrievedDoc("a2", "A2", "", 0.5)]
    b = [RetrievedDoc("b1", "B1", "", 0.7), RetrievedDoc("b2", "B2", "", 0.6)]
    assert [d.id for d in merge([a, b], "passage", 3)] == ["a1", "b1", "b2"]
    fused = merge([a, b], "graph", 3)  # ranks only: first of each shard, then the second of the first shard
    assert [d.id for d in fused] == ["a1", "b1", "a2"] and fused[0].score == pytest.approx(1 / 61)


@pytest.fixture(scope="module")
def shard_indexes(tmp_path_factory, minilm, spacy_extractor) -> list[Path]:
    lines = (FIX / "twohop.jsonl").read_text().splitlines(keepends=True)
    root = tmp_path_factory.mktemp("shards")
    out = []
    for n, part in enumerate((lines[::2], lines[1::2])):
        corpus = root / f"part{n}.jsonl"
        corpus.write_text("".join(part))
        cfg = Settings(cache_dir=root / "cache")
        build_index([corpus], root / f"shard{n}", cfg, progress=False,
                    components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
        out.append(root / f"shard{n}")
    return out


def shard_app(path: Path, minilm) -> FastAPI:
    settings = Settings()
    engine = Engine(path, settings, generator=RoutingPolicy(),
                    retriever=Retriever(path, RetrievalConfig(), embedder=minilm))
    engine.warm_up()
    return create_app(engine, settings)


def slow_shard(delay_s: float) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve() -> dict:
        await asyncio.sleep(delay_s)
        return {"result": [], "ms": [], "mode": "passage"}

    return app


def front_app(urls: list[str], timeout_s: float = 5.0) -> FastAPI:
    settings = Settings()
    engine = Engine(None, settings, generator=RoutingPolicy("[graph]"),
                    shards=ShardedRetriever(urls, timeout_s=timeout_s))
    engine.warm_up()
    return create_app({"sharded": engine}, settings)


def retrieve(url: str, mode: str, k: int = 3) -> httpx.Response:
    return httpx.post(f"{url}/retrieve", json={"queries": QUERIES, "topk": k, "mode": mode, "return_scores": True},
                      timeout=30)


def test_a_sharded_server_matches_the_unsharded_passage_ranking_and_answers(shard_indexes: list[Path],
                                                                            retriever: Retriever, minilm) -> None:
    with ExitStack() as stack:
        urls = [stack.enter_context(live_server(shard_app(p, minilm))) for p in shard_indexes]
        front = stack.enter_context(live_server(front_app(urls)))
        r = retrieve(front, "passage")
        assert r.status_code == 200, r.text
        body = r.json()
        assert [s["ok"] for s in body["shards"]] == [True, True]
        got = [[(h["document"]["id"], round(h["score"], 4)) for h in row] for row in body["result"]]
        whole = [[(d.id, round(d.score, 4)) for d in res.docs] for res in retriever.search(QUERIES, "passage", 3)]
        assert got == whole  # the same embedder and inner product: the union's top k is the unsharded top k
        for mode in ("graph", "hybrid"):
            rows = retrieve(front, mode).json()["result"]
            assert all(len(row) == 3 for row in rows)
        answer = httpx.post(f"{front}/ask", json={"question": QUERIES[0]}, timeout=30).json()
        assert answer["searches"] == 1 and answer["finish"] == "answer"
        info = httpx.get(f"{front}/indexes").json()["indexes"]
        assert info == [{"name": "sharded", "passages": None, "version": "2 shards", "memory_mb": 0.0,
                         "jobs_pending": 0}]
        assert httpx.post(f"{front}/documents", json=[{"title": "x", "text": "y"}]).status_code == 409


def test_a_failed_or_slow_shard_degrades_the_result_not_the_request(shard_indexes: list[Path], minilm) -> None:
    with ExitStack() as stack:
        alive = stack.enter_context(live_server(shard_app(shard_indexes[0], minilm)))
        slow = stack.enter_context(live_server(slow_shard(3.0)))
        with live_server(shard_app(shard_indexes[1], minilm)) as gone:
            pass  # started and stopped: nothing listens there now
        assert retrieve(alive, "hybrid").status_code == 200  # warm: a cold first query is no timeout to test
        front = stack.enter_context(live_server(front_app([alive, slow, gone], timeout_s=1.5)))
        r = retrieve(front, "hybrid")
        assert r.status_code == 200, r.text
        shards = {s["url"].rsplit("/", 1)[0]: s for s in r.json()["shards"]}
        assert shards[alive]["ok"] and not shards[slow]["ok"] and not shards[gone]["ok"]
        assert shards[slow]["error"] == "timed out" and "ConnectError" in shards[gone]["error"]
        assert all(row for row in r.json()["result"])  # the live shard's documents
        lone = front_app([slow, gone], timeout_s=1.5)
        down = stack.enter_context(live_server(lone))
        r = retrieve(down, "passage")
        assert r.status_code == 502 and "no shard answered" in r.json()["error"]["message"]
