"""The REST server: ``create_app(engines, settings)`` builds a FastAPI app around one
:class:`~routerag.engine.Engine` or several, by index name.

Routes: ``POST /ask`` (JSON, or Server-Sent Events with ``stream: true``), ``POST /retrieve`` (Search-R1's retriever
protocol plus ``mode``), ``GET /documents`` (:mod:`server.documents`), ``POST /documents`` /
``DELETE /documents/{id}`` / ``GET /jobs/{id}`` (ingestion,
:mod:`server.jobs`), ``/v1/chat/completions`` and ``/v1/models`` (:mod:`server.chat`), ``POST /explain`` and the
``/ui`` page (:mod:`server.ui`), ``GET /indexes``, ``GET /health`` (liveness), ``GET /ready`` (engines loaded),
``GET /metrics`` (Prometheus), the OpenAPI docs at ``/docs``, ``/redoc`` and ``/openapi.json`` (their assets served
from here), and ``/`` → ``/ui`` (:mod:`server.operations`, which also drains the server on SIGTERM).

The app is built by a factory and keeps its state (engine, settings, metrics registry) on itself: no module
globals, so tests and benchmarks can run several apps in one process. Requests run concurrently on the event loop;
generation and retrieval are micro-batched inside the engine's backends, so there is deliberately no lock around
model calls here. Every error, from the guards or the routes, is ``{"error": {"type", "message", "param", "code"}}``
(OpenAI's error object); a 500 is only ever a genuine internal error.

Auth (``server.api_key``, ``server.admin_key``, ``server.index_keys``; :func:`server.security.key_ring`): every
route needs ``Authorization: Bearer <key>`` except ``/health``, ``/``, the docs (``/docs``, ``/redoc``,
``/openapi.json`` and their assets), the ``/ui`` page's static files and, with ``server.public_metrics``,
``/metrics``, which stay public; the routes check the key's access per index (an index the
key may not read is a 404, as an unknown one). Before the key, every request passes the Host and Origin allow-lists
(``server.allowed_hosts``, ``server.allowed_origins``), and a state-changing one the content types its route
declares: :func:`server.security.install_guards`, which the MCP transport installs too (docs/security.md).

Load (``server.max_inflight`` and friends): ``/ask`` and ``/retrieve`` each pass an admission gate
(:mod:`server.admission`) that bounds the requests running and waiting; beyond it, or when a queued request could not
finish by its deadline, the answer is an immediate 503 ``overloaded`` with ``Retry-After``, never a 504 much later.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
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
from .cancellation import ShutdownGuard, client_left, until_disconnect
from .documents import document_routes
from .operations import DOCS_PATHS, ROOT_PATH, draining, operations_routes
from .chat import chat_routes
from .errors import APIError, error_body
from .jobs import JobError, JobRunner, Target
from .metrics import DISCONNECTED_STATE, ServerMetrics, MetricsMiddleware
from .protocol import (STREAM_EVENTS, AskRequest, AskResponse, DeleteDocuments, Document, ErrorResponse,
                       HealthResponse, IndexInfo, IndexList, Job, JobAccepted, RetrieveRequest, RetrieveResponse,
                       ScoredDocument, ShardStatus, StatusResponse, request_models)
from .security import (Access, access_in, declared_media, error_response, flat_routes, install_guards, key_ring,
                       visible_index)
from .ui import UI_PATHS, ui_routes

log = logging.getLogger(__name__)

PUBLIC_PATHS = ("/health", ROOT_PATH, "/openapi.json", *DOCS_PATHS, *UI_PATHS)
METRICS_PATH = "/metrics"
UPLOAD_PATH = "/documents"
UPLOAD_TYPES = {"application/x-ndjson": "jsonl", "application/jsonl": "jsonl", "application/json": "json",
                "multipart/form-data": "file"}
"""The body types ``POST /documents`` declares (and the request guard enforces); ``text/plain``, which a browser
sends cross-site without asking, is not one."""
_FASTAPI_BODY_ERROR = "There was an error parsing the body"
_STATUS_TYPES = {400: "bad_request", 401: "authentication_error", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 409: "conflict", 413: "request_too_large", 415: "unsupported_media_type",
                 422: "validation_error", 503: "not_ready", 504: "timeout"}


def retrieve_response(results: list[RetrievalResult], mode: str, with_scores: bool) -> RetrieveResponse:
    """Search-R1's ``result`` (documents with its ``contents`` field) plus per-query compute time."""
    rows: list[list[Any]] = []
    for res in results:
        docs = [Document(id=d.id, title=d.title, text=d.text, contents=f'"{d.title}"\n{d.text}') for d in res.docs]
        rows.append([ScoredDocument(document=doc, score=round(d.score, 6)) for doc, d in zip(docs, res.docs)]
                    if with_scores else docs)
    shards = [ShardStatus(**r.to_json()) for r in results[0].shards] if results and results[0].shards else None
    return RetrieveResponse(result=rows, ms=[r.ms for r in results], mode=mode, shards=shards)  # type: ignore[arg-type]


def _backend_errors() -> tuple[type[BaseException], ...]:
    """Failures of a remote backend (the policy's OpenAI-compatible server, a remote /retrieve): a 502, not ours."""
    import httpx

    from graph_index.llm_clients import UpstreamError  # an OpenAI-compatible server answered no usable completion

    from routerag.retrieval.shards import ShardsUnavailable

    kinds: list[type[BaseException]] = [httpx.HTTPError, UpstreamError, ShardsUnavailable]
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


def served_name(engine: Engine) -> str:
    """The name an index is served under when none is given: its directory's name."""
    return index_path(engine).name or "default"


def index_path(engine: Engine) -> Path:
    """The directory an engine serves (an engine may have been given the opened index instead of its path)."""
    from graph_index.store import IndexData

    if engine.index is None:
        return Path("shards")
    return engine.index.root if isinstance(engine.index, IndexData) else Path(str(engine.index))


def create_app(engines: Engine | Mapping[str, Engine], settings: Settings, *,
               components: Mapping[str, Any] | None = None) -> FastAPI:
    """A FastAPI app serving one engine, or several by name (``routerag serve A=DIR B=DIR``), with the limits, auth
    and defaults of ``settings.server``. Engines over several indexes should share one generator (one model in
    memory, one batch); ``components`` (per index name, the build's loaded embedder and extractor) serve its
    ingestion jobs, which otherwise load them for every job."""
    served: dict[str, Engine] = dict(engines) if isinstance(engines, Mapping) else {served_name(engines): engines}
    if not served:
        raise ValueError("create_app needs at least one engine")
    for name in served:
        if not name or "/" in name or name != name.strip():
            raise ValueError(f"index name {name!r}: use letters, digits, dots, dashes or underscores")
    engine = next(iter(served.values()))  # the shared model's properties (admission limits) come from the first
    cfg = settings.server
    ask_model, retrieve_model = request_models(cfg, settings.retrieval.max_query_chars)
    timeout_s = cfg.request_timeout_s
    retrieve_mode = cfg.retrieve_mode or settings.retrieval.mode
    metrics = ServerMetrics()
    backend_errors = _backend_errors()
    ring = key_ring(cfg, served)
    keyed = bool(ring)
    gates = {"/ask": Gate("/ask", ask_limits(settings, getattr(engine, "generator", None)), metrics),
             "/retrieve": Gate("/retrieve", retrieve_limits(settings), metrics)}
    for route, gate in gates.items():
        metrics.admission_limit.labels(route, "in_flight").set(gate.max_inflight)
        metrics.admission_limit.labels(route, "queue").set(gate.max_queue)

    def finished(job: Job) -> None:
        metrics.jobs.labels(job.index, job.op, job.state).inc()

    jobs = JobRunner({name: Target(index_path(e), e.reload, lambda e=e: e.retriever.passages)
                      for name, e in served.items() if getattr(e, "shards", None) is None},
                     settings, components=dict(components or {}), max_pending=cfg.max_pending_jobs, on_finish=finished)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # load the graphs and the query encoder off the event loop; /ready answers 503 until it is done
        for e in served.values():
            if not e.ready:
                await asyncio.get_running_loop().run_in_executor(None, e.warm_up)
        jobs.resume()  # jobs a killed server left behind: their index still serves its last published version
        yield

    app = FastAPI(
        lifespan=lifespan, docs_url=None, redoc_url=None,  # served from this server: server.operations
        title="RouteRAG server", version=__version__,
        description="Graph-text hybrid retrieval-augmented generation with a learned router: ask a question (the "
                    "policy decides per search between dense passages, the knowledge graph or both), or retrieve "
                    "with a chosen mode (Search-R1's /retrieve protocol); add and delete documents while serving; "
                    "several indexes in one server; an OpenAI-compatible chat endpoint."
                    + (" Every route except /health and the docs needs `Authorization: Bearer <key>`."
                       if keyed else ""))
    app.state.engine = engine
    app.state.engines = served
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.gates = gates
    app.state.jobs = jobs

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
    if keyed:
        errors[401] = {"model": ErrorResponse, "description": "Missing or wrong API key."}
    errors[403] = {"model": ErrorResponse, "description": "A browser origin not in server.allowed_origins, or a key "
                                                          "that may read this index but not change it."}
    errors[404] = {"model": ErrorResponse, "description": "No such index, or none this key may use (or no such job, "
                                                          "or document)."}
    errors[421] = {"model": ErrorResponse, "description": "A Host header not in server.allowed_hosts."}
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
            # FastAPI's answer to a body it cannot decode: malformed JSON like any other, so a 422, saying why
            if isinstance(exc.__cause__, RecursionError):
                return error_response(422, "validation_error", "request body is nested too deeply: the JSON parser "
                                                               "gave up (no request needs more than a few levels)")
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

    def access_of(request: Request) -> Access:
        """What the caller's key allows (everything on a server without keys)."""
        return access_in(request.scope, bool(ring))

    def pick(request: Request, name: str | None, *, write: bool = False, route: str = "") -> tuple[str, Engine]:
        """The index a request names (or the only one the key may use), checked against the caller's key: one it
        may not read is as unknown as one not served."""
        access = access_of(request)
        name = visible_index(access, list(served), name)
        if write and getattr(served[name], "shards", None) is not None:
            raise APIError(409, "conflict", f"index {name!r} is served from shards: add and delete documents on "
                                            "the shard servers")
        if write and not access.can_write(name):
            raise APIError(403, "forbidden", f"this key may not change index {name!r}"
                                             + (" (writes need server.admin_key)" if cfg.admin_key else ""))
        if route:
            metrics.index_requests.labels(name, route).inc()
        return name, served[name]

    async def run_ask(req: AskRequest, slot: Slot, deadline: float, on_event: Any = None, *,
                      target: tuple[str, Engine] | None = None) -> Summary:
        """The trajectory's summary, within what is left of the request's time; frees ``slot`` however it ends."""
        served_ok = False
        name, eng = target or (next(iter(served)), engine)
        try:
            traj = await asyncio.wait_for(eng.ask(req.question, mode=req.mode, budget=req.budget, k=req.k,
                                                  on_event=on_event), remaining(deadline))
            served_ok = True
        except Exception as exc:
            # a timeout is a lower bound of the service time: still worth counting
            served_ok = isinstance(exc, (TimeoutError, asyncio.TimeoutError))
            mapped = _mapped("/ask", exc)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            slot.release(served_ok)
        summary = traj.summary()
        for search in summary.searches:
            metrics.searches.labels(search.mode, "ask", name).inc()
        metrics.finish.labels(summary.finish, name).inc()
        return summary

    async def answer(request: Request, req: AskRequest, target: tuple[str, Engine], route: str) -> Summary | Response:
        """A non-streamed policy run (``/ask``, ``/v1/chat/completions``): admitted, run, and cancelled (its slot
        freed, a 499 answered) as soon as its client leaves, waiting or running. (Streamed answers get the same from
        their response's disconnect watch.)"""
        deadline = asyncio.get_running_loop().time() + timeout_s
        slot = await until_disconnect(request, admit("/ask", deadline))
        if slot is None:
            return client_left(request, route)
        summary = await until_disconnect(request, run_ask(req, slot, deadline, target=target))
        if summary is None:
            slot.release()
            return client_left(request, route)
        return summary

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

    async def stream_events(req: AskRequest, t0: float, slot: Slot, deadline: float, ended: dict[str, bool],
                            target: tuple[str, Engine]) -> AsyncIterator[ServerSentEvent]:
        """One SSE per loop event (think, search, information, draft, answer), then ``done`` with the full
        AskResponse, or
        ``error`` with an error body. The trajectory runs in its own task so that a client who leaves cancels it.
        ``ended["yes"]`` is set once the last event was sent: a disconnect after it is the normal end of a stream."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        task = asyncio.ensure_future(run_ask(req, slot, deadline, on_event=queue.put_nowait, target=target))
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
                body = error_body("internal_error", f"internal server error ({type(exc).__name__})")
                yield ServerSentEvent(data=json.dumps(body), event="error")
                ended["yes"] = True
                return
            payload = AskResponse.from_summary(summary, (time.perf_counter() - t0) * 1000)
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
                                       "(think, search, information, `draft`: the policy's own answer, `answer`: "
                                       "the final one, then `done` carrying this same "
                                       "object, or `error` carrying an error object): the `itemSchema` names "
                                       "each event and the model of its JSON data.",
                        "content": {"text/event-stream": {"schema": {"type": "string"},
                                                          "itemSchema": stream_item_schema()}}}})
    async def ask(req: ask_model, request: Request) -> Any:  # type: ignore[valid-type]
        """Answer a question with the routing policy: it reasons, searches (passage, graph or both) and answers."""
        t0 = time.perf_counter()
        target = pick(request, req.index, route="/ask")
        if not req.stream:
            summary = await answer(request, req, target, "/ask")
            if isinstance(summary, Response):
                return summary
            # serialised once here: FastAPI would validate the model again against response_model before dumping it
            return Response(AskResponse.from_summary(summary, (time.perf_counter() - t0) * 1000).model_dump_json(),
                            media_type="application/json")
        deadline = asyncio.get_running_loop().time() + timeout_s
        slot = await until_disconnect(request, admit("/ask", deadline))
        if slot is None:
            return client_left(request, "/ask")
        ended = {"yes": False}
        return EventSourceResponse(stream_events(req, t0, slot, deadline, ended, target),
                                   client_close_handler_callable=stream_disconnect_handler(request, ended),
                                   background=BackgroundTask(slot.release))

    @app.post("/retrieve", response_model=RetrieveResponse, responses=retrieve_errors)
    async def retrieve(req: retrieve_model, request: Request) -> Response:  # type: ignore[valid-type]
        """Retrieve documents for a batch of queries without the policy (Search-R1's protocol plus `mode`)."""
        r: RetrieveRequest = req
        name, eng = pick(request, r.index, route="/retrieve")
        mode = r.mode or retrieve_mode
        k = r.topk or settings.retrieval.k
        deadline = asyncio.get_running_loop().time() + timeout_s
        slot = await admit("/retrieve", deadline)
        served_ok = False
        try:
            results = await asyncio.wait_for(eng.retrieve(list(r.queries), mode, k), remaining(deadline))
            served_ok = True
        except Exception as exc:
            served_ok = isinstance(exc, (TimeoutError, asyncio.TimeoutError))
            mapped = _mapped("/retrieve", exc)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            slot.release(served_ok)
        metrics.searches.labels(mode, "retrieve", name).inc(len(results))
        return Response(retrieve_response(results, mode, r.return_scores).model_dump_json(),
                        media_type="application/json")

    def index_info(name: str) -> IndexInfo:
        eng = served[name]
        if getattr(eng, "shards", None) is not None:
            return IndexInfo(name=name, passages=None, version=f"{len(eng.shards.urls)} shards", memory_mb=0.0,
                             jobs_pending=0)
        retriever = eng.retriever
        memory = retriever.memory_bytes() if hasattr(retriever, "memory_bytes") else 0
        version = getattr(getattr(retriever, "data", None), "version", "")
        passages = len(getattr(retriever, "passages", []))
        metrics.index_passages.labels(name).set(passages)
        metrics.index_memory.labels(name).set(memory)
        return IndexInfo(name=name, passages=passages, version=version, memory_mb=round(memory / 2**20, 1),
                         jobs_pending=len(jobs.pending(name)))

    def readable(request: Request) -> list[str]:
        access = access_of(request)
        return [n for n in served if access.can_read(n)]

    @app.get("/health", response_model=HealthResponse)
    async def health(request: Request) -> HealthResponse:
        """Liveness: the process answers (no auth). With a valid key (or none configured), also the memory of each
        index the key may read and of the whole process."""
        return HealthResponse(status="ok", rss_mb=round(_rss_mb(), 1),
                              indexes=[index_info(n) for n in readable(request)])

    @app.get("/ready", response_model=StatusResponse, responses={
        503: {"model": ErrorResponse, "description": "An engine is not loaded."},
        **({401: errors[401]} if keyed else {})})
    async def ready() -> StatusResponse:
        """Readiness: every served index and the policy are loaded."""
        waiting = [n for n, e in served.items() if not e.ready]
        if waiting:
            raise APIError(503, "not_ready", f"not loaded yet: {', '.join(waiting)}")
        return StatusResponse(status="ready")

    @app.get("/indexes", response_model=IndexList, responses={**({401: errors[401]} if keyed else {})})
    async def indexes(request: Request) -> IndexList:
        """The indexes this key may use: passages, served version, memory and pending ingestion jobs."""
        return IndexList(indexes=[index_info(n) for n in readable(request)])

    @app.get(METRICS_PATH, response_class=Response, responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}},
              "description": "Prometheus text exposition format."},
        **({401: errors[401]} if keyed and not cfg.public_metrics else {})})
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus metrics: requests by route and status, latency histograms, searches per mode and index,
        finishes, per-index passages and memory, ingestion jobs; the per-index series only of the indexes this key
        may read (all of them with `server.public_metrics`, which also makes this route public)."""
        shown = list(served) if cfg.public_metrics else readable(request)
        for name in shown:
            index_info(name)
        return Response(metrics.render(shown.__contains__), media_type=metrics.content_type)

    # -- ingestion ----------------------------------------------------------------------------------------------------

    job_errors = {k: v for k, v in errors.items() if k not in (502, 503, 504)}
    job_errors[409] = {"model": ErrorResponse, "description": "The index has server.max_pending_jobs jobs queued "
                                                              "or running, or the delete would empty it."}
    upload_errors = {**job_errors, 413: {"model": ErrorResponse,
                                         "description": f"Upload over {cfg.max_upload_bytes} bytes."},
                     415: {"model": ErrorResponse, "description": "Not JSONL, JSON or a multipart file upload."},
                     422: {"model": ErrorResponse, "description": "A malformed record (named by its line), or no "
                                                                  "passages at all."}}

    async def accept(work: Any) -> Response:
        try:
            job = await work
        except JobError as exc:
            raise APIError(exc.status, exc.kind, exc.message) from None
        body = JobAccepted(job=job.id, index=job.index, state=job.state)
        return Response(body.model_dump_json(), status_code=202, media_type="application/json",
                        headers={"Location": f"/jobs/{job.id}"})

    @app.post(UPLOAD_PATH, status_code=202, response_model=JobAccepted, responses=upload_errors, openapi_extra={
        "requestBody": {"required": True, "content": {
            "application/x-ndjson": {"schema": {"type": "string"}},
            "application/jsonl": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
            "multipart/form-data": {"schema": {"type": "object", "properties": {
                "file": {"type": "string", "format": "binary"}}, "required": ["file"]}}}}})
    async def add_documents(request: Request, index: str | None = None) -> Response:
        """Add passages while serving: a JSONL body (`application/x-ndjson`), a JSON array, or a multipart file
        upload, each record `{"title", "text"}` with an optional `"id"` (the corpus format of `routerag build-graph`).
        The body is checked and kept before the answer: `{"job"}`, which `GET /jobs/{job}` follows. The job runs the
        incremental update of `routerag index add` and then swaps the new version in; queries keep being answered
        from the current one meanwhile."""
        name, _ = pick(request, index, write=True, route=UPLOAD_PATH)
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        kind = UPLOAD_TYPES.get(media)
        if kind is None:  # (the request guard refuses these before the body is read)
            raise APIError(415, "unsupported_media_type",
                           f"Content-Type {media or '(none)'!r}: send JSONL (application/x-ndjson), a JSON array "
                           "(application/json) or a file (multipart/form-data, field 'file')")
        if kind == "file":
            body, kind = await _uploaded_file(request)
        else:
            body = await request.body()
        if not body.strip():
            raise APIError(422, "invalid_document", "the body holds no passages")
        return await accept(jobs.submit_add(name, body, kind))

    @app.delete("/documents/{doc_id}", status_code=202, response_model=JobAccepted, responses=job_errors)
    async def delete_document(doc_id: str, request: Request, index: str | None = None) -> Response:
        """Delete one passage by id, in a background job (`GET /jobs/{job}`); an unknown id is a 404 at once."""
        name, _ = pick(request, index, write=True, route="/documents/{doc_id}")
        return await accept(jobs.submit_delete(name, [doc_id]))

    @app.post("/documents/delete", status_code=202, response_model=JobAccepted, responses=job_errors)
    async def delete_documents(req: DeleteDocuments, request: Request) -> Response:
        """Delete passages by id in one job; if any id is unknown, nothing is queued (404 naming them)."""
        name, _ = pick(request, req.index, write=True, route="/documents/delete")
        return await accept(jobs.submit_delete(name, list(req.ids)))

    @app.get("/jobs/{job_id}", response_model=Job, responses={**({401: errors[401]} if keyed else {}),
                                                               404: errors[404]})
    async def job_status(job_id: str, request: Request) -> Job:
        """An ingestion job: its state (queued, running, done, failed), counts, and the error that failed it."""
        job = jobs.jobs.get(job_id)
        if job is None or not access_of(request).can_read(job.index):
            raise APIError(404, "not_found", f"no job {job_id!r}")
        return job

    @app.get("/jobs", response_model=list[Job], responses={**({401: errors[401]} if keyed else {})})
    async def job_list(request: Request, index: str | None = None) -> list[Job]:
        """The ingestion jobs of the indexes this key may read (or of one), newest first, at most 100."""
        access = access_of(request)
        found = [j for j in jobs.jobs.values() if access.can_read(j.index) and index in (None, j.index)]
        return sorted(found, key=lambda j: j.created, reverse=True)[:100]

    # -- OpenAI-compatible chat ---------------------------------------------------------------------------------------

    app.include_router(chat_routes(pick=pick, readable=readable, admit=admit, run_ask=run_ask, answer=answer,
                                   ask_model=ask_model, errors=errors, timeout_s=timeout_s))
    app.include_router(ui_routes(pick=pick, settings=settings, errors=errors))  # GET /ui, POST /explain
    app.include_router(operations_routes(app.title))  # /docs and /redoc from local assets, / → /ui
    app.include_router(document_routes(pick=pick, errors=errors))  # GET /documents

    # -- guards (server/security.py): Host and Origin, the key, the body limit, the content type; metrics outermost,
    #    so they see every response -------------------------------------------------------------------------------------

    public = (*PUBLIC_PATHS, METRICS_PATH) if cfg.public_metrics else PUBLIC_PATHS
    install_guards(app, cfg, ring, media=declared_media(lambda: app.routes), public_paths=public,
                   body_limits={UPLOAD_PATH: (cfg.max_upload_bytes, "server.max_upload_bytes")})
    _customise_openapi(app, with_auth=bool(ring), public=public)
    app.add_middleware(MetricsMiddleware, metrics=metrics,
                       paths=lambda: [getattr(r, "path", "") for r in flat_routes(app.routes)])
    app.add_middleware(ShutdownGuard, draining=lambda: draining(app))
    return app


async def _uploaded_file(request: Request) -> tuple[bytes, str]:
    """The first file of a multipart upload, and how to read it (``.json``: a JSON document, else JSONL)."""
    from starlette.datastructures import UploadFile

    form = await request.form()
    try:
        files = [v for v in form.values() if isinstance(v, UploadFile)]
        if not files:
            raise APIError(422, "invalid_document", "the multipart body holds no file (send it as field 'file')")
        name = (files[0].filename or "").lower()
        return await files[0].read(), "json" if name.endswith(".json") else "jsonl"
    finally:
        await form.close()


def _rss_mb() -> float:
    """This process's resident memory, from /proc (Linux) or resource's peak elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stream_item_schema() -> dict[str, Any]:
    """The OpenAPI ``itemSchema`` (3.2's form for event streams, which FastAPI also emits) of a streamed ``/ask``: one
    alternative per event name, its ``data`` the JSON of that event's model."""
    return {"oneOf": [
        {"type": "object", "required": ["event", "data"],
         "properties": {"event": {"const": name},
                        "data": {"type": "string", "contentMediaType": "application/json",
                                 "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
        for name, model in STREAM_EVENTS.items()]}


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
