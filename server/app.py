"""The REST server: ``create_app(engines, settings)`` builds a FastAPI app around one
:class:`~routerag.engine.Engine` or several, by index name.

The rooms: :class:`server.service.Service` (on ``app.state.service``) does what every request needs (index choice
and key checks, admission, deadlines, disconnect cancellation, running the policy and the retriever); one thin router
per route group (:mod:`server.routers`) parses requests and shapes answers; the request and response models are
:mod:`server.protocol`; this module only assembles them, with the error handlers, the guards and the OpenAPI schema.

Routes: ``POST /ask`` (JSON, or Server-Sent Events with ``stream: true``), ``/v1/chat/completions`` and
``/v1/models`` (:mod:`server.routers.ask_routes`, translated by :mod:`server.chat`); ``POST /retrieve`` (Search-R1's
retriever protocol plus ``mode``; :mod:`server.routers.retrieve_routes`); ``GET /documents``, ``POST /documents``,
``DELETE /documents/{id}``, ``GET /jobs/{id}`` (ingestion, :mod:`server.routers.document_routes` and
:mod:`server.jobs`); ``GET /health`` (liveness), ``GET /ready`` (engines loaded), ``GET /indexes``, ``GET /metrics``
(Prometheus; :mod:`server.routers.health_routes`); ``POST /explain`` and the ``/ui`` page
(:mod:`server.routers.ui_routes`); the OpenAPI docs at ``/docs``, ``/redoc`` and ``/openapi.json`` (their assets
served from here), and ``/`` → ``/ui`` (:mod:`server.operations`, which also drains the server on SIGTERM).

The app is built by a factory and keeps its state (the service: engines, settings, metrics registry, gates, jobs) on
itself: no module globals, so tests and benchmarks can run several apps in one process. Requests run concurrently on
the event loop; generation and retrieval are micro-batched inside the engine's backends, so there is deliberately no
lock around model calls here. Every error, from the guards or the routes, is ``{"error": {"type", "message", "param",
"code"}}`` (OpenAI's error object); a 500 is only ever a genuine internal error.

Auth (``server.api_key``, ``server.admin_key``, ``server.index_keys``; :func:`server.security.key_ring`): every
route needs ``Authorization: Bearer <key>`` except ``/health``, ``/``, the docs (``/docs``, ``/redoc``,
``/openapi.json`` and their assets), the ``/ui`` page's static files and, with ``server.public_metrics``,
``/metrics``, which stay public; the routes check the key's access per index (an index the
key may not read is a 404, as an unknown one). Before the key, every request passes the Host and Origin allow-lists
(``server.allowed_hosts``, ``server.allowed_origins``), and a state-changing one the content types its route
declares: :func:`server.security.install_guards`, which the MCP transport installs too (docs/security.md).

Load (``server.max_inflight`` and friends): ``/ask`` and ``/retrieve`` (and ``/explain``) each pass an admission gate
(:mod:`server.admission`) that bounds the requests running and waiting; beyond it, or when a queued request could not
finish by its deadline, the answer is an immediate 503 ``overloaded`` with ``Retry-After``, never a 504 much later.
"""

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from routerag import __version__
from routerag.config import Settings
from routerag.engine import Engine

from .cancellation import ShutdownGuard
from .errors import APIError
from .metrics import MetricsMiddleware
from .operations import DOCS_PATHS, ROOT_PATH, draining, operations_routes
from .protocol import STREAM_EVENTS
from .routers.ask_routes import ask_routes
from .routers.common import error_responses
from .routers.document_routes import UPLOAD_PATH, document_routes
from .routers.health_routes import METRICS_PATH, health_routes
from .routers.retrieve_routes import retrieve_routes
from .routers.ui_routes import UI_PATHS, ui_routes
from .security import declared_media, error_response, flat_routes, install_guards
from .service import Service, lifespan, served_engines, served_name

__all__ = ["create_app", "served_name"]
log = logging.getLogger(__name__)

PUBLIC_PATHS = ("/health", ROOT_PATH, "/openapi.json", *DOCS_PATHS, *UI_PATHS)
ROUTERS = (ask_routes, retrieve_routes, health_routes, document_routes, ui_routes)
"""The route groups, in the order the schema and the API reference list them."""
DESCRIPTION = ("Graph-text hybrid retrieval-augmented generation with a learned router: ask a question (the policy "
               "decides per search between dense passages, the knowledge graph or both), or retrieve with a chosen "
               "mode (Search-R1's /retrieve protocol); add and delete documents while serving; several indexes in "
               "one server; an OpenAI-compatible chat endpoint.")
_FASTAPI_BODY_ERROR = "There was an error parsing the body"
_STATUS_TYPES = {400: "bad_request", 401: "authentication_error", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 409: "conflict", 413: "request_too_large", 415: "unsupported_media_type",
                 422: "validation_error", 503: "not_ready", 504: "timeout"}


def create_app(engines: Engine | Mapping[str, Engine], settings: Settings, *,
               components: Mapping[str, Any] | None = None) -> FastAPI:
    """A FastAPI app serving one engine, or several by name (``routerag serve A=DIR B=DIR``), with the limits, auth
    and defaults of ``settings.server``. Engines over several indexes should share one generator (one model in
    memory, one batch); ``components`` (per index name, the build's loaded embedder and extractor) serve its
    ingestion jobs, which otherwise load them for every job."""
    service = Service(served_engines(engines), settings, components=components)
    cfg = settings.server
    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None,  # served from this server: server.operations
                  title="RouteRAG server", version=__version__,
                  description=DESCRIPTION + (" Every route except /health and the docs needs `Authorization: Bearer "
                                             "<key>`." if service.keyed else ""))
    app.state.service = service
    app.state.engine = next(iter(service.served.values()))  # (what tests and tools read of the app)
    app.state.engines, app.state.settings, app.state.metrics = service.served, settings, service.metrics
    app.state.gates, app.state.jobs = service.gates, service.jobs
    install_error_handlers(app)
    errors = error_responses(cfg, service.keyed)
    for routes in ROUTERS:
        app.include_router(routes(service, errors))
    app.include_router(operations_routes(app.title))  # /docs and /redoc from local assets, / → /ui
    # the guards (server/security.py): Host and Origin, the key, the body limit, the content type; metrics
    # outermost but for the shutdown guard, so they see every response
    public = (*PUBLIC_PATHS, METRICS_PATH) if cfg.public_metrics else PUBLIC_PATHS
    install_guards(app, cfg, service.ring, media=declared_media(lambda: app.routes), public_paths=public,
                   body_limits={UPLOAD_PATH: (cfg.max_upload_bytes, "server.max_upload_bytes")})
    _customise_openapi(app, with_auth=service.keyed, public=public)
    app.add_middleware(MetricsMiddleware, metrics=service.metrics,
                       paths=lambda: [getattr(r, "path", "") for r in flat_routes(app.routes)])
    app.add_middleware(ShutdownGuard, draining=lambda: draining(app))
    return app


def install_error_handlers(app: FastAPI) -> None:
    """Every error, from the guards, FastAPI or the routes, as ``{"error": {...}}`` (:mod:`server.errors`)."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _internal)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(422, "validation_error", _validation_message(exc))


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400 and exc.detail == _FASTAPI_BODY_ERROR:
        # FastAPI's answer to a body it cannot decode: malformed JSON like any other, so a 422, saying why
        if isinstance(exc.__cause__, RecursionError):
            return error_response(422, "validation_error", "request body is nested too deeply: the JSON parser "
                                                           "gave up (no request needs more than a few levels)")
        return error_response(422, "validation_error", "request body is not valid JSON (it must be UTF-8)")
    return error_response(exc.status_code, _STATUS_TYPES.get(exc.status_code, "http_error"), str(exc.detail),
                          dict(exc.headers) if exc.headers else None)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return error_response(500, "internal_error", f"internal server error ({type(exc).__name__})")


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:8]:
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            parts.append(f"request body is not valid JSON{': ' + detail if detail else ''}")
            continue
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        parts.append(f"{'.'.join(loc) or 'request body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _customise_openapi(app: FastAPI, *, with_auth: bool, public: tuple[str, ...] = PUBLIC_PATHS) -> None:
    """Add the stream events' models to the schema's components (no route returns them as a body, so FastAPI would
    not) and, with an API key, declare the bearer scheme on every operation that needs it."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = FastAPI.openapi(app)
        components = schema.setdefault("components", {})
        _, defs = models_json_schema([(m, "serialization") for m in STREAM_EVENTS.values()],
                                     ref_template="#/components/schemas/{model}")
        for name, definition in defs.get("$defs", {}).items():
            components.setdefault("schemas", {}).setdefault(name, definition)
        if with_auth:
            components.setdefault("securitySchemes", {})["bearerAuth"] = {
                "type": "http", "scheme": "bearer", "description": "The server's API key (server.api_key)."}
            for path, ops in schema.get("paths", {}).items():
                if path in public:
                    continue
                for op in ops.values():
                    if isinstance(op, dict):
                        op["security"] = [{"bearerAuth": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
