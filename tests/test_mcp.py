"""The MCP server (server/mcp_tools.py, ``routerag mcp``) through the official MCP SDK's own client: in process with a
scripted policy (the tools' contract, errors), and as a real ``routerag mcp`` subprocess over stdio."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.mcp_tools import create_mcp, tool_names

from .helpers.server_helpers import RoutingPolicy

Q = "Where was Joran Veld born?"


def structured(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def test_search_and_ask_through_the_sdk_client(index: Path, retriever: Retriever) -> None:
    settings = Settings()
    engine = Engine(index, settings, generator=RoutingPolicy("[graph]"), retriever=retriever)
    engine.warm_up()
    srv = create_mcp(engine, settings)
    assert tool_names(srv) == ["search", "ask"]  # the CLI's start-up line, before any event loop runs

    async def go() -> None:
        async with Client(srv) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"search", "ask"}
            assert tools["search"].input_schema["properties"]["mode"]["enum"] == ["passage", "graph", "hybrid"]
            found = structured(await client.call_tool("search", {"query": Q, "mode": "graph", "k": 2}))
            direct = retriever.search([Q], mode="graph", k=2)[0]
            assert [d["id"] for d in found["documents"]] == [d.id for d in direct.docs] and found["mode"] == "graph"
            answered = structured(await client.call_tool("ask", {"question": Q}))
            assert answered["finish"] == "answer" and answered["searches"] == 1
            assert answered["answer"] == direct.docs[0].title  # the scripted policy answers with the first title
            assert [s["action"] for s in answered["trace"]] == ["search", "answer"]
            for bad, needle in (({"query": Q, "k": 0}, "server.max_k"), ({"query": "   "}, "empty"),
                                ({"query": Q, "mode": "vector"}, "mode")):
                res = await client.call_tool("search", bad)
                assert res.is_error and needle in json.dumps([c.model_dump() for c in res.content]), (bad, res)
            res = await client.call_tool("ask", {"question": ""})
            assert res.is_error and "empty" in res.content[0].text

    asyncio.run(go())


def test_tools_pass_admission_a_burst_beyond_the_bounds_is_refused_at_once(index: Path, retriever: Retriever) -> None:
    """One ask in flight and none queued (``server.max_inflight`` 1, ``max_queue`` 0): of three concurrent asks, one
    runs and two are refused with a tool error naming the limits, before the policy sees them; search has its own gate,
    so it still answers meanwhile."""
    settings = Settings(server={"max_inflight": 1, "max_queue": 0})
    policy = RoutingPolicy("[graph]", delay_s=0.5)
    engine = Engine(index, settings, generator=policy, retriever=retriever)
    engine.warm_up()
    srv = create_mcp(engine, settings)

    async def go() -> tuple[list, object, int]:
        async with Client(srv) as client:
            await client.call_tool("ask", {"question": Q})  # how many generations one ask takes
            per_ask, policy.calls = policy.calls, 0
            results = await asyncio.gather(*[client.call_tool("ask", {"question": Q}) for _ in range(3)],
                                           client.call_tool("search", {"query": Q, "k": 2}))
            return list(results[:3]), results[3], per_ask

    asks, found, per_ask = asyncio.run(go())
    refused = [r for r in asks if r.is_error]
    assert len(refused) == 2 and sum(not r.is_error for r in asks) == 1, [r.content for r in asks]
    assert all("overloaded" in r.content[0].text and "server.max_inflight" in r.content[0].text for r in refused)
    assert policy.calls == per_ask  # only the admitted ask ran
    assert not found.is_error and len(found.structured_content["documents"]) == 2


def test_routerag_mcp_over_stdio_answers_the_sdk_client(index: Path, retriever: Retriever) -> None:
    """The real command as a desktop client would launch it: tools listed, a search answered, logs on stderr only."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "routerag.cli", "mcp", str(index)])

    async def go() -> dict:
        async with Client(params, read_timeout_seconds=120) as client:
            assert {t.name for t in (await client.list_tools()).tools} == {"search", "ask"}
            return structured(await client.call_tool("search", {"query": Q, "mode": "hybrid", "k": 3}))

    found = asyncio.run(go())
    assert [d["id"] for d in found["documents"]] == [d.id for d in retriever.search([Q], mode="hybrid", k=3)[0].docs]


def test_routerag_mcp_over_streamable_http_answers_the_sdk_client(index: Path, retriever: Retriever,
                                                                   tmp_path: Path) -> None:
    """``--transport streamable-http --config auth.toml``: a real server process on 127.0.0.1 that takes the config's
    key (issue 34: it used to serve anyone), the SDK's client by URL with the key."""
    import subprocess
    import time

    import httpx

    from .helpers.fake_openai import free_port

    port = free_port()
    log = open(tmp_path / "mcp.log", "w")
    config = tmp_path / "auth.toml"
    config.write_text('[server]\napi_key = "mcp-key"\n')
    proc = subprocess.Popen([sys.executable, "-m", "routerag.cli", "mcp", str(index), "--transport", "streamable-http",
                             "--port", str(port), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:  # up once the port accepts connections
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "mcp.log").read_text()
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.5)

        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        def connect(key: str | None) -> Client:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"} if key else {},
                                      timeout=httpx2.Timeout(30, read=120))
            return Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http),
                          read_timeout_seconds=120)

        async def go(key: str | None) -> dict:
            async with connect(key) as client:
                return structured(await client.call_tool("search", {"query": Q, "mode": "graph", "k": 2}))

        for key in (None, "wrong"):
            try:
                asyncio.run(go(key))
            except Exception:  # (the SDK reports the 401 as its own error)
                pass
            else:
                raise AssertionError(f"a client with key {key!r} was served")
        refused = httpx.post(f"http://127.0.0.1:{port}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        found = asyncio.run(go("mcp-key"))
        assert [d["id"] for d in found["documents"]] == [d.id for d in retriever.search([Q], mode="graph", k=2)[0].docs]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
