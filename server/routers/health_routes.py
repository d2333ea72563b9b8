"""What a load balancer, an operator and Prometheus ask: ``GET /health`` (liveness), ``GET /ready`` (every index
and the policy loaded), ``GET /indexes`` and ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..errors import APIError
from ..protocol import ErrorResponse, HealthResponse, IndexList, StatusResponse
from ..service import Service, service_of
from .common import Responses, only

METRICS_PATH = "/metrics"


async def health(request: Request) -> HealthResponse:
    """Liveness: the process answers (no auth). With a valid key (or none configured), also the memory of each
    index the key may read and of the whole process."""
    service = service_of(request)
    return HealthResponse(status="ok", rss_mb=round(rss_mb(), 1),
                          indexes=[service.index_info(n) for n in service.readable(request)])


async def ready(request: Request) -> StatusResponse:
    """Readiness: every served index and the policy are loaded."""
    waiting = [n for n, e in service_of(request).served.items() if not e.ready]
    if waiting:
        raise APIError(503, "not_ready", f"not loaded yet: {', '.join(waiting)}")
    return StatusResponse(status="ready")


async def indexes(request: Request) -> IndexList:
    """The indexes this key may use: passages, served version, memory and pending ingestion jobs."""
    service = service_of(request)
    return IndexList(indexes=[service.index_info(n) for n in service.readable(request)])


async def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics: requests by route and status, latency histograms, searches per mode and index,
    finishes, per-index passages and memory, ingestion jobs; the per-index series only of the indexes this key
    may read (all of them with `server.public_metrics`, which also makes this route public)."""
    service = service_of(request)
    shown = list(service.served) if service.settings.server.public_metrics else service.readable(request)
    for name in shown:
        service.index_info(name)
    return Response(service.metrics.render(shown.__contains__), media_type=service.metrics.content_type)


def rss_mb() -> float:
    """This process's resident memory, from /proc (Linux) or resource's peak elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def health_routes(service: Service, errors: Responses) -> APIRouter:
    router = APIRouter()
    router.add_api_route("/health", health, methods=["GET"], response_model=HealthResponse)
    router.add_api_route("/ready", ready, methods=["GET"], response_model=StatusResponse, responses={
        503: {"model": ErrorResponse, "description": "An engine is not loaded."}, **only(errors, 401)})
    router.add_api_route("/indexes", indexes, methods=["GET"], response_model=IndexList, responses=only(errors, 401))
    public = service.settings.server.public_metrics
    router.add_api_route(METRICS_PATH, prometheus_metrics, methods=["GET"], response_class=Response, responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}},
              "description": "Prometheus text exposition format."},
        **({} if public else only(errors, 401))})
    return router
