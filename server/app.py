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

Load (``server.max_inflight`` and friends): ``/ask`` and ``/retrieve`` each pass an admission gate
(:mod:`server.admission`) that bounds the requests running and waiting; beyond it, or when a queued request could not
finish by its deadline, the answer is an immediate 503 ``overloaded`` with ``Retry-After``, never a 504 much later.
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
from pydantic.json_schema import models_json_schema
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from routerag import __version__
from routerag.config import Settings
from routerag.engine import Engine
from routerag.policy.types import Summary
from routerag.retrieval import QueryError, RetrievalResult

from .admission import Gate, Overloaded, Slot, ask_limits, retrieve_limits
from .metrics import DISCONNECTED_STATE, ServerMetrics, MetricsMiddleware
from .protocol import (STREAM_EVENTS, AskRequest, AskResponse, Document, ErrorResponse, RetrieveRequest,
                       RetrieveResponse, ScoredDocument, StatusResponse, request_models)
from .security import APIKeyMiddleware, BodyLimitMiddleware, JSONContentTypeMiddleware, error_response

log = logging.getLogger(__name__)

PUBLIC_PATHS = ("/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
JSON_PATHS = ("/ask", "/retrieve")
_FASTAPI_BODY_ERROR = "There was an error parsing the body"
_STATUS_TYPES = {400: "bad_request", 401: "authentication_error", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 413: "request_too_large", 415: "unsupported_media_type",
                 422: "validation_error", 503: "not_ready", 504: "timeout"}


class APIError(Exception):
    """An error with its HTTP status and error type, raised by route code and rendered by one handler."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message}}


def ask_response(summary: Summary, total_ms: float) -> AskResponse:
    """The wire form of a finished trajectory's summary."""
    return AskResponse(**summary.to_json(), total_ms=round(total_ms, 3))


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

    from graph_index.llm_clients import UpstreamError  # an OpenAI-compatible server answered no usable completion

    kinds: list[type[BaseException]] = [httpx.HTTPError, UpstreamError]
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
    gates = {"/ask": Gate("/ask", ask_limits(settings, getattr(engine, "generator", None)), metrics),
             "/retrieve": Gate("/retrieve", retrieve_limits(settings), metrics)}
    for route, gate in gates.items():
        metrics.admission_limit.labels(route, "in_flight").set(gate.max_inflight)
        metrics.admission_limit.labels(route, "queue").set(gate.max_queue)

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
    app.state.gates = gates

    errors: dict[int | str, dict[str, Any]] = {
        413: {"model": ErrorResponse, "description": f"Body over {cfg.max_body_bytes} bytes."},
        415: {"model": ErrorResponse,
              "description": "The body is not sent as JSON (`Content-Type: application/json`)."},
        422: {"model": ErrorResponse,
              "description": "Malformed JSON, wrong types, unknown fields or a limit exceeded."},
        502: {"model": ErrorResponse, "description": "A remote backend (policy or retrieval server) failed."},
        503: {"model": ErrorResponse,
              "description": "`overloaded`: too many requests in flight and queued, or the queue would not let this "
                             "one finish in time; retry after `Retry-After` seconds.",
              "headers": {"Retry-After": {"description": "Seconds until a slot is expected to be free.",
                                          "schema": {"type": "integer", "minimum": 1}}}},
        504: {"model": ErrorResponse, "description": f"Not finished within {timeout_s:g} s of its arrival."},
    }
    if api_key:
        errors[401] = {"model": ErrorResponse, "description": "Missing or wrong API key."}
    retrieve_errors = {**errors, 400: {"model": ErrorResponse, "description": "A query the retriever refuses beyond "
                                                                              "what the schema states."}}

    # -- error rendering ----------------------------------------------------------------------------------------------

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

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

    # -- the engine calls, with admission, the deadline and the error mapping ------------------------------------------

    def remaining(deadline: float) -> float:
        return max(0.0, deadline - asyncio.get_running_loop().time())

    async def admit(route: str, deadline: float) -> Slot:
        """A slot on ``route``'s gate, or the 503 that refuses the request."""
        try:
            return await gates[route].acquire(deadline)
        except Overloaded as exc:
            metrics.errors.labels(route, "overloaded").inc()
            raise APIError(503, "overloaded", exc.message, {"Retry-After": str(exc.retry_after_s)}) from None

    async def run_ask(req: AskRequest, slot: Slot, deadline: float, on_event: Any = None) -> Summary:
        """The trajectory's summary, within what is left of the request's time; frees ``slot`` however it ends."""
        served = False
        try:
            traj = await asyncio.wait_for(engine.ask(req.question, mode=req.mode, budget=req.budget, k=req.k,
                                                     on_event=on_event), remaining(deadline))
            served = True
        except Exception as exc:
            # a timeout is a lower bound of the service time: still worth counting
            served = isinstance(exc, (TimeoutError, asyncio.TimeoutError))
            mapped = _mapped("/ask", exc)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            slot.release(served)
        summary = traj.summary()
        for search in summary.searches:
            metrics.searches.labels(search.mode, "ask").inc()
        metrics.finish.labels(summary.finish).inc()
        return summary

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
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            err = APIError(504, "timeout", f"the request did not finish within {timeout_s:g} s "
                                           "(server.request_timeout_s)")
        elif isinstance(exc, QueryError):
            err = APIError(400, "invalid_query", str(exc))
        elif isinstance(exc, backend_errors):
            err = APIError(502, "backend_error", f"a backend failed: {type(exc).__name__}: {exc}")
        else:  # anything else (a ValueError too) is ours, not the client's: a logged 500
            return exc
        metrics.errors.labels(route, err.kind).inc()
        return err

    async def stream_events(req: AskRequest, t0: float, slot: Slot, deadline: float,
                            ended: dict[str, bool]) -> AsyncIterator[ServerSentEvent]:
        """One SSE per loop event (think, search, information, answer), then ``done`` with the full AskResponse, or
        ``error`` with an error body. The trajectory runs in its own task so that a client who leaves cancels it.
        ``ended["yes"]`` is set once the last event was sent: a disconnect after it is the normal end of a stream."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        task = asyncio.ensure_future(run_ask(req, slot, deadline, on_event=queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                if event.get("type") == "done":
                    continue  # replaced by the full payload below
                yield ServerSentEvent(data=json.dumps(event, ensure_ascii=False), event=str(event.get("type")))
            try:
                summary = task.result()
            except APIError as exc:
                yield ServerSentEvent(data=json.dumps(exc.body()), event="error")
                ended["yes"] = True
                return
            except Exception as exc:
                log.error("internal error in a streamed /ask", exc_info=exc)
                body = {"error": {"type": "internal_error", "message": f"internal server error "
                                                                      f"({type(exc).__name__})"}}
                yield ServerSentEvent(data=json.dumps(body), event="error")
                ended["yes"] = True
                return
            payload = ask_response(summary, (time.perf_counter() - t0) * 1000)
            yield ServerSentEvent(data=payload.model_dump_json(), event="done")
            ended["yes"] = True
        finally:
            if not task.done():
                task.cancel()
            slot.release()  # (run_ask frees it; this covers a task cancelled before it started)

    def stream_disconnect_handler(request: Request, ended: dict[str, bool]) -> Any:
        """Called by the SSE response when its client leaves: before the last event, that is a client disconnect
        (499), not the 200 the stream's headers carried. (The server also reports a disconnect once a complete
        response has been sent, racing the stream's own end: that one is ignored.)"""
        async def on_close(_: Any) -> None:
            if ended["yes"]:
                return
            setattr(request.state, DISCONNECTED_STATE, True)
            metrics.errors.labels("/ask", "client_disconnected").inc()
            log.info("a streamed /ask lost its client before the end of the stream")

        return on_close

    # -- routes -------------------------------------------------------------------------------------------------------

    @app.post("/ask", response_model=AskResponse, responses={
        **errors, 200: {"description": "The answer and its trace; with `stream: true`, Server-Sent Events "
                                       "(think, search, information, answer, then `done` carrying this same "
                                       "object, or `error` carrying an error object): the `itemSchema` names "
                                       "each event and the model of its JSON data.",
                        "content": {"text/event-stream": {"schema": {"type": "string"},
                                                          "itemSchema": stream_item_schema()}}}})
    async def ask(req: ask_model, request: Request) -> Any:  # type: ignore[valid-type]
        """Answer a question with the routing policy: it reasons, searches (passage, graph or both) and answers."""
        t0 = time.perf_counter()
        deadline = asyncio.get_running_loop().time() + timeout_s
        slot = await until_disconnect(request, admit("/ask", deadline))
        if slot is None:
            return client_left()
        if req.stream:
            ended = {"yes": False}
            return EventSourceResponse(stream_events(req, t0, slot, deadline, ended),
                                       client_close_handler_callable=stream_disconnect_handler(request, ended),
                                       background=BackgroundTask(slot.release))
        summary = await until_disconnect(request, run_ask(req, slot, deadline))
        if summary is None:
            slot.release()
            return client_left()
        # serialised once here: FastAPI would validate the model again against response_model before dumping it
        return Response(ask_response(summary, (time.perf_counter() - t0) * 1000).model_dump_json(),
                        media_type="application/json")

    def client_left() -> Response:
        """The client left before its answer: nobody reads this, but the logs and metrics see nginx's 499."""
        metrics.errors.labels("/ask", "client_disconnected").inc()
        return error_response(499, "client_disconnected", "the client closed the connection before the answer")

    @app.post("/retrieve", response_model=RetrieveResponse, responses=retrieve_errors)
    async def retrieve(req: retrieve_model) -> Response:  # type: ignore[valid-type]
        """Retrieve documents for a batch of queries without the policy (Search-R1's protocol plus `mode`)."""
        r: RetrieveRequest = req
        mode = r.mode or retrieve_mode
        k = r.topk or settings.retrieval.k
        deadline = asyncio.get_running_loop().time() + timeout_s
        slot = await admit("/retrieve", deadline)
        served = False
        try:
            results = await asyncio.wait_for(engine.retrieve(list(r.queries), mode, k), remaining(deadline))
            served = True
        except Exception as exc:
            served = isinstance(exc, (TimeoutError, asyncio.TimeoutError))
            mapped = _mapped("/retrieve", exc)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            slot.release(served)
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

    # -- guards, outermost last: metrics see every response, auth runs before the body is read, the content type is
    #    checked on the buffered body (so a refused client still reads its 415 rather than a reset) -------------------

    app.add_middleware(JSONContentTypeMiddleware, paths=JSON_PATHS)
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_body_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key, public_paths=PUBLIC_PATHS)
    _customise_openapi(app, with_auth=bool(api_key))
    app.add_middleware(MetricsMiddleware, metrics=metrics,
                       paths=lambda: [getattr(r, "path", "") for r in app.routes])
    return app


def stream_item_schema() -> dict[str, Any]:
    """The OpenAPI ``itemSchema`` (3.2's form for event streams, which FastAPI also emits) of a streamed ``/ask``: one
    alternative per event name, its ``data`` the JSON of that event's model."""
    return {"oneOf": [
        {"type": "object", "required": ["event", "data"],
         "properties": {"event": {"const": name},
                        "data": {"type": "string", "contentMediaType": "application/json",
                                 "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
        for name, model in STREAM_EVENTS.items()]}


def _customise_openapi(app: FastAPI, *, with_auth: bool) -> None:
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
                if path in PUBLIC_PATHS:
                    continue
                for op in ops.values():
                    if isinstance(op, dict):
                        op["security"] = [{"bearerAuth": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
