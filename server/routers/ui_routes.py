"""The "see why" web page (``GET /ui``) and the endpoint it draws from (``POST /explain``).

The page is three static files shipped in the package (``server/static/``: plain HTML, JavaScript and CSS, no build
step, nothing fetched from elsewhere). It holds no data: it is public so that a browser can load it, and every call
it makes sends the API key typed on the page (``Authorization: Bearer``), so a server with keys shows nothing without
one. ``/explain`` computes the evidence subgraph in :mod:`routerag.retrieval.explain`; this module only checks the
request and picks the index; :class:`server.service.Service` admits it (at most ``MAX_EXPLANATIONS`` at once, no
queue) and bounds it by the request's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from routerag.retrieval.explain import ExplainLimits
from routerag.retrieval.explain import explain as explain_subgraph

from ..errors import APIError
from ..protocol import ErrorResponse, ExplainRequest, ExplainResponse
from ..service import EXPLAIN, MAX_EXPLANATIONS, Service, service_of
from .common import Responses, json_response, with_body, without

EXPLAIN_PATH = EXPLAIN
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


async def explain(req: ExplainRequest, request: Request) -> Response:
    """The evidence subgraph of a graph or hybrid search: its top passages, the seed facts and entities with
    their weights, every drawn vertex's PageRank mass, the strongest paths from the seeds to each top passage,
    and the edges between drawn vertices (relations, synonyms, passage links), laid out for drawing. At most
    `max_nodes` vertices; `truncated` and `omitted` say what the limits left out. The `/ui` page draws it."""
    service = service_of(request)
    name, engine = service.pick(request, req.index, route=EXPLAIN_PATH)
    retriever = getattr(engine, "retriever", None)
    if retriever is None:
        raise APIError(409, "conflict", f"index {name!r} is served from shards, so this server holds no graph "
                                        "to explain: ask /explain on a shard server")
    limits = ExplainLimits(max_nodes=req.max_nodes, max_seeds=req.max_seeds, paths_per_passage=req.paths_per_passage,
                           max_hops=req.max_hops)
    found = await service.call(request, EXPLAIN, EXPLAIN_PATH, lambda: asyncio.to_thread(
        explain_subgraph, retriever, req.query, req.mode, service.default_k(req.k), limits), interruptible=False)
    if isinstance(found, Response):
        return found
    return json_response(ExplainResponse.model_validate({**found.to_json(), "index": name}))


def _asset(name: str) -> bytes:
    return resources.files("server").joinpath("static", name).read_bytes()


def _serve(body: bytes, media: str) -> Callable[[], Any]:
    async def asset() -> Response:
        return Response(body, media_type=media, headers=PAGE_HEADERS)

    return asset


def ui_routes(service: Service, errors: Responses) -> APIRouter:
    """The page, its assets and ``POST /explain`` with this app's request model."""
    router = APIRouter()
    for path, (name, media) in ASSETS.items():
        router.add_api_route(path, _serve(_asset(name), media), methods=["GET"], include_in_schema=False)
    explain_errors = without(errors, 502)
    explain_errors[400] = {"model": ErrorResponse, "description": "A query the retriever refuses."}
    explain_errors[409] = {"model": ErrorResponse, "description": "The index is served from shards: it has no "
                                                                  "graph here."}
    explain_errors[503] = {"model": ErrorResponse, "description": f"`overloaded`: {MAX_EXPLANATIONS} explanations "
                                                                  "are running; retry after `Retry-After` seconds.",
                           "headers": errors[503].get("headers", {})}
    router.add_api_route(EXPLAIN_PATH, with_body(explain, service.explain_model), methods=["POST"],
                         response_model=ExplainResponse, responses=explain_errors)
    return router
