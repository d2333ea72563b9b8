"""The server on a real socket (uvicorn in a thread): our own HTTPSearch client against /retrieve, a policy loop that
searches remotely, and the OpenAI-compatible policy backend driven end to end through /ask against a real local
completions server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from routerag.config import GeneratorConfig, Settings
from routerag.engine import Engine
from routerag.policy.backends.openai_backend import OpenAIGenerator
from routerag.policy.search import HTTPSearch
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.fake_openai import FakeOpenAIServer, Reply
from .helpers.server_helpers import RoutingPolicy, live_server, parse_sse

Q = "Where was Joran Veld born?"


@pytest.fixture(scope="module")
def server_url(index: Path, retriever: Retriever) -> Iterator[str]:
    settings = Settings(server={"api_key": "live-key"})
    app = create_app(Engine(index, settings, generator=RoutingPolicy(), retriever=retriever), settings)
    with live_server(app) as url:
        yield url


def test_http_search_client_against_the_live_endpoint(server_url: str, retriever: Retriever) -> None:
    async def go():
        client = HTTPSearch(server_url, api_key="live-key")
        try:
            return await asyncio.gather(client.search(Q, "hybrid", 3), client.search("What does Kesh trade?",
                                                                                     "graph", 2))
        finally:
            await client.aclose()

    hybrid, graph = asyncio.run(go())
    for got, (query, mode, k) in [(hybrid, (Q, "hybrid", 3)), (graph, ("What does Kesh trade?", "graph", 2))]:
        [want] = retriever.search([query], mode=mode, k=k)
        assert got.query == query and got.mode == mode
        assert [(d.id, d.title, d.text) for d in got.docs] == [(d.id, d.title, d.text) for d in want.docs]
        assert [d.score for d in got.docs] == pytest.approx([d.score for d in want.docs], abs=1e-5)
        assert set(got.timings_ms) == {"server"} and got.timings_ms["server"] > 0


def test_http_search_needs_the_key(server_url: str) -> None:
    async def go():
        client = HTTPSearch(server_url)
        try:
            await client.search(Q, "passage", 1)
        finally:
            await client.aclose()

    with pytest.raises(httpx.HTTPStatusError) as exc:
        asyncio.run(go())
    assert exc.value.response.status_code == 401


def test_a_request_the_server_refuses_is_a_query_error_for_both_endpoint_clients(server_url: str) -> None:
    """A query or k the server refuses (400, 422) is the QueryError a local retriever would raise, with the server's
    message, from HTTPSearch and from the sharded client alike (every shard would refuse it: no shard failure)."""
    from routerag.retrieval.types import QueryError
    from routerag.retrieval.shards import ShardedRetriever

    async def go(client, query: str, k: int):
        try:
            if isinstance(client, ShardedRetriever):
                return await client.search([query], "graph", k)
            return await client.search(query, "graph", k)
        finally:
            await client.aclose()

    for make in (lambda: HTTPSearch(server_url, api_key="live-key"),
                 lambda: ShardedRetriever([server_url], api_key="live-key")):
        with pytest.raises(QueryError, match=r"refused the request \(422\).*topk"):
            asyncio.run(go(make(), Q, 50))  # the server's max_k is 20
        with pytest.raises(QueryError, match=r"refused the request \(422\).*non-whitespace"):
            asyncio.run(go(make(), "   ", 3))


def test_fresh_documents_past_the_server_max_k_is_a_failed_search_not_a_crash(server_url: str, index: Path,
                                                                              retriever: Retriever) -> None:
    """With fresh_documents, a second search asks for k more per document shown; past a remote server's max_k the
    server refuses it, and the policy is told its search failed (as for any refused query) and goes on."""
    from routerag.prompts import SEARCH_FAILED_NOTICE

    from .helpers.scripted import ScriptedGenerator

    gen = ScriptedGenerator(["<search>[passage] Joran Veld</search>", "<search>[passage] Joran Veld</search>",
                             "<answer>Tarsk</answer>"])

    async def go():
        search = HTTPSearch(server_url, api_key="live-key")
        try:
            engine = Engine(index, Settings(policy={"k": 12, "fresh_documents": True, "budget": 3}), generator=gen,
                            search=search, retriever=retriever)
            return await engine.ask(Q)
        finally:
            await search.aclose()

    traj = asyncio.run(go())
    shown = len(traj.steps[0].doc_titles)
    assert traj.steps[0].action == "search" and shown > 8  # 12 + shown > 20: the second search is refused
    assert traj.steps[1].action == "invalid"
    assert SEARCH_FAILED_NOTICE.split("{")[0] in gen.requests[2].prompt_text
    assert "topk" in gen.requests[2].prompt_text
    assert traj.finish == "answer" and traj.answer == "Tarsk"


def test_policy_loop_searching_through_the_live_server(server_url: str, index: Path, retriever: Retriever) -> None:
    """An engine whose searches go over HTTP to another server's /retrieve (a remote retrieval deployment)."""
    async def go():
        search = HTTPSearch(server_url, api_key="live-key")
        try:
            engine = Engine(index, Settings(), generator=RoutingPolicy("[passage]"), search=search,
                            retriever=retriever)
            return await engine.ask(Q)
        finally:
            await search.aclose()

    traj = asyncio.run(go())
    assert traj.finish == "answer" and traj.answer == "Joran Veld"
    assert traj.steps[0].mode == "passage" and traj.steps[0].retrieval_ms > 0


def test_live_ask_stream_and_413_over_a_socket(server_url: str) -> None:
    h = {"Authorization": "Bearer live-key"}
    with httpx.Client(base_url=server_url, headers=h, timeout=30) as c:
        with c.stream("POST", "/ask", json={"question": Q, "stream": True}) as r:
            assert r.status_code == 200
            text = "".join(r.iter_text())
        events = [e for e, _ in parse_sse(text)]
        assert events == ["think", "search", "information", "think", "draft", "answer", "done"]
        for size in (70_000, 300_000):  # drained before the 413, so the client reads it instead of a reset
            r = c.post("/ask", content=b"{" + b" " * size + b"}", headers={"content-type": "application/json"})
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        assert c.get("/health").json()["status"] == "ok"


def test_a_client_that_leaves_cancels_its_ask(index: Path, retriever: Retriever) -> None:
    """A non-streamed /ask whose client disconnects stops: the policy is not asked for another turn."""
    import time

    policy = RoutingPolicy(delay_s=1.5)  # each turn takes 1.5 s; the answer needs two
    settings = Settings()
    app = create_app(Engine(index, settings, generator=policy, retriever=retriever), settings)
    with live_server(app) as url:
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=url, timeout=0.5) as c:
            c.post("/ask", json={"question": Q})
        time.sleep(2.5)  # past where a second turn would have started
        assert policy.calls == 1
        metrics = httpx.get(f"{url}/metrics").text
    assert 'routerag_request_errors_total{route="/ask",type="client_disconnected"} 1.0' in metrics
    assert 'routerag_http_requests_total{method="POST",route="/ask",status="499"} 1.0' in metrics


# -- the OpenAI-compatible policy backend ------------------------------------------------------------------------------


def completions_policy(req: dict) -> Reply:
    """A scripted completions model: search first, answer once the information is in the prompt."""
    prompt = req["prompt"]
    if "<information>Doc 1" not in prompt:  # (the instruction itself mentions <information>)
        return Reply(text="<think>I need the birthplace.</think>\n<search>[passage] Joran Veld birthplace</search>"
                          "\n<information>hallucinated</information>", prompt_tokens=120, completion_tokens=14)
    return Reply(text="<think>Doc 1 says Tarsk.</think>\n<answer> Tarsk </answer> trailing text",
                 prompt_tokens=260, completion_tokens=10)


def test_openai_backend_end_to_end_through_ask(index: Path, retriever: Retriever) -> None:
    with FakeOpenAIServer(completions_policy) as llm:
        settings = Settings(policy={"query": "free"})  # a served model's queries are its own
        gen = OpenAIGenerator(GeneratorConfig(backend="openai", model="policy-model", base_url=llm.base_url,
                                              timeout_s=10, api="completions"))
        app = create_app(Engine(index, settings, generator=gen, retriever=retriever), settings)

        async def go() -> httpx.Response:
            try:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
                    return await c.post("/ask", json={"question": Q})
            finally:
                await gen.aclose()

        r = asyncio.run(go())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Tarsk" and body["finish"] == "answer" and body["searches"] == 1
    search, answer = body["trace"]
    assert (search["action"], search["mode"], search["query"]) == ("search", "passage", "Joran Veld birthplace")
    assert search["thought"] == "I need the birthplace." and search["doc_titles"][0] == "Joran Veld"
    assert answer["action"] == "answer" and answer["thought"] == "Doc 1 says Tarsk."
    assert body["tokens"] == {"prompt": 380, "completion": 24}
    assert [q.path for q in llm.requests] == ["/v1/completions"] * 2
    first, second = (q.body for q in llm.requests)
    assert first["stop"] == second["stop"] == ["</search>", "</answer>"]
    assert first["model"] == "policy-model" and first["temperature"] == 0.0
    assert Q in first["prompt"] and first["prompt"].endswith("<|im_start|>assistant\n")
    # the server cut the stop string; the loop restored the closing tag before appending the documents
    assert ("<search>[passage] Joran Veld birthplace</search>\n\n<information>Doc 1 (Title: Joran Veld)"
            in second["prompt"])
    assert "hallucinated" not in second["prompt"]


def test_openai_backend_down_is_a_502(index: Path, retriever: Retriever) -> None:
    from .helpers.fake_openai import free_port

    settings = Settings()
    gen = OpenAIGenerator(GeneratorConfig(backend="openai", model="m", base_url=f"http://127.0.0.1:{free_port()}/v1",
                                          timeout_s=2))
    gen.client = gen.client.with_options(max_retries=0)
    app = create_app(Engine(index, settings, generator=gen, retriever=retriever), settings)

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            return await c.post("/ask", json={"question": Q})

    r = asyncio.run(go())
    assert r.status_code == 502 and r.json()["error"]["type"] == "backend_error"
