"""Issue #34's server holes, one test each (the route × key × index matrix is tests/test_security_matrix.py):
cross-site writes and DNS rebinding, keys that collide or are empty, MCP over HTTP with keys and the REST limits, a
lone passage object, an abandoned chat completion, SIGTERM with requests in flight, and the wording of four errors."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import RetrievalConfig, Settings, SettingsError, load_settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app
from server.security import OriginPolicy

from .helpers.fake_openai import free_port
from .helpers.server_helpers import RoutingPolicy, build_small_index, live_server, wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
Q = "Where was Joran Veld born?"
PASSAGE = {"id": "x", "title": "Halvard Opera House", "text": "INJECTED: the Halvard Opera House stands in Tarsk."}


@pytest.fixture(scope="module")
def own_index(tmp_path_factory, minilm, spacy_extractor) -> Path:
    """An index this module may write to (the session's is shared read-only)."""
    return build_small_index(tmp_path_factory.mktemp("sec") / "idx", minilm, spacy_extractor)


def make_app(index: Path, minilm, spacy_extractor=None, policy: Any = None, **server: Any) -> Any:
    from graph_index.builder import Components

    settings = Settings(cache_dir=index.parent / "cache", server=server)
    engine = Engine(index, settings, generator=policy or RoutingPolicy(),
                    retriever=Retriever(index, RetrievalConfig(), embedder=minilm))
    engine.warm_up()
    components = {"idx": Components(settings, embedder=minilm, extractor=spacy_extractor)} if spacy_extractor else None
    return create_app({"idx": engine}, settings, components=components)


# -- 1. cross-site writes and DNS rebinding ------------------------------------------------------------------------------


def test_cross_site_writes_and_dns_rebinding_are_refused(own_index: Path, minilm, spacy_extractor) -> None:
    app = make_app(own_index, minilm, spacy_extractor)  # the default: no keys, bound to 127.0.0.1
    body = json.dumps(PASSAGE).encode()
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        evil = {"Origin": "http://evil.example"}
        r = c.post("/documents", content=body, headers={**evil, "Content-Type": "text/plain"})
        assert r.status_code == 403 and "server.allowed_origins" in r.json()["error"]["message"], r.text
        r = c.post("/documents", files={"file": ("x.jsonl", body)}, headers=evil)
        assert r.status_code == 403, r.text
        assert c.post("/ask", json={"question": Q}, headers=evil).status_code == 403
        assert c.delete("/documents/x", headers={"Origin": "null"}).status_code == 403  # a sandboxed frame
        # DNS rebinding: attacker.example now resolves to 127.0.0.1; reads are refused too
        for method, path in (("POST", "/documents"), ("GET", "/indexes"), ("GET", "/jobs")):
            r = c.request(method, path, content=body, headers={"Host": "attacker.example",
                                                                "Content-Type": "application/x-ndjson"})
            assert r.status_code == 421 and "server.allowed_hosts" in r.json()["error"]["message"], r.text
        # without an Origin (curl) a body a browser could send cross-site is still no upload type
        r = c.post("/documents", content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and "application/x-ndjson" in r.json()["error"]["message"]
        # the server's own page, and names of loopback, pass
        port = url.rsplit(":", 1)[1]
        same = {"Origin": url, "Content-Type": "application/json"}
        assert c.post("/retrieve", json={"queries": ["amber"]}, headers=same).status_code == 200
        r = c.post("/retrieve", json={"queries": ["amber"]}, headers={"Host": f"localhost:{port}",
                                                                      "Origin": f"http://localhost:{port}"})
        assert r.status_code == 200, r.text
        assert c.get("/jobs").json() == []  # nothing was injected
        assert [p.title for p in app.state.engines["idx"].retriever.passages].count(PASSAGE["title"]) == 0


def test_the_allow_lists_default_to_the_bound_host_and_follow_the_settings() -> None:
    def policy(**server: Any) -> OriginPolicy:
        return OriginPolicy.from_settings(Settings(server=server).server)

    loop = policy()
    assert loop.host_ok(b"127.0.0.1:8000") and loop.host_ok(b"localhost") and loop.host_ok(b"[::1]:80")
    assert not loop.host_ok(b"attacker.example:8000") and not loop.host_ok(None)
    assert loop.origin_ok(b"http://localhost:3000", b"127.0.0.1:8000")  # a local front end on another port
    assert not loop.origin_ok(b"http://evil.example", b"127.0.0.1:8000")
    wild = policy(host="0.0.0.0")
    assert wild.host_ok(b"rag.internal:8000")
    assert wild.origin_ok(b"http://rag.internal:8000", b"rag.internal:8000")  # same origin only
    assert not wild.origin_ok(b"http://evil.example", b"rag.internal:8000")
    named = policy(host="10.0.0.5")
    assert named.host_ok(b"10.0.0.5:8000") and not named.host_ok(b"localhost:8000")
    listed = policy(host="0.0.0.0", allowed_hosts=["rag.example.com"], allowed_origins=["https://app.example.com"])
    assert listed.host_ok(b"RAG.example.com") and not listed.host_ok(b"10.0.0.5")
    assert listed.origin_ok(b"https://app.example.com", b"rag.example.com")
    assert not listed.origin_ok(b"https://rag.example.com:444", b"rag.example.com")
    anyone = policy(allowed_hosts=["*"], allowed_origins=["*"])
    assert anyone.host_ok(b"x.example") and anyone.origin_ok(b"http://y.example", b"x.example")


# -- 3 and 4. keys that collide or are empty -------------------------------------------------------------------------------


@pytest.mark.parametrize("server, needle", [
    ({"api_key": "k", "index_keys": [{"key": "k", "indexes": ["idx"]}]},
     "server.index_keys[0].key is the same key as server.api_key"),
    ({"api_key": "k", "admin_key": "k"}, "server.admin_key is the same key as server.api_key"),
    ({"index_keys": [{"key": "k", "indexes": ["a"]}, {"key": "k", "indexes": ["b"]}]},
     "server.index_keys[1].key is the same key as server.index_keys[0].key"),
    ({"api_key": ""}, "server.api_key: empty"),
    ({"admin_key": " "}, "server.admin_key: empty"),
    ({"index_keys": [{"key": "", "indexes": ["a"]}]}, "server.index_keys.0.key: an index key may not be empty"),
])
def test_keys_that_collide_or_are_empty_are_start_up_errors(server: dict[str, Any], needle: str) -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings(Settings, server=server)
    assert needle in str(exc.value)
    assert "'k'" not in str(exc.value)  # the key itself is never printed


def test_an_empty_key_from_the_environment_is_refused(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROUTERAG_SERVER__API_KEY", "")  # ROUTERAG_SERVER__API_KEY=$UNSET_VARIABLE
    with pytest.raises(SettingsError, match="server.api_key: empty"):
        load_settings(Settings)
    monkeypatch.delenv("ROUTERAG_SERVER__API_KEY")
    config = tmp_path / "auth.toml"
    config.write_text('[server]\napi_key = "same"\nadmin_key = "same"\n')
    run = subprocess.run([sys.executable, "-m", "routerag.cli", "mcp", str(tmp_path / "nothing-here"), "--transport",
                          "streamable-http", "--config", str(config)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode != 0 and "server.admin_key is the same key as server.api_key" in run.stderr, run.stderr


# -- 2 and 8. MCP over streamable HTTP: the keys and the limits of REST ---------------------------------------------------


def mcp_client(url: str, key: str | None) -> Any:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=120)


def test_mcp_over_http_takes_the_servers_keys_and_limits(index: Path, retriever: Retriever, tmp_path: Path,
                                                         minilm) -> None:
    from .helpers.curie_index import build_curie_index
    from server.mcp_tools import create_mcp, mcp_http_app

    other = build_curie_index(tmp_path, minilm) / "idx"
    settings = Settings(server={"api_key": "reader", "index_keys": [{"key": "only-twohop", "indexes": ["twohop"]}]})
    policy = RoutingPolicy("[graph]")
    engines = {"twohop": Engine(index, settings, generator=policy, retriever=retriever),
               "curie": Engine(other, settings, generator=policy,
                               retriever=Retriever(other, RetrievalConfig(), embedder=minilm))}
    for e in engines.values():
        e.warm_up()
    app = mcp_http_app(create_mcp(engines, settings), settings, engines)

    async def call(url: str, key: str | None, tool: str, args: dict[str, Any]) -> Any:
        async with mcp_client(url, key) as client:
            return await client.call_tool(tool, args)

    with live_server(app, lifespan="on") as url:
        for key in (None, "wrong"):  # refused at the door: the session never opens
            with pytest.raises(Exception):  # (the SDK reports the HTTP error as its own)
                asyncio.run(call(url, key, "search", {"query": Q, "index": "twohop"}))
            assert httpx.post(f"{url}/mcp", json={}, headers={"Authorization": f"Bearer {key}"} if key else {}
                              ).status_code == 401
        found = asyncio.run(call(url, "reader", "search", {"query": Q, "mode": "graph", "k": 2, "index": "twohop"}))
        assert not found.is_error and found.structured_content["documents"][0]["title"] == "Joran Veld"
        answered = asyncio.run(call(url, "reader", "ask", {"question": "Where was Marie Curie born?", "index": "curie"}))
        assert not answered.is_error and answered.structured_content["finish"] == "answer", answered.content
        mine = asyncio.run(call(url, "only-twohop", "ask", {"question": Q}))  # its one index needs no naming
        assert not mine.is_error and mine.structured_content["answer"] == "Joran Veld"
        hidden = asyncio.run(call(url, "only-twohop", "search", {"query": "Warsaw", "index": "curie"}))
        unknown = asyncio.run(call(url, "only-twohop", "search", {"query": "Warsaw", "index": "nope"}))
        assert hidden.is_error and unknown.is_error
        assert hidden.content[0].text.replace("'curie'", "'nope'") == unknown.content[0].text
        assert "Warsaw" not in hidden.content[0].text and "curie" not in hidden.content[0].text.replace("'curie'", "")
        async def over_limits() -> tuple[Any, Any, float]:
            async with mcp_client(url, "reader") as client:
                t0 = time.perf_counter()
                long = await client.call_tool("ask", {"question": "why " * 7500, "index": "twohop"})  # 30,000 chars
                seconds = time.perf_counter() - t0
                return long, await client.call_tool("search", {"query": "q" * 4001, "index": "twohop"}), seconds

        calls = policy.calls
        long, query, seconds = asyncio.run(over_limits())
        assert long.is_error and "at most 2000 characters" in long.content[0].text, long.content
        assert query.is_error and "at most 4000 characters" in query.content[0].text, query.content
        assert policy.calls == calls, seconds  # refused before the policy ran


# -- 6. a lone passage object --------------------------------------------------------------------------------------------


def test_a_lone_passage_object_is_refused_not_read_as_hotpotqa(own_index: Path, minilm, spacy_extractor) -> None:
    app = make_app(own_index, minilm, spacy_extractor)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/documents", json={"title": "a", "text": "b"})
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert "one passage object" in message and "JSON list" in message and str(own_index) not in message
        assert c.get("/jobs").json() == []
        # the legitimate layouts still go through: a JSON list, and HotpotQA's {title: sentences}
        for body in ([PASSAGE], {"Orvel Bridge": ["The Orvel Bridge spans the Pell. ", "It was built of amber."]}):
            r = c.post("/documents", json=body)
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 120
            while (job := c.get(f"/jobs/{r.json()['job']}").json())["state"] not in ("done", "failed"):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert job["state"] == "done" and job["counts"]["added"] == 1, job


# -- 7. an abandoned chat completion, and SIGTERM with requests in flight ---------------------------------------------------


def test_an_abandoned_chat_completion_is_cancelled_like_ask(index: Path, retriever: Retriever) -> None:
    policy = RoutingPolicy(delay_s=1.5)  # each turn takes 1.5 s; the answer needs two
    settings = Settings(server={"max_inflight": 1})
    app = create_app(Engine(index, settings, generator=policy, retriever=retriever), settings)
    with live_server(app) as url:
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=url, timeout=0.5) as c:
            c.post("/v1/chat/completions", json={"model": "idx", "messages": [{"role": "user", "content": Q}]})
        time.sleep(2.5)  # past where a second turn would have started
        assert policy.calls == 1
        metrics = httpx.get(f"{url}/metrics").text
        # its one slot is free again: the next request is served, not refused
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "idx", "messages": [{"role": "user",
                                                                                            "content": Q}]}, timeout=30)
        assert r.status_code == 200, r.text
    assert 'routerag_request_errors_total{route="/v1/chat/completions",type="client_disconnected"} 1.0' in metrics
    assert 'routerag_http_requests_total{method="POST",route="/v1/chat/completions",status="499"} 1.0' in metrics
    assert 'routerag_admission_in_flight{route="/ask"} 0.0' in metrics


def test_sigterm_with_requests_in_flight_prints_no_traceback(index: Path, tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.slow_server", str(index), str(port)], cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(proc, url, log)
        statuses: list[Any] = []

        def ask(path: str, body: dict[str, Any]) -> None:
            try:
                statuses.append(httpx.post(f"{url}{path}", json=body, timeout=30).status_code)
            except httpx.HTTPError as exc:
                statuses.append(type(exc).__name__)

        chat = {"model": "idx", "messages": [{"role": "user", "content": Q}]}
        threads = [threading.Thread(target=ask, args=args) for args in
                   [("/ask", {"question": Q})] * 3 + [("/v1/chat/completions", chat)] * 3]
        for t in threads:
            t.start()
        time.sleep(1.0)  # all six are in the policy's first (slow) turn
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # (uvicorn ends by raising the signal it handled)
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text
    assert len(statuses) == 6 and all(s in (503, "RemoteProtocolError", "ReadError") for s in statuses), statuses


# -- 10 and the wording ----------------------------------------------------------------------------------------------------


def test_the_retrieve_503_names_its_own_settings() -> None:
    from server.admission import Gate, Overloaded, retrieve_limits

    async def go() -> str:
        gate = Gate("/retrieve", retrieve_limits(Settings(server={"retrieve_max_inflight": 1,
                                                                  "retrieve_max_queue": 0})))
        deadline = asyncio.get_running_loop().time() + 60
        await gate.acquire(deadline)
        with pytest.raises(Overloaded) as exc:
            await gate.acquire(deadline)
        return exc.value.message

    message = asyncio.run(go())
    assert "server.retrieve_max_inflight" in message and "server.retrieve_max_queue" in message
    assert "server.max_inflight" not in message


def test_error_wording(index: Path, retriever: Retriever, tmp_path: Path) -> None:
    settings = Settings()
    app = create_app(Engine(index, settings, generator=RoutingPolicy(), retriever=retriever), settings)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        deep = b"[" * 20_000 + b"]" * 20_000
        r = c.post("/retrieve", content=b'{"queries": ' + deep + b"}", headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "nested too deeply" in r.json()["error"]["message"], r.text
        r = c.post("/retrieve", json={"queries": ["q" * 4001]})
        assert r.status_code == 422 and "at most 4000 characters" in r.json()["error"]["message"], r.text
        r = c.post("/ask", json={"question": "q" * 2001})
        assert r.status_code == 422 and "at most 2000 characters" in r.json()["error"]["message"], r.text

    from graph_index.corpus import CorpusError, load_corpus

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"title": "a", "text": "line\nbreak"}\n')
    with pytest.raises(CorpusError) as exc:
        load_corpus([bad])
    assert "at at" not in str(exc.value) and "at column" in str(exc.value)


def test_a_failed_job_does_not_show_the_servers_paths(own_index: Path, tmp_path: Path, minilm,
                                                     spacy_extractor) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(own_index.parent, copy, symlinks=True, ignore=shutil.ignore_patterns("cache"))
    index = copy / own_index.name
    app = make_app(index, minilm, spacy_extractor)
    (index.resolve() / "manifest.json").write_text("{ truncated")  # the index is damaged under the server
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/documents", json=[PASSAGE])
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 120
        while (job := c.get(f"/jobs/{r.json()['job']}").json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert job["state"] == "failed" and job["error"], job
    assert str(tmp_path) not in job["error"] and "/tmp" not in job["error"], job["error"]
    assert "manifest.json" in job["error"]
