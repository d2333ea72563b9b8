"""The OpenAI-compatible chat endpoint, driven by the official ``openai`` client against a live server (and the MCP
SDK's client against a live streamable-HTTP MCP server): both get the answer with its citations."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy, live_server

Q = "Where was Joran Veld born?"


@pytest.fixture(scope="module")
def chat_url(index: Path, retriever: Retriever):
    settings = Settings(server={"api_key": "chat-key"})
    engine = Engine(index, settings, generator=RoutingPolicy("[graph]"), retriever=retriever)
    engine.warm_up()
    with live_server(create_app(engine, settings)) as url:
        yield url


def test_openai_client_lists_the_index_and_gets_an_answer_with_citations(chat_url: str, retriever: Retriever) -> None:
    client = openai.OpenAI(base_url=f"{chat_url}/v1", api_key="chat-key", max_retries=0)
    assert [m.id for m in client.models.list()] == ["idx"]
    first_title = retriever.search([Q], mode="graph", k=3)[0].docs[0].title
    done = client.chat.completions.create(model="idx", temperature=0.3, max_tokens=50, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": Q}])
    assert done.choices[0].message.content == first_title and done.choices[0].finish_reason == "stop"
    extra = done.model_extra["routerag"]
    assert extra["searches"] == 1 and [s["action"] for s in extra["trace"]] == ["search", "answer"]
    assert extra["trace"][0]["query"] == Q  # the last user message is the question
    assert extra["citations"] and extra["citations"][0]["title"] == first_title
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens > 0


def test_openai_client_streams_reasoning_then_the_answer(chat_url: str, retriever: Retriever) -> None:
    client = openai.OpenAI(base_url=f"{chat_url}/v1", api_key="chat-key", max_retries=0)
    chunks = list(client.chat.completions.create(model="idx", messages=[{"role": "user", "content": Q}],
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert text == retriever.search([Q], mode="graph", k=3)[0].docs[0].title
    assert f"[search graph] {Q}" in reasoning and "documents:" in reasoning
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].model_extra["routerag"]["citations"]


def test_chat_errors_reach_the_openai_client(chat_url: str) -> None:
    client = openai.OpenAI(base_url=f"{chat_url}/v1", api_key="chat-key", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="no index named 'gpt-4o'"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": Q}])
    with pytest.raises(openai.UnprocessableEntityError, match="no user message"):
        client.chat.completions.create(model="idx", messages=[{"role": "system", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{chat_url}/v1", api_key="wrong", max_retries=0).models.list()
    r = httpx.post(f"{chat_url}/v1/chat/completions", headers={"Authorization": "Bearer chat-key"},
                   json={"model": "idx", "messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 422 and "at most 2000" in r.text


def test_mcp_client_gets_an_answer_with_citations_from_a_live_server(index: Path, retriever: Retriever) -> None:
    from mcp.client.client import Client

    from server.mcp_tools import create_mcp

    settings = Settings()
    engine = Engine(index, settings, generator=RoutingPolicy("[graph]"), retriever=retriever)
    engine.warm_up()
    srv = create_mcp(engine, settings)
    with live_server(srv.streamable_http_app(), lifespan="on") as url:
        async def go() -> dict:
            async with Client(f"{url}/mcp", read_timeout_seconds=60) as client:
                result = await client.call_tool("ask", {"question": Q})
                assert not result.is_error, result.content
                return result.structured_content

        answered = asyncio.run(go())
    first_title = retriever.search([Q], mode="graph", k=3)[0].docs[0].title
    assert answered["answer"] == first_title and answered["citations"][0]["title"] == first_title
