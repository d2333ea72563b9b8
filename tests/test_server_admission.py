"""Admission control under overload (server/admission.py and its use in the app): bounded work in flight and queued,
immediate 503s with Retry-After beyond the bound, early refusal of queued requests that could not finish in time,
and what /metrics shows of it. A slow scripted policy makes overload cheap and deterministic."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.admission import Gate, Limits, Overloaded, ask_limits, retrieve_limits
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy

Q = "Where was Joran Veld born?"


def make_app(index: Path, retriever: Retriever, policy: Any, **server: Any):
    settings = Settings(server=server)
    engine = Engine(index, settings, generator=policy, retriever=retriever)
    engine.warm_up()
    return create_app(engine, settings)


async def timed_posts(app, bodies: list[dict[str, Any]], path: str = "/ask") -> list[tuple[httpx.Response, float]]:
    """Send every body at once; each response with its own latency in seconds."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost", timeout=60) as c:
        async def one(body: dict[str, Any]) -> tuple[httpx.Response, float]:
            t = time.perf_counter()
            r = await c.post(path, json=body)
            return r, time.perf_counter() - t

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def test_overload_gets_fast_503s_with_retry_after_and_no_504(index: Path, retriever: Retriever) -> None:
    # a model that generates one turn at a time, 0.2 s each; an answer takes two turns. Ten concurrent questions are
    # 4 s of work against a 3 s timeout: admitted all at once they slow each other down until half of them time out
    bodies = [{"question": f"{Q} ({i})", "stream": i % 3 == 0} for i in range(10)]
    unbounded = make_app(index, retriever, RoutingPolicy(delay_s=0.2, serial=True), max_inflight=64, max_queue=0,
                         request_timeout_s=3)
    codes = [r.status_code for r, _ in asyncio.run(timed_posts(unbounded, [{"question": b["question"]}
                                                                           for b in bodies]))]
    assert codes.count(504) >= 3, codes

    # with one in flight and three queued, the other six are refused at once and every admitted one finishes. The
    # deadline is long here so that only the bound refuses: with 3 s, a loaded machine (a CI run beside training
    # jobs) made the gate's measured service time long enough that it also refused queued requests that could not
    # finish in time, which is the next test's subject, with the gate's estimate seeded
    app = make_app(index, retriever, RoutingPolicy(delay_s=0.2, serial=True), max_inflight=1, max_queue=3,
                   request_timeout_s=30)

    async def go() -> tuple[list[tuple[httpx.Response, float]], str]:
        results = await timed_posts(app, bodies)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            return results, (await c.get("/metrics")).text

    results, metrics = asyncio.run(go())
    codes = sorted(r.status_code for r, _ in results)
    assert codes == [200] * 4 + [503] * 6, codes
    first_answer_s = min(lat for r, lat in results if r.status_code == 200)
    for r, latency in results:
        if r.status_code == 503:  # refused at once (before the queue moved), as JSON even when a stream was asked for
            assert latency < first_answer_s, (latency, first_answer_s)
            assert r.json() == {"error": {"type": "overloaded", "message": r.json()["error"]["message"], "param": None,
                                          "code": None}}
            assert "server.max_inflight" in r.json()["error"]["message"]
            assert int(r.headers["retry-after"]) >= 1
        elif r.headers["content-type"].startswith("text/event-stream"):
            assert "event: done" in r.text  # an admitted stream ends with its answer, not a timeout event
    assert max(lat for r, lat in results if r.status_code == 200) > 1.2  # the queued ones waited for the slot
    for line in ['routerag_admission_refused_total{reason="queue_full",route="/ask"} 6.0',
                 'routerag_request_errors_total{route="/ask",type="overloaded"} 6.0',
                 'routerag_http_requests_total{method="POST",route="/ask",status="503"} 6.0',
                 'routerag_http_requests_total{method="POST",route="/ask",status="200"} 4.0',
                 'routerag_admission_in_flight{route="/ask"} 0.0',
                 'routerag_admission_queue_depth{route="/ask"} 0.0',
                 'routerag_admission_limit{kind="in_flight",route="/ask"} 1.0',
                 'routerag_admission_limit{kind="queue",route="/ask"} 3.0']:
        assert line in metrics, line
    assert 'status="504"' not in metrics and "routerag_admission_service_seconds" in metrics


def test_a_queued_request_that_cannot_finish_in_time_is_refused_at_once(index: Path, retriever: Retriever) -> None:
    # one slot; an answer takes ~1 s (two 0.5 s turns). After two answers of 1 s the gate plans with 1.75 s (the
    # average plus twice its deviation, which starts at half the first sample; seeded here rather than measured, so
    # a busy machine cannot move the plan): with a 4.5 s timeout the first queued request can still finish (1.75 s
    # of wait + 1.75 s), the next ones cannot (3.5 + 1.75 s): they get a 503 at once, not a 504 later
    app = make_app(index, retriever, RoutingPolicy(delay_s=0.5), max_inflight=1, max_queue=10, request_timeout_s=4.5)
    assert asyncio.run(timed_posts(app, [{"question": Q}]))[0][0].status_code == 200  # starts the app
    gate = app.state.gates["/ask"]
    gate.service = type(gate.service)()
    for _ in range(2):
        gate.service.observe(1.0)
    assert gate.planned_service_s() == pytest.approx(1.75)
    results = asyncio.run(timed_posts(app, [{"question": f"{Q} ({i})"} for i in range(4)]))
    codes = [r.status_code for r, _ in results]
    assert sorted(codes) == [200, 200, 503, 503], codes
    # "at once" is judged against the work, not a wall-clock bound: a refusal lands before the first admitted answer
    # (~1 s of generation), where waiting for its latest start would take 2.75 s and a timeout 4.5 s. (A fixed 0.25 s
    # failed a CI run whose event loop stalled 0.9 s before the requests even reached the gate.)
    first_answer_s = min(lat for r, lat in results if r.status_code == 200)
    for r, latency in results:
        if r.status_code == 503:
            assert latency < first_answer_s and r.json()["error"]["type"] == "overloaded", (latency, first_answer_s)
            assert "request_timeout_s" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 2
    assert gate.inflight == 0 and not gate.waiters and gate.service.value == pytest.approx(1.0, abs=0.4)


def test_retrieve_has_its_own_bound(index: Path, retriever: Retriever) -> None:
    app = make_app(index, retriever, RoutingPolicy(), retrieve_max_inflight=1, retrieve_max_queue=0)

    async def go() -> list[tuple[httpx.Response, float]]:
        # hold the only /retrieve slot, as a long search would
        slot = await app.state.gates["/retrieve"].acquire(asyncio.get_running_loop().time() + 60)
        try:
            return await timed_posts(app, [{"queries": ["amber"]}], "/retrieve")
        finally:
            slot.release()

    [(r, _)] = asyncio.run(go())
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded" and r.headers["retry-after"]
    [(r, _)] = asyncio.run(timed_posts(app, [{"queries": ["amber"]}], "/retrieve"))
    assert r.status_code == 200


# -- the gate itself ---------------------------------------------------------------------------------------------------


def test_gate_refuses_a_waiter_when_its_latest_useful_start_passes() -> None:
    """A queued request whose deadline slips out of reach (the slot it waits for is not freed in time) is refused
    when its latest useful start (deadline minus the service estimate) passes, not at its deadline."""
    async def go() -> tuple[float, str]:
        gate = Gate("/ask", Limits(max_inflight=1, max_queue=4))
        gate.service.value, gate.service.deviation = 0.2, 0.0
        holder = await gate.acquire(asyncio.get_running_loop().time() + 60)
        t = time.perf_counter()
        with pytest.raises(Overloaded) as exc:  # expected: wait 0.2 + run 0.2 <= 0.5, so it queues
            await gate.acquire(asyncio.get_running_loop().time() + 0.5)
        waited = time.perf_counter() - t
        assert not gate.waiters and gate.inflight == 1
        holder.release()
        assert gate.inflight == 0
        return waited, exc.value.reason

    waited, reason = asyncio.run(go())
    assert reason == "deadline" and 0.25 < waited < 0.45


def test_gate_refuses_a_waiter_once_a_measurement_shows_it_cannot_finish() -> None:
    """At a cold start nothing is measured, so requests queue; when the first measurement arrives and shows a queued
    request cannot finish by its deadline, it is refused then (within one re-check), not timed out at its deadline.
    (The 30-minute soak timed out 2 requests admitted in its first seconds before this.)"""
    async def go() -> tuple[float, str]:
        gate = Gate("/ask", Limits(max_inflight=1, max_queue=4))
        loop = asyncio.get_running_loop()
        holder = await gate.acquire(loop.time() + 60)
        t = time.perf_counter()
        waiter = asyncio.ensure_future(gate.acquire(loop.time() + 1.5))
        await asyncio.sleep(0.2)
        assert not waiter.done() and len(gate.waiters) == 1  # nothing measured: it may wait
        gate.service.observe(0.9)  # the first answer took 0.9 s: the plan is 1.8 s, more than the 1.3 s left
        with pytest.raises(Overloaded) as exc:
            await waiter
        waited = time.perf_counter() - t
        assert not gate.waiters and gate.inflight == 1
        holder.release()
        return waited, exc.value.reason

    waited, reason = asyncio.run(go())
    assert reason == "deadline" and waited < 1.2


def test_gate_hands_slots_over_in_order_and_forgets_cancelled_waiters() -> None:
    async def go() -> list[str]:
        gate = Gate("/ask", Limits(max_inflight=1, max_queue=4))
        loop = asyncio.get_running_loop()
        order: list[str] = []
        first = await gate.acquire(loop.time() + 60)

        async def wait(name: str) -> None:
            slot = await gate.acquire(loop.time() + 60)
            order.append(name)
            await asyncio.sleep(0.01)
            slot.release(served=True)

        a = asyncio.ensure_future(wait("a"))
        gone = asyncio.ensure_future(wait("gone"))
        b = asyncio.ensure_future(wait("b"))
        await asyncio.sleep(0.01)
        assert len(gate.waiters) == 3
        gone.cancel()  # a client that left while queued
        await asyncio.sleep(0.01)
        first.release()
        await asyncio.gather(a, b)
        assert gate.inflight == 0 and not gate.waiters and gate.service.value is not None
        return order

    assert asyncio.run(go()) == ["a", "b"]


def test_default_bounds_follow_the_backend(tiny_generator) -> None:
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = ask_limits(Settings(), tiny_generator)  # in-process, on the CPU: the batch, capped at the cores
    assert cpu.max_inflight == min(tiny_generator.batcher.max_batch, cores) and cpu.max_queue == 4 * cpu.max_inflight
    remote = ask_limits(Settings(policy={"generator": {"backend": "openai", "max_concurrency": 48}}), object())
    assert (remote.max_inflight, remote.max_queue) == (48, 192)
    explicit = ask_limits(Settings(server={"max_inflight": 3, "max_queue": 0}), tiny_generator)
    assert (explicit.max_inflight, explicit.max_queue) == (3, 0)
    r = retrieve_limits(Settings())
    assert r.max_inflight == max(2, cores) and r.max_queue == 16 * r.max_inflight


@pytest.fixture(scope="module")
def tiny_generator():
    from routerag.config import GeneratorConfig
    from routerag.policy.backends.transformers_backend import TransformersGenerator
    from training.models import tiny_random_model

    model, tok = tiny_random_model(0)
    return TransformersGenerator(GeneratorConfig(model="tiny-random"), model=model, tokenizer=tok)
