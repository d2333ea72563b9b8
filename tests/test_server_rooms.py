"""The server's rooms (docs/architecture.md): admission, deadlines and disconnect cancellation are written once, in
server/service.py, and every route that runs the policy or the retriever goes through them: a client that leaves
while its /retrieve or streamed chat completion waits in the queue gives up its place (a 499, nothing run for it),
and /explain is bounded by a gate like the others. The shape the issue asked for is checked too: a short
create_app and no long function under server/."""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy, live_server

ROOT = Path(__file__).resolve().parents[1]
Q = "Where was Joran Veld born?"


class SlowRetriever:
    """The real retriever, each batched search ``delay_s`` slower (a big index under load); counts the searches."""

    def __init__(self, retriever: Retriever, delay_s: float) -> None:
        self._retriever, self.delay_s, self.searches = retriever, delay_s, 0

    def search(self, *args: Any, **kwargs: Any) -> Any:
        self.searches += 1
        time.sleep(self.delay_s)
        return self._retriever.search(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._retriever, name)


def _in_thread(fn: Any, started: Any) -> threading.Thread:
    """Run ``fn`` in a thread and return once ``started()`` says its work holds the slot (polled, not slept: a
    loaded machine may take a while to get there)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not started():
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    return thread


def test_a_retrieve_whose_client_leaves_while_queued_gives_up_its_place(index: Path, retriever: Retriever) -> None:
    slow = SlowRetriever(retriever, delay_s=3.0)
    settings = Settings(server={"retrieve_max_inflight": 1, "retrieve_max_queue": 2})
    app = create_app(Engine(index, settings, generator=RoutingPolicy(), retriever=slow), settings)
    first: list[int] = []
    with live_server(app) as url:
        holder = _in_thread(lambda: first.append(httpx.post(f"{url}/retrieve", json={"queries": ["amber"]},
                                                             timeout=30).status_code), lambda: slow.searches)
        with pytest.raises(httpx.ReadTimeout):  # queued behind the first search, which holds the only slot
            httpx.post(f"{url}/retrieve", json={"queries": ["Joran Veld"]}, timeout=1.0)
        holder.join(30)
        metrics = httpx.get(f"{url}/metrics").text
    assert first == [200] and slow.searches == 1  # the queued one never searched
    assert 'routerag_request_errors_total{route="/retrieve",type="client_disconnected"} 1.0' in metrics
    assert 'routerag_http_requests_total{method="POST",route="/retrieve",status="499"} 1.0' in metrics
    assert 'routerag_admission_queue_depth{route="/retrieve"} 0.0' in metrics
    assert 'routerag_admission_in_flight{route="/retrieve"} 0.0' in metrics


def test_a_streamed_chat_completion_whose_client_leaves_while_queued_never_runs(index: Path,
                                                                                retriever: Retriever) -> None:
    policy = RoutingPolicy(delay_s=2.0)  # each turn takes 2 s; an answer needs two
    settings = Settings(server={"max_inflight": 1})
    app = create_app(Engine(index, settings, generator=policy, retriever=retriever), settings)
    chat = {"model": "idx", "messages": [{"role": "user", "content": Q}]}
    first: list[int] = []
    with live_server(app) as url:
        holder = _in_thread(lambda: first.append(httpx.post(f"{url}/v1/chat/completions", json=chat,
                                                             timeout=30).status_code), lambda: policy.calls)
        with pytest.raises(httpx.ReadTimeout):  # queued behind the first answer, which holds the only slot
            httpx.post(f"{url}/v1/chat/completions", json={**chat, "stream": True}, timeout=1.0)
        holder.join(30)
        metrics = httpx.get(f"{url}/metrics").text
    assert first == [200] and policy.calls == 2  # the first answer's two turns; none for the one that left
    assert 'routerag_request_errors_total{route="/v1/chat/completions",type="client_disconnected"} 1.0' in metrics
    assert 'routerag_admission_queue_depth{route="/ask"} 0.0' in metrics
    assert 'routerag_admission_in_flight{route="/ask"} 0.0' in metrics


def test_explain_is_bounded_by_its_own_gate(index: Path, retriever: Retriever) -> None:
    settings = Settings()
    app = create_app(Engine(index, settings, generator=RoutingPolicy(), retriever=retriever), settings)
    body = {"query": "Joran Veld", "mode": "graph"}

    async def go() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=60) as c:
            gate = app.state.gates["/explain"]
            held = [await gate.acquire(asyncio.get_running_loop().time() + 60) for _ in range(gate.max_inflight)]
            refused = await c.post("/explain", json=body)
            for slot in held:
                slot.release()
            return refused, await c.post("/explain", json=body)

    refused, served = asyncio.run(go())
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "overloaded", refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert served.status_code == 200, served.text


def _functions(folder: str) -> list[tuple[int, str]]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.name}"))
    return found


def test_the_server_is_rooms_not_one_closure() -> None:
    lengths = dict((name, n) for n, name in _functions("server"))
    assert lengths["server/app.py:create_app"] < 100
    assert not [f for n, f in _functions("server") if n > 60], "split these: no server function over 60 lines"
