"""What every route asks of the server, written once: :class:`Service`, one per app, held on ``app.state.service``.

The routers (:mod:`server.routers`) parse a request and shape its answer; the service does the rest:

* **index choice and key checks** (:meth:`Service.pick`): the index a request names, or the only one its key may use;
  one the key may not read is as unknown as one not served, a write needs a key that may write;
* **admission** (:meth:`Service.admit`): a slot on the route's gate (:mod:`server.admission`), or an immediate 503;
* **deadlines** (:meth:`Service.run`): the work gets what is left of ``server.request_timeout_s`` since the request
  arrived, and its exceptions become the errors a client should see (504, 400, 502; anything else stays a logged 500);
* **disconnect cancellation** (:meth:`Service.call`): a client that leaves while queued gives up its place, one that
  leaves while the policy runs cancels the run; either frees its slot and is answered 499 (:mod:`server.cancellation`);
* **running the policy and the retriever** (:meth:`Service.answer`, :meth:`Service.events`,
  :meth:`Service.retrieve`), with their metrics.

Every route that runs the policy (``/ask``, ``/v1/chat/completions``, streamed or not) or the retriever
(``/retrieve``, ``/explain``) goes through :meth:`Service.call` or, streamed, :meth:`Service.admit` and
:meth:`Service.events`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response

from routerag.config import Settings
from routerag.engine import Engine
from routerag.policy.types import Summary, Trajectory
from routerag.retrieval.types import QueryError, RetrievalResult
from routerag.vocabulary import Mode

from .admission import Gate, Limits, Overloaded, Slot, ask_limits, retrieve_limits
from .cancellation import client_left, until_disconnect
from .errors import APIError
from .jobs import JobRunner, Target
from .metrics import ServerMetrics
from .protocol import AskRequest, IndexInfo, Job, explain_model, request_models, shard_stage_model
from .security import Access, access_in, key_ring, visible_index

T = TypeVar("T")
ASK, RETRIEVE, EXPLAIN = "/ask", "/retrieve", "/explain"
"""The gates: the policy's (``/ask`` and the chat completions share it), the retriever's, and the explanations'."""
MAX_EXPLANATIONS = 2
"""``/explain`` runs at most this many at once and queues none: it is a tool for a person, not a workload."""
EXPLAIN_LIMITS = Limits(MAX_EXPLANATIONS, 0, (f"/explain's {MAX_EXPLANATIONS} at once", "no queue"))


def served_name(engine: Engine) -> str:
    """The name an index is served under when none is given: its directory's name."""
    return index_path(engine).name or "default"


def index_path(engine: Engine) -> Path:
    """The directory an engine serves (an engine may have been given the opened index instead of its path)."""
    from graph_index.store import IndexData

    if engine.index is None:
        return Path("shards")
    return engine.index.root if isinstance(engine.index, IndexData) else Path(str(engine.index))


def served_engines(engines: Engine | Mapping[str, Engine]) -> dict[str, Engine]:
    """The engines by the names they are served under; a name that could not be a URL's ``model`` or ``index`` is
    refused here, at start-up."""
    served = dict(engines) if isinstance(engines, Mapping) else {served_name(engines): engines}
    if not served:
        raise ValueError("create_app needs at least one engine")
    for name in served:
        if not name or "/" in name or name != name.strip():
            raise ValueError(f"index name {name!r}: use letters, digits, dots, dashes or underscores")
    return served


def backend_errors() -> tuple[type[BaseException], ...]:
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


def service_of(request: Request) -> Service:
    """The service of the app serving ``request``."""
    service: Service = request.app.state.service
    return service


class Service:
    """The indexes one app serves on one shared policy, with everything a request needs from them. Engines over
    several indexes should share one generator: the admission limits of ``/ask`` come from the first one's.
    ``components`` (per index name, the build's loaded embedder and extractor) serve its ingestion jobs, which
    otherwise load them for every job."""

    def __init__(self, served: Mapping[str, Engine], settings: Settings, *,
                 components: Mapping[str, Any] | None = None) -> None:
        self.served = dict(served)
        self.settings = settings
        cfg = settings.server
        self.timeout_s = cfg.request_timeout_s
        self.ring = key_ring(cfg, self.served)
        self.keyed = bool(self.ring)
        self.ask_model, self.retrieve_model = request_models(cfg, settings.retrieval.max_query_chars)
        self.explain_model = explain_model(cfg, settings.retrieval.max_query_chars)
        self.shard_stage_model = shard_stage_model(cfg, settings.retrieval.max_query_chars)
        self.metrics = ServerMetrics()
        self.backend_errors = backend_errors()
        first = next(iter(self.served.values()))
        self.gates = {ASK: Gate(ASK, ask_limits(settings, getattr(first, "generator", None)), self.metrics),
                      RETRIEVE: Gate(RETRIEVE, retrieve_limits(settings), self.metrics),
                      EXPLAIN: Gate(EXPLAIN, EXPLAIN_LIMITS, self.metrics)}
        for route, gate in self.gates.items():
            self.metrics.admission_limit.labels(route, "in_flight").set(gate.max_inflight)
            self.metrics.admission_limit.labels(route, "queue").set(gate.max_queue)
        self.jobs = JobRunner({name: Target(index_path(e), e.reload, lambda e=e: e.retriever.passages)
                               for name, e in self.served.items() if getattr(e, "shards", None) is None},
                              settings, components=dict(components or {}), max_pending=cfg.max_pending_jobs,
                              on_finish=self._job_finished)

    async def start(self) -> None:
        """Load the graphs and the query encoders off the event loop (``/ready`` answers 503 until then), and
        resume the jobs a killed server left behind (their index still serves its last published version)."""
        for engine in self.served.values():
            if not engine.ready:
                await asyncio.get_running_loop().run_in_executor(None, engine.warm_up)
        self.jobs.resume()

    def _job_finished(self, job: Job) -> None:
        self.metrics.jobs.labels(job.index, job.op, job.state).inc()

    # -- which index, and whether this key may use it ------------------------------------------------------------------

    def access(self, request: Request) -> Access:
        """What the caller's key allows (everything on a server without keys)."""
        return access_in(request.scope, self.keyed)

    def readable(self, request: Request) -> list[str]:
        """The indexes the caller's key may read."""
        access = self.access(request)
        return [n for n in self.served if access.can_read(n)]

    def pick(self, request: Request, name: str | None, *, write: bool = False, route: str = "") -> tuple[str, Engine]:
        """The index a request names (or the only one the key may use), checked against the caller's key: one it
        may not read is as unknown as one not served. ``route`` counts the request in the index's metrics."""
        access = self.access(request)
        name = visible_index(access, list(self.served), name)
        if write and getattr(self.served[name], "shards", None) is not None:
            raise APIError(409, "conflict", f"index {name!r} is served from shards: add and delete documents on "
                                            "the shard servers (a passage can be held by several: its own shard "
                                            "and its neighbours' halos, each listed in the shard's manifest; "
                                            "delete it on each)")
        if write and not access.can_write(name):
            raise APIError(403, "forbidden", f"this key may not change index {name!r}"
                                             + (" (writes need server.admin_key)" if self.settings.server.admin_key
                                                else ""))
        if route:
            self.metrics.index_requests.labels(name, route).inc()
        return name, self.served[name]

    def index_info(self, name: str) -> IndexInfo:
        """An index's size, version, memory and pending jobs (and the same in the metrics' per-index gauges)."""
        engine = self.served[name]
        if getattr(engine, "shards", None) is not None:
            return IndexInfo(name=name, passages=None, version=f"{len(engine.shards.urls)} shards", memory_mb=0.0,
                             jobs_pending=0)
        retriever = engine.retriever
        memory = retriever.memory_bytes() if hasattr(retriever, "memory_bytes") else 0
        version = getattr(getattr(retriever, "data", None), "version", "")
        passages = len(getattr(retriever, "passages", []))
        self.metrics.index_passages.labels(name).set(passages)
        self.metrics.index_memory.labels(name).set(memory)
        return IndexInfo(name=name, passages=passages, version=version, memory_mb=round(memory / 2**20, 1),
                         jobs_pending=len(self.jobs.pending(name)))

    # -- admission, deadline, cancellation: once for every route -------------------------------------------------------

    def deadline(self) -> float:
        """When a request arriving now must be answered (event-loop time)."""
        return asyncio.get_running_loop().time() + self.timeout_s

    async def admit(self, request: Request, gate: str, deadline: float) -> Slot | None:
        """A slot on ``gate``, or None if the client left while it waited (the caller answers
        :func:`~server.cancellation.client_left`); a 503 ``overloaded`` if the gate refuses it."""
        free = self.gates[gate].try_acquire()  # nothing to wait for: no disconnect to watch (two tasks saved)
        if free is not None:
            return free
        try:
            return await until_disconnect(request, self.gates[gate].acquire(deadline))
        except Overloaded as exc:
            self.metrics.errors.labels(gate, "overloaded").inc()
            raise APIError(503, "overloaded", exc.message, {"Retry-After": str(exc.retry_after_s)}) from None

    async def run(self, gate: str, slot: Slot, deadline: float, work: Awaitable[T]) -> T:
        """``work`` within what is left of the request's time, its failures as the client should see them; frees
        ``slot`` however it ends (a run that finished or timed out feeds the gate's service-time estimate)."""
        served = False
        try:
            result = await asyncio.wait_for(work, max(0.0, deadline - asyncio.get_running_loop().time()))
            served = True
            return result
        except Exception as exc:
            served = isinstance(exc, (TimeoutError, asyncio.TimeoutError))  # a lower bound of the service time
            mapped = self._mapped(gate, exc)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            slot.release(served)

    async def call(self, request: Request, gate: str, route: str, work: Callable[[], Awaitable[T]], *,
                   interruptible: bool = True) -> T | Response:
        """``work()`` admitted on ``gate`` and run by the request's deadline. A client that leaves while it waits gives
        up its place and is answered 499; one that leaves while ``work`` runs cancels it too (its slot freed, a 499)
        if it is ``interruptible``: the policy loop stops between turns. A search in a worker thread cannot stop, so
        it runs out (milliseconds) holding its slot, and the gate's bound on running threads holds."""
        deadline = self.deadline()
        slot = await self.admit(request, gate, deadline)
        if slot is None:
            return client_left(request, route)
        running = self.run(gate, slot, deadline, work())
        if not interruptible:
            return await running
        done = await until_disconnect(request, running)
        if done is None:
            slot.release()
            return client_left(request, route)
        return done

    def _mapped(self, gate: str, exc: Exception) -> Exception:
        """An engine exception as the APIError the client should see (others stay internal errors)."""
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            err = APIError(504, "timeout", f"the request did not finish within {self.timeout_s:g} s "
                                           "(server.request_timeout_s)")
        elif isinstance(exc, QueryError):
            err = APIError(400, "invalid_query", str(exc))
        elif isinstance(exc, self.backend_errors):
            err = APIError(502, "backend_error", f"a backend failed: {type(exc).__name__}: {exc}")
        else:  # anything else (a ValueError too) is ours, not the client's: a logged 500
            return exc
        self.metrics.errors.labels(gate, err.kind).inc()
        return err

    # -- the policy and the retriever ----------------------------------------------------------------------------------

    async def answer(self, request: Request, req: AskRequest, target: tuple[str, Engine],
                     route: str) -> Summary | Response:
        """A non-streamed policy run (``/ask``, ``/v1/chat/completions``): its summary, or the 499 of a client that
        left."""
        name, engine = target
        traj = await self.call(request, ASK, route, lambda: _policy_run(engine, req))
        return traj if isinstance(traj, Response) else self._summarised(name, traj)

    async def events(self, req: AskRequest, target: tuple[str, Engine], slot: Slot,
                     deadline: float) -> AsyncGenerator[dict[str, Any] | Summary, None]:
        """A streamed policy run on an admitted ``slot``: the loop's events as they happen, then its summary (its
        failure, mapped as :meth:`run` maps it, is raised instead). The run is a task of its own, cancelled and its
        slot freed as soon as the consumer stops (a client that left)."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        name, engine = target
        task = asyncio.ensure_future(self.run(ASK, slot, deadline, _policy_run(engine, req, queue.put_nowait)))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
            yield self._summarised(name, task.result())
        finally:
            if not task.done():
                task.cancel()
            slot.release()  # (run frees it; this covers a task cancelled before it started)

    async def retrieve(self, request: Request, queries: list[str], mode: Mode, k: int,
                       target: tuple[str, Engine]) -> list[RetrievalResult] | Response:
        """Batched retrieval without the policy (``/retrieve``), or the 499 of a client that left."""
        name, engine = target
        results = await self.call(request, RETRIEVE, RETRIEVE, lambda: engine.retrieve(queries, mode, k),
                                  interruptible=False)
        if not isinstance(results, Response):
            self.metrics.searches.labels(mode, "retrieve", name).inc(len(results))
        return results

    def default_k(self, k: int | None) -> int:
        """Documents per search when a request names none: ``retrieval.k`` (its default is the loop's ``k``)."""
        return k or self.settings.retrieval.k

    def _summarised(self, name: str, traj: Trajectory) -> Summary:
        summary = traj.summary()
        for search in summary.searches:
            self.metrics.searches.labels(search.mode, "ask", name).inc()
        self.metrics.finish.labels(summary.finish, name).inc()
        return summary


def _policy_run(engine: Engine, req: AskRequest, on_event: Callable[[dict[str, Any]], Any] | None = None
                ) -> Awaitable[Trajectory]:
    return engine.ask(req.question, mode=req.mode, budget=req.budget, k=req.k, on_event=on_event)


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """The app's start-up: :meth:`Service.start`."""
    await app.state.service.start()
    yield
