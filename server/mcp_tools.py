"""An MCP server over one index or several, for agent frameworks and chat clients that speak the Model Context
Protocol.

Two tools on the same :class:`~routerag.engine.Engine` the REST server uses (the indexes and one policy in memory,
shared by every call, micro-batched by the backends): ``search`` (retrieval without the policy, like ``/retrieve``)
and ``ask`` (the routing policy, like ``/ask``: the answer, its trace and its searches). Built with the official MCP
Python SDK's ``MCPServer``; ``routerag mcp INDEX`` runs it over stdio (the default, what desktop clients launch) or
streamable HTTP (:func:`mcp_http_app`). Bad arguments come back as tool errors that say what to change, never as a
crashed server.

Both tools pass admission gates with the REST server's bounds (``server.max_inflight`` / ``max_queue`` for ``ask``,
``server.retrieve_max_inflight`` / ``retrieve_max_queue`` for ``search``; :mod:`server.admission`): beyond them a
call is refused at once with a tool error that says when to retry, so a burst of agent calls cannot pile unbounded
work onto the policy. The deadline (``server.request_timeout_s``) counts from the call's arrival, queueing included.

Over HTTP the tools are behind the REST server's guards and keys (:func:`server.security.install_guards`): the key of
the call's own HTTP request decides which indexes a tool may use, with the REST server's rules (an index the key may
not see is as unknown as one not served). The arguments pass the REST request models, so their limits (question
length, k, query length) are the same. Over stdio the client that launched the process owns it: no keys.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field, ValidationError

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval.types import QueryError
from routerag.vocabulary import Mode

from .admission import Gate, Overloaded, ask_limits, retrieve_limits
from .cancellation import ShutdownGuard
from .errors import APIError
from .protocol import AskResponse, request_models
from .security import JSON, OPEN, access_in, fixed_media, install_guards, key_ring, visible_index

T = TypeVar("T")
MCP_PATH = "/mcp"
INDEX_ARG = "The index to use; may be omitted when the server (or your key) has one."
INSTRUCTIONS = ("RouteRAG over one document index. `search` returns the passages a dense (passage), knowledge-graph "
                "(graph) or fused (hybrid) search finds for a query; `ask` lets the routing policy search as it "
                "sees fit and answer, with its trace.")


class Hit(BaseModel):
    id: str
    title: str
    text: str
    score: float


class SearchResult(BaseModel):
    documents: list[Hit] = Field(description="Best first.")
    mode: Mode
    ms: float = Field(description="Retrieval compute time.")


def _arguments(model: type[BaseModel], **fields: Any) -> Any:
    """The tool's arguments through the REST request model: its limits, and its messages, as a tool error."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ToolError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                                  for e in exc.errors()[:8])) from None


async def admitted(gate: Gate, work: Callable[[], Awaitable[T]], timeout_s: float, what: str) -> T:
    """``work()`` once ``gate`` admits it, within ``timeout_s`` of the call's arrival (queueing included); a refusal
    or the deadline as a tool error. ``work`` is a callable so that a refused call never creates its coroutine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    slot = gate.try_acquire()
    if slot is None:
        try:
            slot = await gate.acquire(deadline)
        except Overloaded as exc:
            raise ToolError(f"overloaded: {exc.message}; retry in {exc.retry_after_s} s") from None
    served = False
    try:
        result = await asyncio.wait_for(work(), max(0.0, deadline - loop.time()))
        served = True
        return result
    except (TimeoutError, asyncio.TimeoutError):
        served = True  # a lower bound of the service time, as the REST gates count it
        raise ToolError(f"the {what} did not finish within {timeout_s:g} s (server.request_timeout_s)") from None
    finally:
        slot.release(served)


def create_mcp(engines: Engine | Mapping[str, Engine], settings: Settings) -> MCPServer:
    """The MCP server for ``engines`` (one, served under its directory's name, or several by name); run it with
    ``.run("stdio")``, or over HTTP as :func:`mcp_http_app`."""
    from .service import served_name

    served = dict(engines) if isinstance(engines, Mapping) else {served_name(engines): engines}
    keyed = bool(key_ring(settings.server, served))
    ask_model, retrieve_model = request_models(settings.server, settings.retrieval.max_query_chars)
    srv = MCPServer(name="routerag", instructions=INSTRUCTIONS)
    max_k = settings.server.max_k
    timeout_s = settings.server.request_timeout_s
    first = next(iter(served.values()))
    gates = {"ask": Gate("mcp:ask", ask_limits(settings, getattr(first, "generator", None))),
             "search": Gate("mcp:search", retrieve_limits(settings))}

    def target(ctx: Context, index: str | None) -> tuple[str, Engine]:
        """The index the call may use, by the key of its HTTP request (stdio: the launching client's own)."""
        request = ctx.request_context.request if ctx is not None else None
        access = OPEN if request is None else access_in(request.scope, keyed)
        try:
            name = visible_index(access, list(served), index)
        except APIError as exc:
            raise ToolError(exc.message) from None
        return name, served[name]

    @srv.tool()
    async def search(query: str, ctx: Context, mode: Mode = "hybrid", k: int = settings.retrieval.k,
                     index: Annotated[str | None, Field(description=INDEX_ARG)] = None) -> SearchResult:
        """Search the index without the policy: the k best passages for the query in one retrieval mode."""
        if not 1 <= k <= max_k:
            raise ToolError(f"k must be between 1 and {max_k} (server.max_k), got {k}")
        if not query.strip():
            raise ToolError("query is empty")
        _arguments(retrieve_model, queries=[query], topk=k, mode=mode, index=index)
        _, engine = target(ctx, index)
        try:
            [res] = await admitted(gates["search"], lambda: engine.retrieve([query], mode, k), timeout_s, "search")
        except QueryError as exc:
            raise ToolError(str(exc)) from exc
        return SearchResult(documents=[Hit(id=d.id, title=d.title, text=d.text, score=round(d.score, 6))
                                       for d in res.docs], mode=mode, ms=res.ms)

    @srv.tool()
    async def ask(question: str, ctx: Context,
                  index: Annotated[str | None, Field(description=INDEX_ARG)] = None) -> AskResponse:
        """Answer a question with the routing policy: it decides whether, how (passage, graph or both) and how often
        to search, then answers; the trace shows every step."""
        if not question.strip():
            raise ToolError("question is empty")
        _arguments(ask_model, question=question, index=index)
        _, engine = target(ctx, index)
        t0 = time.perf_counter()
        traj = await admitted(gates["ask"], lambda: engine.ask(question), timeout_s, "question")
        return AskResponse.from_summary(traj.summary(), (time.perf_counter() - t0) * 1000)

    return srv


def mcp_http_app(srv: MCPServer, settings: Settings, served: Iterable[str]) -> Any:
    """The streamable-HTTP transport (``/mcp``) as an ASGI app behind the REST server's guards: Host and Origin
    (``server.allowed_hosts``, ``server.allowed_origins``; the SDK's own DNS-rebinding check is off, so one setting
    decides), the keys (``server.api_key``, ``admin_key``, ``index_keys``) and the body limit. Run it with uvicorn
    (``lifespan="on"``: the SDK's session manager starts there)."""
    cfg = settings.server
    app = srv.streamable_http_app(streamable_http_path=MCP_PATH, host=cfg.host,
                                  transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    install_guards(app, cfg, key_ring(cfg, served), media=fixed_media({("POST", MCP_PATH): JSON}))
    app.add_middleware(ShutdownGuard)
    return app


def tool_names(srv: MCPServer) -> list[str]:
    """The registered tools' names (for the CLI's start-up line), through the SDK's public listing; called before
    the server's own event loop starts, so a short-lived loop runs it."""
    return [t.name for t in asyncio.run(srv.list_tools())]
