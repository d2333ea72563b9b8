"""The REST server: ``create_app(engine, settings)`` builds a FastAPI app around one :class:`~routerag.engine.Engine`.

Routes: ``POST /ask`` (JSON, or Server-Sent Events with ``stream: true``), ``POST /retrieve`` (Search-R1's retriever
protocol plus ``mode``), ``GET /health`` (liveness), ``GET /ready`` (engine loaded), ``GET /metrics`` (Prometheus),
and the OpenAPI docs at ``/docs``, ``/redoc`` and ``/openapi.json``.

The app is built by a factory and keeps its state (engine, settings, metrics registry) on itself: no module
globals, so tests and benchmarks can run several apps in one process. Requests run concurrently on the event loop;
generation and retrieval are micro-batched inside the engine's backends, so there is deliberately no lock around
model calls here. Every error, from the guards or the routes, is ``{"error": {"type", "message"}}``; a 500 is only
ever a genuine internal error.

Auth (``server.api_key``): every route needs ``Authorization: Bearer <key>`` except ``/health`` and the docs
(``/docs``, ``/redoc``, ``/openapi.json``), which stay public so clients can discover the API.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from routerag import __version__
from routerag.config import Settings
from routerag.engine import Engine
from routerag.policy.types import Trajectory
from routerag.retrieval import QueryError, RetrievalResult

from .metrics import ServerMetrics, MetricsMiddleware
from .protocol import (AskRequest, AskResponse, Document, ErrorResponse, RetrieveRequest, RetrieveResponse,
                       ScoredDocument, StatusResponse, TokenUsage, request_models)
from .security import APIKeyMiddleware, BodyLimitMiddleware, error_response

log = logging.getLogger(__name__)

PUBLIC_PATHS = ("/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
_FASTAPI_BODY_ERROR = "There was an error parsing the body"
_STATUS_TYPES = {400: "bad_request", 401: "authentication_error", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 413: "request_too_large", 415: "unsupported_media_type",
                 422: "validation_error", 503: "not_ready", 504: "timeout"}


class APIError(Exception):
    """An error with its HTTP status and error type, raised by route code and rendered by one handler."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message}}


def ask_response(traj: Trajectory, total_ms: float) -> AskResponse:
    """The wire form of a finished trajectory."""
    return AskResponse(answer=traj.answer, trace=traj.trace(), searches=traj.searches,
                       retrieval_ms=traj.retrieval_ms, generation_ms=traj.generation_ms, total_ms=round(total_ms, 3),
                       tokens=TokenUsage(prompt=traj.prompt_tokens, completion=traj.completion_tokens),
                       finish=traj.finish)


def retrieve_response(results: list[RetrievalResult], mode: str, with_scores: bool) -> RetrieveResponse:
    """Search-R1's ``result`` (documents with its ``contents`` field) plus per-query compute time."""
    rows: list[list[Any]] = []
    for res in results:
        docs = [Document(id=d.id, title=d.title, text=d.text, contents=f'"{d.title}"\n{d.text}') for d in res.docs]
        rows.append([ScoredDocument(document=doc, score=round(d.score, 6)) for doc, d in zip(docs, res.docs)]
                    if with_scores else docs)
    return RetrieveResponse(result=rows, ms=[r.ms for r in results], mode=mode)  # type: ignore[arg-type]


def _backend_errors() -> tuple[type[BaseException], ...]:
    """Failures of a remote backend (the policy's OpenAI-compatible server, a remote /retrieve): a 502, not ours."""
    import httpx

    kinds: list[type[BaseException]] = [httpx.HTTPError]
    try:
        import openai

        kinds.append(openai.APIError)
    except ImportError:  # pragma: no cover - openai is a dependency, but the server does not need it
        pass
    return tuple(kinds)


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


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects. The body has been read by then, so the next ASGI message is the
    disconnect (the body-limit middleware hands later ``receive`` calls to the client)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: Engine, settings: Settings) -> FastAPI:
    """A FastAPI app serving ``engine`` with the limits, auth and defaults of ``settings.server``."""
    cfg = settings.server
    ask_model, retrieve_model = request_models(cfg, settings.retrieval.max_query_chars)
    timeout_s = cfg.request_timeout_s
    retrieve_mode = cfg.retrieve_mode or settings.retrieval.mode
    metrics = ServerMetrics()
    backend_errors = _backend_errors()
    api_key = cfg.api_key.get_secret_value() if cfg.api_key is not None else ""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # load the graph and the query encoder off the event loop; /ready answers 503 until it is done
        if not engine.ready:
            await asyncio.get_running_loop().run_in_executor(None, engine.warm_up)
        yield

    app = FastAPI(
        lifespan=lifespan,
        title="RouteRAG server", version=__version__,
        description="Graph-text hybrid retrieval-augmented generation with a learned router: ask a question (the "
                    "policy decides per search between dense passages, the knowledge graph or both), or retrieve "
                    "with a chosen mode (Search-R1's /retrieve protocol)."
                    + (" Every route except /health and the docs needs `Authorization: Bearer <key>`."
                       if api_key else ""))
    app.state.engine = engine
    app.state.settings = settings
    app.state.metrics = metrics

    errors: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorResponse, "description": "A query the retriever cannot take."},
        413: {"model": ErrorResponse, "description": f"Body over {cfg.max_body_bytes} bytes."},
        422: {"model": ErrorResponse, "description": "Malformed JSON, wrong types or a limit exceeded."},
        502: {"model": ErrorResponse, "description": "A remote backend (policy or retrieval server) failed."},
        504: {"model": ErrorResponse, "description": f"Not finished within {timeout_s:g} s."},
    }
    if api_key:
        errors[401] = {"model": ErrorResponse, "description": "Missing or wrong API key."}

    # -- error rendering ----------------------------------------------------------------------------------------------

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "validation_error", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == _FASTAPI_BODY_ERROR:
            # FastAPI's answer to a body it cannot decode (not UTF-8): malformed JSON like any other, so a 422
            return error_response(422, "validation_error", "request body is not valid JSON (it must be UTF-8)")
        return error_response(exc.status_code, _STATUS_TYPES.get(exc.status_code, "http_error"), str(exc.detail),
                              dict(exc.headers) if exc.headers else None)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"internal server error ({type(exc).__name__})")

    # -- the engine calls, with the timeout and the error mapping -----------------------------------------------------

    async def run_ask(req: AskRequest, on_event: Any = None) -> Trajectory:
        try:
            traj = await asyncio.wait_for(engine.ask(req.question, mode=req.mode, budget=req.budget, k=req.k,
                                                     on_event=on_event), timeout_s)
        except Exception as exc:
            mapped = _mapped("/ask", exc)
            if mapped is exc:
                raise
            raise mapped from exc
        for step in traj.steps:
            if step.action == "search" and step.mode:
                metrics.searches.labels(step.mode, "ask").inc()
        metrics.finish.labels(traj.finish).inc()
        return traj

    async def until_disconnect(request: Request, work: Any) -> Any:
        """Await ``work``, or cancel it and return None as soon as the client disconnects: an abandoned question
        should not keep the model busy (streamed answers get the same from their response's disconnect watch)."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            return None
        finally:
            for t in (task, watch):
                if not t.done():
                    t.cancel()

    def _mapped(route: str, exc: Exception) -> Exception:
        """An engine exception as the APIError the client should see (others stay internal errors)."""
        if isinstance(exc, TimeoutError):
            err = APIError(504, "timeout", f"the request did not finish within {timeout_s:g} s "
                                           "(server.request_timeout_s)")
        elif isinstance(exc, QueryError):
            err = APIError(400, "invalid_query", str(exc))
        elif isinstance(exc, backend_errors):
            err = APIError(502, "backend_error", f"a backend failed: {type(exc).__name__}: {exc}")
        elif isinstance(exc, ValueError):
            err = APIError(422, "invalid_request", str(exc))
        else:
            return exc
        metrics.errors.labels(route, err.kind).inc()
        return err

    async def stream_events(req: AskRequest, t0: float) -> AsyncIterator[ServerSentEvent]:
        """One SSE per loop event (think, search, information, answer), then ``done`` with the full AskResponse, or
        ``error`` with an error body. The trajectory runs in its own task so that a client who leaves cancels it."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        task = asyncio.ensure_future(run_ask(req, on_event=queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                if event.get("type") == "done":
                    continue  # replaced by the full payload below
                yield ServerSentEvent(data=json.dumps(event, ensure_ascii=False), event=str(event.get("type")))
            try:
                traj = task.result()
            except APIError as exc:
                yield ServerSentEvent(data=json.dumps(exc.body()), event="error")
                return
            except Exception as exc:
                log.error("internal error in a streamed /ask", exc_info=exc)
                body = {"error": {"type": "internal_error", "message": f"internal server error "
                                                                      f"({type(exc).__name__})"}}
                yield ServerSentEvent(data=json.dumps(body), event="error")
                return
            payload = ask_response(traj, (time.perf_counter() - t0) * 1000)
            yield ServerSentEvent(data=payload.model_dump_json(), event="done")
        finally:
            if not task.done():
                task.cancel()

    # -- routes -------------------------------------------------------------------------------------------------------

    @app.post("/ask", response_model=AskResponse, responses={
        **errors, 200: {"description": "The answer and its trace; with `stream: true`, Server-Sent Events "
                                       "(think, search, information, answer, then `done` carrying this same "
                                       "object, or `error` carrying an error object).",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
    async def ask(req: ask_model, request: Request) -> Any:  # type: ignore[valid-type]
        """Answer a question with the routing policy: it reasons, searches (passage, graph or both) and answers."""
        t0 = time.perf_counter()
        if req.stream:
            return EventSourceResponse(stream_events(req, t0))
        traj = await until_disconnect(request, run_ask(req))
        if traj is None:  # the client left: nobody reads this, but the logs and metrics see nginx's 499
            metrics.errors.labels("/ask", "client_disconnected").inc()
            return error_response(499, "client_disconnected", "the client closed the connection before the answer")
        # serialised once here: FastAPI would validate the model again against response_model before dumping it
        return Response(ask_response(traj, (time.perf_counter() - t0) * 1000).model_dump_json(),
                        media_type="application/json")

    @app.post("/retrieve", response_model=RetrieveResponse, responses=errors)
    async def retrieve(req: retrieve_model) -> Response:  # type: ignore[valid-type]
        """Retrieve documents for a batch of queries without the policy (Search-R1's protocol plus `mode`)."""
        r: RetrieveRequest = req
        mode = r.mode or retrieve_mode
        k = r.topk or settings.retrieval.top_k
        try:
            results = await asyncio.wait_for(engine.retrieve(list(r.queries), mode, k), timeout_s)
        except Exception as exc:
            mapped = _mapped("/retrieve", exc)
            if mapped is exc:
                raise
            raise mapped from exc
        metrics.searches.labels(mode, "retrieve").inc(len(results))
        return Response(retrieve_response(results, mode, r.return_scores).model_dump_json(),
                        media_type="application/json")

    @app.get("/health", response_model=StatusResponse)
    async def health() -> StatusResponse:
        """Liveness: the process answers (no auth)."""
        return StatusResponse(status="ok")

    @app.get("/ready", response_model=StatusResponse, responses={
        503: {"model": ErrorResponse, "description": "The engine is not loaded."},
        **({401: errors[401]} if api_key else {})})
    async def ready() -> StatusResponse:
        """Readiness: the engine (index and policy) is loaded."""
        if not engine.ready:
            raise APIError(503, "not_ready", "the engine is not loaded yet")
        return StatusResponse(status="ready")

    @app.get("/metrics", response_class=Response, responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}},
              "description": "Prometheus text exposition format."},
        **({401: errors[401]} if api_key else {})})
    async def prometheus_metrics() -> Response:
        """Prometheus metrics: requests by route and status, latency histograms, searches per mode, finishes."""
        return Response(metrics.render(), media_type=metrics.content_type)

    # -- guards, outermost last: metrics see every response, auth runs before the body is read ------------------------

    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_body_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key, public_paths=PUBLIC_PATHS)
        _document_auth(app)
    app.add_middleware(MetricsMiddleware, metrics=metrics,
                       paths=lambda: [getattr(r, "path", "") for r in app.routes])
    return app


def _document_auth(app: FastAPI) -> None:
    """Declare the bearer scheme in the OpenAPI schema, on every operation that needs it."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = FastAPI.openapi(app)
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearerAuth"] = {
            "type": "http", "scheme": "bearer", "description": "The server's API key (server.api_key)."}
        for path, ops in schema.get("paths", {}).items():
            if path in PUBLIC_PATHS:
                continue
            for op in ops.values():
                if isinstance(op, dict):
                    op["security"] = [{"bearerAuth": []}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
