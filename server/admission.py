"""Admission control: a bound on the work a route runs at once and on the requests waiting for it.

Without one, every request is admitted, the model's batches grow, every request slows down together and all of
them time out (16 concurrent ``/ask`` on a CPU: 9 of 16 past a 120 s timeout). With one, at most ``max_inflight``
run, at most ``max_queue`` wait in arrival order, and anything beyond is refused at once with 503 and a
``Retry-After``, so clients can back off or go to another replica while the admitted requests still finish.

A queued request is also refused early, not timed out late: the service time of the route is estimated from a
moving average of its recent durations, and a request that would not finish by its deadline (its arrival plus
``server.request_timeout_s``) is refused when it arrives, or, if the estimate was too hopeful, as soon as its latest
useful start passes while it still waits (re-read as the estimate moves, so a cold start, with nothing measured
yet, or a slowdown measured while it waits refuses it then). The plan is pessimistic, the average plus twice the average deviation (as
TCP plans its retransmission timeout): with the plain average, the last requests admitted to a full queue finished
within a few seconds of their timeout in the soak benchmark.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from routerag.batching import MicroBatcher
from routerag.config import Settings

Reason = Literal["queue_full", "deadline"]
RECHECK_S = 0.5
"""How often a queued request re-reads the service estimate to see whether it can still finish in time."""


class Overloaded(Exception):
    """Refused by admission control; ``retry_after_s`` is when a slot is expected to be free."""

    def __init__(self, reason: Reason, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_after_s = reason, message, retry_after_s


class MovingAverage:
    """Exponentially weighted moving average and mean absolute deviation of recent durations (RFC 6298's smoothed
    RTT and RTT variation): recent durations count most, so the estimate follows a change of load (a longer question
    mix, a busier machine) within a few requests."""

    def __init__(self, alpha: float = 0.2, beta: float = 0.25) -> None:
        self.alpha, self.beta = alpha, beta
        self.value: float | None = None
        self.deviation = 0.0

    def observe(self, x: float) -> None:
        if self.value is None:
            self.value, self.deviation = x, x / 2
            return
        self.deviation += self.beta * (abs(x - self.value) - self.deviation)
        self.value += self.alpha * (x - self.value)

    def pessimistic(self) -> float | None:
        """The duration to plan with: the average plus twice the deviation (None before the first sample)."""
        return None if self.value is None else self.value + 2 * self.deviation


@dataclass
class Limits:
    max_inflight: int
    max_queue: int
    settings: tuple[str, str] = ("server.max_inflight", "server.max_queue")
    """The settings that set the two bounds, named by a refusal so the operator knows which to raise."""


class Slot:
    """A held place in flight. ``release`` is idempotent, so every exit path may call it; ``served`` feeds the
    duration into the service-time estimate (only runs that went to completion or to their timeout do: an error or
    a client that left says nothing about how long service takes)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.t0 = asyncio.get_running_loop().time()
        self.released = False

    def release(self, served: bool = False) -> None:
        if self.released:
            return
        self.released = True
        if served:
            self.gate.service.observe(asyncio.get_running_loop().time() - self.t0)
        self.gate._free()


class Gate:
    """The admission bound of one route. Single event loop, no locks: every method runs on the loop."""

    def __init__(self, route: str, limits: Limits, metrics: Any = None) -> None:
        self.route = route
        self.max_inflight = limits.max_inflight
        self.max_queue = limits.max_queue
        self.settings = limits.settings
        self.inflight = 0
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.service = MovingAverage()
        self.metrics = metrics
        self._publish()

    # -- the estimate -----------------------------------------------------------------------------------------------

    def planned_service_s(self) -> float:
        """The pessimistic service time (0 while nothing has been measured yet)."""
        return self.service.pessimistic() or 0.0

    def expected_wait_s(self, position: int) -> float:
        """Seconds until the request at queue ``position`` (0 = next) starts: a slot frees every
        ``service / max_inflight`` seconds."""
        return (position + 1) * self.planned_service_s() / self.max_inflight

    def retry_after_s(self) -> int:
        """Whole seconds (as ``Retry-After`` wants) until the queue has room again; at least 1."""
        return max(1, math.ceil(self.expected_wait_s(len(self.waiters))))

    # -- acquiring and releasing --------------------------------------------------------------------------------------

    def try_acquire(self) -> Slot | None:
        """A slot if one is free and nobody is waiting for it, else None (then :meth:`acquire` waits in line)."""
        if self.inflight < self.max_inflight and not self.waiters:
            self.inflight += 1
            self._publish()
            return Slot(self)
        return None

    async def acquire(self, deadline: float) -> Slot:
        """A slot, now or after waiting in line; :class:`Overloaded` if the line is full or the request cannot
        finish by ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        free = self.try_acquire()
        if free is not None:
            return free
        if len(self.waiters) >= self.max_queue:
            self._refuse("queue_full", f"{self.inflight} requests in flight and {len(self.waiters)} queued (the "
                                       f"limits {self.settings[0]} and {self.settings[1]}); retry later")
        s = self.planned_service_s()
        if loop.time() + self.expected_wait_s(len(self.waiters)) + s > deadline:
            self._refuse("deadline", self._late_message())
        fut: asyncio.Future[None] = loop.create_future()
        self.waiters.append(fut)
        self._publish()
        try:
            # wait until the latest start that can still finish in time, by the estimate as it stands *now*: it is
            # re-read every RECHECK_S, so a first measurement (none at a cold start) or a slowdown measured while
            # this request waits moves its latest start, and it is refused then rather than timed out later
            while not fut.done():
                latest_start = deadline - self.planned_service_s()
                if loop.time() >= latest_start:
                    break
                await asyncio.wait({fut}, timeout=min(RECHECK_S, latest_start - loop.time()))
        except asyncio.CancelledError:
            self._leave(fut)
            raise
        if not fut.done():
            self._leave(fut)
            self._refuse("deadline", self._late_message())
        return Slot(self)  # a freed slot was handed over: inflight already counts it

    def _leave(self, fut: asyncio.Future[None]) -> None:
        """A waiter gives up its place; a slot handed to it just as it left goes to the next one."""
        if fut.done() and not fut.cancelled():
            self._free()
        else:
            fut.cancel()
            self._drop(fut)

    def _free(self) -> None:
        """A slot came free: hand it to the first live waiter, or count it free."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._publish()
                return
        self.inflight -= 1
        self._publish()

    def _drop(self, fut: asyncio.Future[None]) -> None:
        try:
            self.waiters.remove(fut)
        except ValueError:
            pass
        self._publish()

    def _late_message(self) -> str:
        s = self.service.value or 0.0
        return (f"the queue ({len(self.waiters)} waiting, {self.inflight} in flight, about {s:.1f} s each) would not "
                "let this request finish within server.request_timeout_s; retry later")

    def _refuse(self, reason: Reason, message: str) -> None:
        if self.metrics is not None:
            self.metrics.refused.labels(self.route, reason).inc()
        raise Overloaded(reason, message, self.retry_after_s())

    def _publish(self) -> None:
        if self.metrics is not None:
            self.metrics.admission_running.labels(self.route).set(self.inflight)
            self.metrics.admission_queued.labels(self.route).set(sum(not f.done() for f in self.waiters))
            if self.service.value is not None:
                self.metrics.service_estimate.labels(self.route).set(self.planned_service_s())


# -- the default bounds -----------------------------------------------------------------------------------------------


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _on_cpu(generator: Any) -> bool:
    model = getattr(generator, "model", None)
    try:
        return next(model.parameters()).device.type == "cpu"  # type: ignore[union-attr]
    except (AttributeError, StopIteration, TypeError):
        return False


def ask_limits(settings: Settings, generator: Any) -> Limits:
    """``/ask``'s bounds: ``server.max_inflight`` and ``server.max_queue``, or the defaults for the backend.

    An in-process model (one whose requests go through a :class:`MicroBatcher`) generates ``max_batch`` requests
    together, so that many run at once; on a CPU, at most one per usable core, because a wider batch there only
    makes every request slower without adding throughput. A remote or self-batching backend (an OpenAI-compatible
    server, vLLM's engine) takes ``policy.generator.max_concurrency``. The queue holds 4 × that."""
    cfg = settings.server
    inflight = cfg.max_inflight
    if inflight is None:
        batcher = getattr(generator, "batcher", None)
        if isinstance(batcher, MicroBatcher):
            inflight = min(batcher.max_batch, usable_cpus()) if _on_cpu(generator) else batcher.max_batch
        else:
            inflight = settings.policy.generator.max_concurrency
    queue = cfg.max_queue if cfg.max_queue is not None else 4 * inflight
    return Limits(max(1, inflight), queue)


def retrieve_limits(settings: Settings) -> Limits:
    """``/retrieve``'s bounds: ``server.retrieve_max_inflight`` (default: the usable cores, at least 2) and
    ``server.retrieve_max_queue`` (default: 16 × that, since a search takes milliseconds)."""
    cfg = settings.server
    inflight = cfg.retrieve_max_inflight or max(2, usable_cpus())
    queue = cfg.retrieve_max_queue if cfg.retrieve_max_queue is not None else 16 * inflight
    return Limits(inflight, queue, ("server.retrieve_max_inflight", "server.retrieve_max_queue"))
