"""The "see why" web page (``GET /ui``) and the endpoint it draws from (``POST /explain``).

The page is three static files shipped in the package (``server/static/``: plain HTML, JavaScript and CSS, no build
step, nothing fetched from elsewhere). It holds no data: it is public so that a browser can load it, and every call
it makes sends the API key typed on the page (``Authorization: Bearer``), so a server with keys shows nothing without
one. ``/explain`` computes the evidence subgraph in :mod:`routerag.retrieval.explain`; this module only checks the
request, picks the index and runs it off the event loop.

No ``from __future__ import annotations`` here: FastAPI must see the request model built per app as a class, not as
a string it cannot resolve.
"""

import asyncio
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from routerag.config import Settings
from routerag.retrieval import QueryError
from routerag.retrieval.explain import ExplainLimits
from routerag.retrieval.explain import explain as explain_subgraph

from .errors import APIError
from .protocol import ErrorResponse, ExplainRequest, ExplainResponse, explain_model

EXPLAIN_PATH = "/explain"
ASSETS = {"/ui": ("index.html", "text/html; charset=utf-8"),
          "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/ui/style.css": ("style.css", "text/css; charset=utf-8")}
UI_PATHS = tuple(ASSETS)
"""Public: the page and its assets carry no data (the API calls they make need the key)."""
PAGE_HEADERS = {
    # everything comes from this server; no inline script or style, no framing
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> bytes:
    return resources.files("server").joinpath("static", name).read_bytes()


def ui_routes(*, pick: Callable[..., tuple[str, Any]], settings: Settings, errors: dict[int | str, dict[str, Any]],
              max_concurrent: int = 2) -> APIRouter:
    """The page, its assets and ``POST /explain``. ``pick`` is the app's index check (name and key); at most
    ``max_concurrent`` explanations run at once, one more is refused with 503 (it is a tool for a person, not a
    workload)."""
    router = APIRouter()
    files = {path: (_asset(name), media) for path, (name, media) in ASSETS.items()}
    request_model = explain_model(settings.server, settings.retrieval.max_query_chars)
    timeout_s = settings.server.request_timeout_s
    running = [0]  # explanations in flight (checked and counted on the event loop, so no lock is needed)

    def serve(path: str) -> Callable[[], Any]:
        body, media = files[path]

        async def asset() -> Response:
            return Response(body, media_type=media, headers=PAGE_HEADERS)

        return asset

    for path in files:
        router.add_api_route(path, serve(path), methods=["GET"], include_in_schema=False)

    explain_errors = {k: v for k, v in errors.items() if k != 502}
    explain_errors[400] = {"model": ErrorResponse, "description": "A query the retriever refuses."}
    explain_errors[409] = {"model": ErrorResponse, "description": "The index is served from shards: it has no "
                                                                  "graph here."}
    explain_errors[503] = {"model": ErrorResponse, "description": f"`overloaded`: {max_concurrent} explanations "
                                                                  "are running; retry after `Retry-After` seconds.",
                           "headers": errors[503].get("headers", {})}

    @router.post(EXPLAIN_PATH, response_model=ExplainResponse, responses=explain_errors)
    async def explain(req: request_model, request: Request) -> Response:  # type: ignore[valid-type]
        """The evidence subgraph of a graph or hybrid search: its top passages, the seed facts and entities with
        their weights, every drawn vertex's PageRank mass, the strongest paths from the seeds to each top passage,
        and the edges between drawn vertices (relations, synonyms, passage links), laid out for drawing. At most
        `max_nodes` vertices; `truncated` and `omitted` say what the limits left out. The `/ui` page draws it."""
        r: ExplainRequest = req
        name, engine = pick(request, r.index, route=EXPLAIN_PATH)
        retriever = getattr(engine, "retriever", None)
        if retriever is None:
            raise APIError(409, "conflict", f"index {name!r} is served from shards, so this server holds no graph "
                                            "to explain: ask /explain on a shard server")
        if running[0] >= max_concurrent:
            raise APIError(503, "overloaded", f"{max_concurrent} explanations are running; retry shortly",
                           {"Retry-After": "1"})
        limits = ExplainLimits(max_nodes=r.max_nodes, max_seeds=r.max_seeds, paths_per_passage=r.paths_per_passage,
                               max_hops=r.max_hops)
        running[0] += 1
        try:
            try:
                found = await asyncio.wait_for(
                    asyncio.to_thread(explain_subgraph, retriever, r.query, r.mode, r.k or settings.retrieval.k, limits),
                    timeout_s)
            except QueryError as exc:
                raise APIError(400, "invalid_query", str(exc)) from None
            except (TimeoutError, asyncio.TimeoutError):
                raise APIError(504, "timeout", f"the explanation did not finish within {timeout_s:g} s "
                                               "(server.request_timeout_s)") from None
        finally:
            running[0] -= 1
        body = ExplainResponse.model_validate({**found.to_json(), "index": name})
        return Response(body.model_dump_json(), media_type="application/json")

    return router
