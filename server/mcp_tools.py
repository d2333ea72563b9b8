"""An MCP server over one index, for agent frameworks and chat clients that speak the Model Context Protocol.

Two tools on the same :class:`~routerag.engine.Engine` the REST server uses (one index and one policy in memory,
shared by every call, micro-batched by the backends): ``search`` (retrieval without the policy, like ``/retrieve``)
and ``ask`` (the routing policy, like ``/ask``: the answer, its trace and its searches). Built with the official MCP
Python SDK's ``MCPServer``; ``routerag mcp INDEX`` runs it over stdio (the default, what desktop clients launch) or
streamable HTTP. Bad arguments come back as tool errors that say what to change, never as a crashed server.
"""

from __future__ import annotations

import asyncio
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import QueryError
from routerag.vocabulary import Mode

from .protocol import AskResponse

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


def create_mcp(engine: Engine, settings: Settings) -> MCPServer:
    """The MCP server for ``engine``; run it with ``.run("stdio")`` or ``.run("streamable-http", host=, port=)``."""
    srv = MCPServer(name="routerag", instructions=INSTRUCTIONS)
    max_k = settings.server.max_k

    @srv.tool()
    async def search(query: str, mode: Mode = "hybrid", k: int = 3) -> SearchResult:
        """Search the index without the policy: the k best passages for the query in one retrieval mode."""
        if not 1 <= k <= max_k:
            raise ToolError(f"k must be between 1 and {max_k} (server.max_k), got {k}")
        try:
            [res] = await engine.retrieve([query], mode, k)
        except QueryError as exc:
            raise ToolError(str(exc)) from exc
        return SearchResult(documents=[Hit(id=d.id, title=d.title, text=d.text, score=round(d.score, 6))
                                       for d in res.docs], mode=mode, ms=res.ms)

    @srv.tool()
    async def ask(question: str) -> AskResponse:
        """Answer a question with the routing policy: it decides whether, how (passage, graph or both) and how often
        to search, then answers; the trace shows every step."""
        if not question.strip():
            raise ToolError("question is empty")
        t0 = time.perf_counter()
        try:  # the REST server's deadline (server.request_timeout_s) holds here too
            traj = await asyncio.wait_for(engine.ask(question), settings.server.request_timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            raise ToolError(f"the question did not finish within {settings.server.request_timeout_s:g} s "
                            "(server.request_timeout_s)") from None
        return AskResponse.from_summary(traj.summary(), (time.perf_counter() - t0) * 1000)

    return srv


def tool_names(srv: MCPServer) -> list[str]:
    """The registered tools' names (for the CLI's start-up line), through the SDK's public listing; called before
    the server's own event loop starts, so a short-lived loop runs it."""
    return [t.name for t in asyncio.run(srv.list_tools())]
