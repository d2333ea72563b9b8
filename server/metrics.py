"""Prometheus metrics of one app, in a registry of its own (never the process-global one), so several apps (tests,
benchmarks, one server per index) can live in one process without clashing or double counting."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

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
        self.searches = Counter("routerag_searches", "Searches by retrieval mode and index; source=ask: chosen in the "
                                "policy loop (/ask and /v1/chat/completions), source=retrieve: /retrieve queries.",
                                ["mode", "source", "index"], registry=r)
        self.finish = Counter("routerag_ask_finish", "Finished trajectories by how they ended (answer, refused, "
                              "forced_answer, no_answer, error), by index.", ["finish", "index"], registry=r)
        self.index_requests = Counter("routerag_index_requests", "Requests that reached an index, by index and route.",
                                      ["index", "route"], registry=r)
        self.index_passages = Gauge("routerag_index_passages", "Passages in the served version, by index.", ["index"],
                                    registry=r)
        self.index_memory = Gauge("routerag_index_memory_bytes", "The served version's loaded search structures, by "
                                  "index (not the shared models).", ["index"], registry=r)
        self.jobs = Counter("routerag_ingestion_jobs", "Finished ingestion jobs by index, operation and state (done, "
                            "failed).", ["index", "op", "state"], registry=r)
        self.errors = Counter("routerag_request_errors", "/ask and /retrieve requests that did not get their answer, "
                              "by error type (timeout, invalid_query, backend_error, overloaded, "
                              "client_disconnected).", ["route", "type"], registry=r)
        # admission control (server/admission.py)
        self.admission_running = Gauge("routerag_admission_in_flight", "Requests holding an admission slot (running), "
                                       "by route.", ["route"], registry=r)
        self.admission_queued = Gauge("routerag_admission_queue_depth", "Requests waiting for an admission slot, by "
                                      "route.", ["route"], registry=r)
        self.admission_limit = Gauge("routerag_admission_limit", "The admission bounds, by route and kind (in_flight, "
                                     "queue).", ["route", "kind"], registry=r)
        self.refused = Counter("routerag_admission_refused", "Requests refused with 503 by admission control, by route "
                               "and reason (queue_full; deadline: it could not finish within the request timeout).",
                               ["route", "reason"], registry=r)
        self.service_estimate = Gauge("routerag_admission_service_seconds", "The service time admission control "
                                      "plans with: the moving average of recent durations plus twice their average "
                                      "deviation, by route.", ["route"], registry=r)

    def render(self, visible: Callable[[str], bool] | None = None) -> bytes:
        """The exposition; with ``visible``, without the samples of the indexes it refuses (a key limited to some
        indexes does not learn the others' names, sizes or traffic)."""
        if visible is None:
            return generate_latest(self.registry)
        return generate_latest(_Visible(self.registry, visible))  # type: ignore[arg-type]


class _Visible:
    """A registry's metrics without the samples labelled with an index ``visible`` refuses."""

    def __init__(self, registry: CollectorRegistry, visible: Callable[[str], bool]) -> None:
        self.registry, self.visible = registry, visible

    def collect(self) -> Iterable[Any]:
        for family in self.registry.collect():  # fresh objects on every collect: ours to change
            family.samples = [s for s in family.samples if "index" not in s.labels or self.visible(s.labels["index"])]
            yield family


#: Set in the request scope's ``state`` by a route that learns, after its response started, that the client left
#: (a dropped event stream): the request is then counted with this status instead of the 200 it started with.
DISCONNECTED_STATE = "routerag_client_disconnected"
CLIENT_CLOSED = 499  # nginx's "client closed request"


class MetricsMiddleware:
    """Counts every response (including those the auth and body-limit guards send) and times /ask and /retrieve
    until the response's last byte. Routes are labelled by their path; unknown paths are folded into ``other`` so
    a scanner cannot blow up the label set. A stream whose client left midway counts as 499, not as the 200 its
    headers said."""

    def __init__(self, app: ASGIApp, *, metrics: ServerMetrics, paths: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.metrics = metrics
        self._paths_source = paths
        self._paths: frozenset[str] | None = None
        self._templates: list[tuple[re.Pattern[str], str]] = []

    def _label(self, scope: Scope) -> str:
        """The route's path, its template for a path with parameters (``/jobs/{job_id}``), else ``other``."""
        if self._paths is None:
            paths = frozenset(self._paths_source())
            self._templates = [(re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(p)) + "$"), p)
                               for p in paths if "{" in p]
            self._paths = paths
        path = scope.get("path", "")
        if path in self._paths:
            return path
        return next((template for pattern, template in self._templates if pattern.match(path)), "other")

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
            if scope.get("state", {}).get(DISCONNECTED_STATE):
                status = CLIENT_CLOSED
            self.metrics.requests.labels(route, scope.get("method", ""), str(status)).inc()
            if timed:
                self.metrics.latency.labels(route).observe(time.perf_counter() - t0)
