"""Prometheus metrics of one app, in a registry of its own (never the process-global one), so several apps (tests,
benchmarks, one server per index) can live in one process without clashing or double counting."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: 1 ms (a cached retrieval) to 2 minutes (a long policy trajectory on a CPU).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TIMED_ROUTES = ("/ask", "/retrieve")


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("routerag_http_requests", "HTTP requests by route, method and status code.",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("routerag_request_duration_seconds",
                                 "Latency of /ask and /retrieve until the last byte of the response (streams "
                                 "included).", ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("routerag_requests_in_flight", "Requests being served, by route.", ["route"],
                               registry=r)
        self.searches = Counter("routerag_searches", "Searches by retrieval mode; source=ask: chosen in the policy "
                                "loop, source=retrieve: /retrieve queries.", ["mode", "source"], registry=r)
        self.finish = Counter("routerag_ask_finish", "Finished /ask trajectories by how they ended (answer, "
                              "forced_answer, no_answer, error).", ["finish"], registry=r)
        self.errors = Counter("routerag_request_errors", "/ask and /retrieve requests the engine failed, by error "
                              "type (timeout, invalid_query, backend_error, invalid_request).",
                              ["route", "type"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts every response (including those the auth and body-limit guards send) and times /ask and /retrieve
    until the response's last byte. Routes are labelled by their path; unknown paths are folded into ``other`` so
    a scanner cannot blow up the label set."""

    def __init__(self, app: ASGIApp, *, metrics: ServerMetrics, paths: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.metrics = metrics
        self._paths_source = paths
        self._paths: frozenset[str] | None = None

    def _label(self, scope: Scope) -> str:
        if self._paths is None:
            self._paths = frozenset(self._paths_source())
        path = scope.get("path", "")
        return path if path in self._paths else "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self._label(scope)
        status = 500  # if the app raises before answering, the server error handler answers 500
        timed = route in TIMED_ROUTES

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        t0 = time.perf_counter()
        gauge = self.metrics.in_flight.labels(route)
        gauge.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            gauge.dec()
            self.metrics.requests.labels(route, scope.get("method", ""), str(status)).inc()
            if timed:
                self.metrics.latency.labels(route).observe(time.perf_counter() - t0)
