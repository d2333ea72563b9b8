"""The REST server in process (httpx over ASGI): every endpoint, the SSE stream, the Search-R1 /retrieve shapes, auth,
limits, timeouts, error bodies, metrics, and 64 concurrent /ask requests, over a real small index with a
deterministic policy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.policy.search import parse_document
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.scripted import ScriptedGenerator
from .helpers.server_helpers import RoutingPolicy, parse_sse

Q = "Where was Joran Veld born?"


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    """One event loop for the module: the engine's micro-batchers keep a worker task per loop."""
    with asyncio.Runner() as r:
        yield r


def make_app(index: Path, retriever: Retriever, generator: Any = None, **server: Any):
    # a scripted policy's queries are searched as written (grounding is tested in test_grounding.py)
    settings = Settings(server=server, policy={"query": "free"})
    engine = Engine(index, settings, generator=generator or RoutingPolicy(), retriever=retriever)
    engine.warm_up()
    return create_app(engine, settings)


@pytest.fixture(scope="module")
def app(index: Path, retriever: Retriever):
    return make_app(index, retriever)


def call(runner: asyncio.Runner, app, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            return await c.request(method, url, **kw)

    return runner.run(go())


def error_of(resp: httpx.Response) -> dict[str, str]:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param", "code"}, body
    return body["error"]


# -- /ask --------------------------------------------------------------------------------------------------------------


def test_ask_answers_with_the_full_trace(runner, app) -> None:
    r = call(runner, app, "POST", "/ask", json={"question": Q})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"answer", "trace", "searches", "retrieval_ms", "generation_ms", "total_ms", "tokens", "finish",
                         "refused", "citations", "draft", "answered_by"}
    assert body["finish"] == "answer" and body["refused"] is False and body["searches"] == 1
    first, last = body["trace"]
    assert (first["action"], first["mode"], first["query"]) == ("search", "graph", Q)
    assert first["thought"] == "I should look this up." and len(first["doc_ids"]) == 3  # policy.k default
    assert body["answer"] == first["doc_titles"][0] == "Joran Veld"
    # every retrieved passage that names Joran Veld is cited, with its sentence that does
    assert body["citations"] and {c["id"] for c in body["citations"]} <= set(first["doc_ids"])
    assert body["citations"][0]["id"] == first["doc_ids"][0]
    assert all("joran veld" in c["sentence"].lower() for c in body["citations"])
    assert last["action"] == "answer"
    assert 0 < body["retrieval_ms"] <= body["total_ms"]
    assert body["tokens"]["prompt"] > 0 and body["tokens"]["completion"] > 0


def test_ask_overrides_mode_k_and_budget(runner, app) -> None:
    r = call(runner, app, "POST", "/ask", json={"question": Q, "mode": "passage", "k": 5, "budget": 2})
    assert r.status_code == 200, r.text
    step = r.json()["trace"][0]
    assert step["mode"] == "passage" and step["mode_tags"] == ["graph"] and len(step["doc_ids"]) == 5
    r = call(runner, app, "POST", "/ask", json={"question": Q, "budget": 0})
    body = r.json()
    assert r.status_code == 200 and body["finish"] == "forced_answer" and body["searches"] == 0
    assert [s["action"] for s in body["trace"]] == ["over_budget", "forced_answer"] and body["answer"] == "unknown"


def test_ask_streams_server_sent_events(runner, index, retriever) -> None:
    gen = ScriptedGenerator(["<think>look it up</think><search>[graph][passage] Joran Veld birthplace</search>",
                             "<think>it says Tarsk</think><answer> Tarsk </answer>"])
    app = make_app(index, retriever, gen)
    r = call(runner, app, "POST", "/ask", json={"question": Q, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["think", "search", "information", "think", "draft", "answer", "done"]
    by = dict(events[:3])
    assert by["think"] == {"type": "think", "text": "look it up", "step": 0}
    assert by["search"]["mode"] == "hybrid" and by["search"]["query"] == "Joran Veld birthplace"
    docs = by["information"]["docs"]
    assert len(docs) == 3 and set(docs[0]) == {"id", "title", "text", "score"}
    assert events[4][1] == {"type": "draft", "text": "Tarsk", "forced": False, "refused": False}
    assert events[5][1] == {"type": "answer", "text": "Tarsk", "answered_by": "policy", "refused": False}
    done = events[-1][1]
    assert done["answer"] == "Tarsk" and done["finish"] == "answer" and done["searches"] == 1
    assert (done["draft"], done["answered_by"]) == ("Tarsk", "policy")
    assert [s["action"] for s in done["trace"]] == ["search", "answer"]
    assert done["trace"][0]["doc_ids"] == [d["id"] for d in docs]
    assert done["total_ms"] >= done["retrieval_ms"] > 0


def test_the_policys_draft_and_the_readers_final_answer_are_labelled(runner, index, retriever) -> None:
    """One answer to show: the policy's `<answer>` is its draft, the reader's is `answer`, in the JSON, the stream
    and the chat completion alike."""
    def app_with_reader():
        settings = Settings(policy={"query": "free"})
        engine = Engine(index, settings, generator=ScriptedGenerator(["<search>[graph] Joran Veld</search>",
                                                                      "<answer>somewhere</answer>"]),
                        retriever=retriever, answer_generator=ScriptedGenerator(["Tarsk</answer>"]))
        engine.warm_up()
        return create_app(engine, settings)

    body = call(runner, app_with_reader(), "POST", "/ask", json={"question": Q}).json()
    assert (body["answer"], body["answered_by"], body["draft"]) == ("Tarsk", "reader", "somewhere")
    assert body["trace"][-1]["answer"] == "somewhere"  # the trace's answer step is the draft
    events = dict(parse_sse(call(runner, app_with_reader(), "POST", "/ask",
                                 json={"question": Q, "stream": True}).text))
    assert events["draft"]["text"] == "somewhere"
    assert events["answer"] == {"type": "answer", "text": "Tarsk", "answered_by": "reader", "refused": False}
    chat = call(runner, app_with_reader(), "POST", "/v1/chat/completions",
                json={"model": "idx", "stream": True, "messages": [{"role": "user", "content": Q}]})
    chunks = [c for line in chat.text.splitlines() if line.startswith("data: {")
              for c in [json.loads(line[6:])] if c.get("choices")]
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert "[draft answer] somewhere" in reasoning and content == "Tarsk"


def test_streamed_timeout_ends_with_an_error_event(runner, index, retriever) -> None:
    app = make_app(index, retriever, RoutingPolicy(delay_s=2.0), request_timeout_s=0.05)
    r = call(runner, app, "POST", "/ask", json={"question": Q, "stream": True})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "timeout"


def test_timeout_is_a_504(runner, index, retriever) -> None:
    app = make_app(index, retriever, RoutingPolicy(delay_s=2.0), request_timeout_s=0.05)
    r = call(runner, app, "POST", "/ask", json={"question": Q})
    assert r.status_code == 504
    err = error_of(r)
    assert err["type"] == "timeout" and "0.05 s" in err["message"]
    assert 'routerag_request_errors_total{route="/ask",type="timeout"} 1.0' in call(runner, app, "GET", "/metrics").text


# -- /retrieve (Search-R1's protocol) ----------------------------------------------------------------------------------


def test_retrieve_with_scores_and_mode(runner, app, retriever) -> None:
    queries = [Q, "What does Kesh trade?"]
    r = call(runner, app, "POST", "/retrieve", json={"queries": queries, "topk": 3, "return_scores": True,
                                                     "mode": "graph"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["mode"] == "graph" and len(body["result"]) == 2 and len(body["ms"]) == 2
    assert all(ms > 0 for ms in body["ms"])
    direct = retriever.search(queries, mode="graph", k=3)
    for row, res in zip(body["result"], direct):
        assert [hit["document"]["id"] for hit in row] == [d.id for d in res.docs]
        assert [hit["score"] for hit in row] == pytest.approx([d.score for d in res.docs], abs=1e-5)
    hit = body["result"][0][0]
    assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "title", "text", "contents"}
    doc = hit["document"]
    assert doc["title"] == "Joran Veld" and doc["contents"] == f'"{doc["title"]}"\n{doc["text"]}'
    parsed = parse_document(hit)  # what a Search-R1-style client reads
    assert (parsed.id, parsed.title, parsed.text) == (doc["id"], doc["title"], doc["text"])


def test_retrieve_without_scores_uses_defaults(runner, app) -> None:
    r = call(runner, app, "POST", "/retrieve", json={"queries": ["amber"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["mode"] == Settings().retrieval.mode  # server.retrieve_mode unset: the retrieval section's mode
    row = body["result"][0]
    assert len(row) == Settings().retrieval.top_k and set(row[0]) == {"id", "title", "text", "contents"}
    assert row[0]["title"] == "Amber"


def test_retrieve_default_mode_from_server_settings(runner, index, retriever) -> None:
    app = make_app(index, retriever, retrieve_mode="passage")
    r = call(runner, app, "POST", "/retrieve", json={"queries": ["amber"], "topk": 1})
    assert r.status_code == 200 and r.json()["mode"] == "passage" and len(r.json()["result"][0]) == 1


@pytest.mark.parametrize("body, status, kind, needle", [
    ({"queries": ["   "]}, 422, "validation_error", "queries.0: Value error, must contain non-whitespace"),
    ({"queries": ["amber", ""]}, 422, "validation_error", "queries.1"),
    ({"queries": ["amber"], "top_k": 3}, 422, "validation_error", "top_k: Extra inputs are not permitted"),
    ({"queries": []}, 422, "validation_error", "queries"),
    ({"queries": "amber"}, 422, "validation_error", "queries"),
    ({"queries": ["amber"], "topk": 21}, 422, "validation_error", "topk"),
    ({"queries": ["amber"], "topk": 0}, 422, "validation_error", "topk"),
    ({"queries": ["amber"], "mode": "web"}, 422, "validation_error", "mode"),
    ({"queries": ["amber"] * 65}, 422, "validation_error", "queries"),
    ({"queries": ["x" * 4001]}, 422, "validation_error", "queries.0"),
])
def test_retrieve_rejects_bad_requests(runner, app, body, status, kind, needle) -> None:
    r = call(runner, app, "POST", "/retrieve", json=body)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["type"] == kind and needle in err["message"]


# -- validation and limits ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, needle", [
    ({"question": "x" * 2001}, "question: String should have at most 2000 characters"),
    ({"question": Q, "budget": 9}, "budget: Input should be less than or equal to 8"),
    ({"question": Q, "budget": -1}, "budget"),
    ({"question": Q, "k": 21}, "k: Input should be less than or equal to 20"),
    ({"question": Q, "k": 0}, "k: Input should be greater than or equal to 1"),
    ({"question": 123}, "question: Input should be a valid string"),
    ({"question": Q, "budget": "3"}, "budget: Input should be a valid integer"),
    ({"question": Q, "stream": "yes"}, "stream: Input should be a valid boolean"),
    ({"question": Q, "mode": "web"}, "mode"),
    ({"question": "   "}, "question: Value error, must contain non-whitespace characters"),
    ({"question": Q, "top_k": 3}, "top_k: Extra inputs are not permitted"),
    ({}, "question: Field required"),
    ([Q], "request body"),
])
def test_ask_validation_is_a_422_with_a_message(runner, app, body, needle) -> None:
    r = call(runner, app, "POST", "/ask", json=body)
    assert r.status_code == 422, r.text
    err = error_of(r)
    assert err["type"] == "validation_error" and needle in err["message"], err


@pytest.mark.parametrize("content, headers, needle", [
    (b'{"question": "unterminated', {"content-type": "application/json"}, "not valid JSON"),
    (b'{"question": "\\ud800"}', {"content-type": "application/json"}, "unicode"),
    (b"", {"content-type": "application/json"}, "Field required"),
    (b"{\"question\": \"\xff\"}", {"content-type": "application/json"}, "UTF-8"),
])
def test_malformed_bodies_are_422(runner, app, content, headers, needle) -> None:
    r = call(runner, app, "POST", "/ask", content=content, headers=headers)
    assert r.status_code == 422, r.text
    assert needle in error_of(r)["message"]


def test_body_over_the_limit_is_413_before_parsing(runner, index, retriever) -> None:
    gen = RoutingPolicy()
    app = make_app(index, retriever, gen, max_body_bytes=1024)
    big = b'{"question": "' + b"x" * 2000 + b'"}'
    r = call(runner, app, "POST", "/ask", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["type"] == "request_too_large"
    assert "2016 bytes" in error_of(r)["message"] and "1024" in error_of(r)["message"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the body is counted as it streams in
        for _ in range(20):
            yield b"x" * 100

    r = call(runner, app, "POST", "/ask", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["type"] == "request_too_large"
    r = call(runner, app, "POST", "/ask", content=b"not json", headers={"content-length": "abc"})
    assert r.status_code == 400 and error_of(r)["type"] == "bad_request"
    assert gen.calls == 0
    r = call(runner, app, "POST", "/ask", json={"question": Q})  # small bodies (also streamed ones) pass
    assert r.status_code == 200


def test_a_query_the_retriever_refuses_is_the_policys_invalid_turn(runner, index, retriever) -> None:
    # the policy writes a query longer than retrieval.max_query_chars: that is its mistake, not the client's
    gen = ScriptedGenerator([f"<search>[passage] {'y' * 5000}</search>", "<answer>x</answer>"])
    r = call(runner, make_app(index, retriever, gen), "POST", "/ask", json={"question": Q})
    assert r.status_code == 200
    assert [s["action"] for s in r.json()["trace"]] == ["invalid", "answer"]


def test_unknown_routes_and_methods_use_the_error_shape(runner, app) -> None:
    r = call(runner, app, "GET", "/nope")
    assert r.status_code == 404 and error_of(r)["type"] == "not_found"
    r = call(runner, app, "GET", "/ask")
    assert r.status_code == 405 and error_of(r)["type"] == "method_not_allowed"


def test_internal_errors_are_json_500s(runner, index, retriever) -> None:
    class Broken(RoutingPolicy):
        async def generate(self, request):
            raise RuntimeError("model exploded")

    app = make_app(index, retriever, Broken())

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return await c.post("/ask", json={"question": Q})

    r = runner.run(go())
    assert r.status_code == 500
    assert error_of(r) == {"type": "internal_error", "message": "internal server error (RuntimeError)",
                         "param": None, "code": None}


# -- probes, docs, auth ------------------------------------------------------------------------------------------------


def test_health_ready_docs_and_openapi(runner, app) -> None:
    health = call(runner, app, "GET", "/health").json()
    assert health["status"] == "ok" and health["rss_mb"] > 0
    [idx] = health["indexes"]  # no keys configured: everyone sees the served index, its size and memory
    assert idx["name"] == "idx" and idx["passages"] == 10 and idx["memory_mb"] > 0 and idx["jobs_pending"] == 0
    assert call(runner, app, "GET", "/ready").json() == {"status": "ready"}
    assert call(runner, app, "GET", "/docs").status_code == 200
    spec = call(runner, app, "GET", "/openapi.json").json()
    assert {"/ask", "/retrieve", "/health", "/ready", "/metrics"} <= set(spec["paths"])
    ask_schema = spec["components"]["schemas"]["AskRequest"]["properties"]
    assert ask_schema["question"]["maxLength"] == 2000  # the configured limits are published
    assert "text/event-stream" in spec["paths"]["/ask"]["post"]["responses"]["200"]["content"]
    assert "securitySchemes" not in spec.get("components", {})


def test_api_key(runner, index, retriever) -> None:
    app = make_app(index, retriever, api_key="s3cret")
    good = {"Authorization": "Bearer s3cret"}
    assert call(runner, app, "GET", "/health").status_code == 200  # liveness stays open
    assert call(runner, app, "GET", "/docs").status_code == 200
    spec = call(runner, app, "GET", "/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert spec["paths"]["/ask"]["post"]["security"] == [{"bearerAuth": []}]
    assert "security" not in spec["paths"]["/health"]["get"]
    for method, url, kw in [("POST", "/ask", {"json": {"question": Q}}),
                            ("POST", "/retrieve", {"json": {"queries": ["amber"]}}),
                            ("GET", "/ready", {}), ("GET", "/metrics", {})]:
        r = call(runner, app, method, url, **kw)
        assert r.status_code == 401 and error_of(r)["type"] == "authentication_error"
        assert "missing API key" in error_of(r)["message"] and r.headers["www-authenticate"].startswith("Bearer")
        for wrong in ("Bearer nope", "Basic s3cret", "s3cret", "Bearer s3cret2"):
            r = call(runner, app, method, url, headers={"Authorization": wrong}, **kw)
            assert r.status_code == 401 and error_of(r)["message"] == "invalid API key"
        assert call(runner, app, method, url, headers=good, **kw).status_code == 200
    # a bad request with no key is refused for the key, before its body is looked at
    r = call(runner, app, "POST", "/ask", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 401


# -- metrics -----------------------------------------------------------------------------------------------------------


def test_metrics_count_the_traffic(runner, index, retriever) -> None:
    app = make_app(index, retriever, api_key="k")
    h = {"Authorization": "Bearer k"}
    for _ in range(2):
        assert call(runner, app, "POST", "/ask", json={"question": Q}, headers=h).status_code == 200
    call(runner, app, "POST", "/ask", json={"question": Q, "budget": 0}, headers=h)
    call(runner, app, "POST", "/retrieve", json={"queries": ["a", "b", "c"], "mode": "passage"}, headers=h)
    call(runner, app, "POST", "/ask", json={"question": Q, "k": 99}, headers=h)
    call(runner, app, "POST", "/ask", json={"question": Q})
    call(runner, app, "GET", "/no/such/path", headers=h)
    r = call(runner, app, "GET", "/metrics", headers=h)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in ['routerag_http_requests_total{method="POST",route="/ask",status="200"} 3.0',
                 'routerag_http_requests_total{method="POST",route="/ask",status="422"} 1.0',
                 'routerag_http_requests_total{method="POST",route="/ask",status="401"} 1.0',
                 'routerag_http_requests_total{method="POST",route="/retrieve",status="200"} 1.0',
                 'routerag_http_requests_total{method="GET",route="other",status="404"} 1.0',
                 'routerag_searches_total{index="idx",mode="graph",source="ask"} 2.0',
                 'routerag_searches_total{index="idx",mode="passage",source="retrieve"} 3.0',
                 'routerag_ask_finish_total{finish="answer",index="idx"} 2.0',
                 'routerag_ask_finish_total{finish="forced_answer",index="idx"} 1.0',
                 'routerag_index_passages{index="idx"} 10.0',
                 'routerag_request_duration_seconds_count{route="/ask"} 5.0',
                 'routerag_request_duration_seconds_count{route="/retrieve"} 1.0']:
        assert line in text, line
    assert 'routerag_request_duration_seconds_bucket{le="0.5",route="/ask"}' in text
    # a second app has its own registry
    other = call(runner, make_app(index, retriever), "GET", "/metrics").text
    assert 'routerag_http_requests_total{method="POST",route="/ask"' not in other
    assert 'routerag_admission_in_flight{route="/ask"} 0.0' in other  # its own gauges, from zero


# -- concurrency -------------------------------------------------------------------------------------------------------


def test_64_concurrent_asks_are_all_answered_and_batched(runner, index, retriever) -> None:
    engine = Engine(index, Settings(), generator=RoutingPolicy(), retriever=retriever)
    app = create_app(engine, Settings())
    titles = ["Joran Veld", "Tarsk", "River Pell", "Veld family", "Mira Joran", "Vass", "Brannock", "Kesh"]
    questions = [f"What is known about {titles[i % 8]} (question {i})?" for i in range(64)]

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            return await asyncio.gather(*(c.post("/ask", json={"question": q, "k": 2}) for q in questions))

    responses = runner.run(go())
    assert [r.status_code for r in responses] == [200] * 64
    for q, r in zip(questions, responses):
        body = r.json()
        search = body["trace"][0]
        assert search["query"] == q and body["searches"] == 1 and body["finish"] == "answer"
        assert body["answer"] == search["doc_titles"][0]  # each answer comes from its own search, no cross-talk
    batcher = engine.search.batcher
    assert batcher.items >= 64 and batcher.batches < 64  # concurrent searches shared retrieval batches


# -- the CLI -----------------------------------------------------------------------------------------------------------


def test_serve_command_builds_settings_engine_and_uvicorn(runner, monkeypatch, index, retriever, tmp_path) -> None:
    from typer.testing import CliRunner

    import routerag.engine
    import routerag.runtime
    from routerag.cli import app as cli

    seen: dict[str, Any] = {}
    real_engine = routerag.engine.Engine

    def engine(idx, settings, shards=None):  # the real Engine, with the test policy and the module's retriever
        seen["settings"] = settings
        return real_engine(idx, settings, generator=RoutingPolicy(), retriever=retriever)

    monkeypatch.setattr(routerag.engine, "Engine", engine)
    monkeypatch.setattr(routerag.runtime, "configure_threads", lambda: seen.setdefault("threads", True))
    monkeypatch.setattr("server.operations.run", lambda app, **kw: seen.update(app=app, **kw))
    cfg = tmp_path / "server.toml"
    cfg.write_text("[server]\nmax_k = 7\nport = 1234\n")
    res = CliRunner().invoke(cli, ["serve", str(index), "--host", "0.0.0.0", "--port", "9123", "--api-key", "k",
                                   "--backend", "openai", "--base-url", "http://127.0.0.1:1/v1", "--policy", "m",
                                   "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    s = seen["settings"]
    assert (s.server.host, s.server.port, s.server.max_k) == ("0.0.0.0", 9123, 7)  # flags beat the file
    assert s.server.api_key.get_secret_value() == "k"
    assert (s.policy.generator.backend, s.policy.generator.model) == ("openai", "m")
    assert seen["threads"] and (seen["host"], seen["port"]) == ("0.0.0.0", 9123)
    assert seen["access_log"] is True and seen["drain_timeout_s"] == s.server.drain_timeout_s == 30.0
    assert call(runner, seen["app"], "GET", "/ready").status_code == 401
    r = call(runner, seen["app"], "POST", "/ask", json={"question": Q, "k": 8}, headers={"Authorization": "Bearer k"})
    assert r.status_code == 422 and "less than or equal to 7" in r.text
