"""What an operator needs around the API: the interactive docs served from this server (no CDN, so they work
offline), ``/`` sending a browser to ``/ui``, and a shutdown that drains.

Drain: on SIGTERM or SIGINT the server stops taking work (a request that arrives from then on is answered 503
``shutting_down`` with ``Connection: close``, and ``/ready`` says so), lets the requests in flight finish for up to
``server.drain_timeout_s``, then cancels what is left; :class:`~server.cancellation.ShutdownGuard` turns those into a
logged line and a 503 rather than a traceback each. uvicorn itself stops listening and closes idle connections at the
signal; the flag covers a request already on its way in (a pipelined or keep-alive request read after the signal).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response

DOCS_ASSETS = {"/docs/assets/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
               "/docs/assets/swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
               "/docs/assets/redoc.standalone.js": ("redoc.standalone.js", "text/javascript; charset=utf-8"),
               "/docs/assets/favicon.png": ("favicon.png", "image/png")}
"""Swagger UI's and ReDoc's files, from the ``fastapi-offline`` package (which ships them for this purpose)."""
DOCS_PAGES = ("/docs", "/docs/oauth2-redirect", "/redoc")
DOCS_PATHS = (*DOCS_PAGES, *DOCS_ASSETS)
"""Public, as the schema they show (``/openapi.json``): they hold no data."""
ROOT_PATH = "/"
DRAINING_STATE = "draining"


def _docs_asset(name: str) -> bytes:
    return resources.files("fastapi_offline").joinpath("static", name).read_bytes()


def operations_routes(title: str, openapi_url: str = "/openapi.json") -> APIRouter:
    """``/docs`` (Swagger UI), ``/redoc`` and their assets from this server, and ``/`` → ``/ui``. The app must be made
    with ``docs_url=None, redoc_url=None`` (FastAPI's own pages load their scripts from a CDN)."""
    router = APIRouter()
    favicon = "/docs/assets/favicon.png"

    @router.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=openapi_url, title=f"{title} — Swagger UI",
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css", swagger_favicon_url=favicon,
                                   oauth2_redirect_url="/docs/oauth2-redirect")

    @router.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @router.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=openapi_url, title=f"{title} — ReDoc",
                              redoc_js_url="/docs/assets/redoc.standalone.js", redoc_favicon_url=favicon,
                              with_google_fonts=False)

    def asset(name: str, media: str) -> Callable[[], Any]:
        body: list[bytes] = []  # read on first use: 2.7 MB a server that nobody browses need not hold

        async def serve() -> Response:
            if not body:
                body.append(_docs_asset(name))
            return Response(body[0], media_type=media, headers={"Cache-Control": "public, max-age=86400",
                                                                "X-Content-Type-Options": "nosniff"})
        return serve

    for path, (name, media) in DOCS_ASSETS.items():
        router.add_api_route(path, asset(name, media), methods=["GET"], include_in_schema=False)

    @router.get(ROOT_PATH, include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui", status_code=307)

    return router


def begin_drain(app: FastAPI) -> None:
    """From now on new requests are refused (503 ``shutting_down``) and ``/ready`` fails; those in flight go on."""
    setattr(app.state, DRAINING_STATE, True)


def draining(app: Any) -> bool:
    state = getattr(app, "state", None)
    return bool(getattr(state, DRAINING_STATE, False))


def run(app: FastAPI, *, host: str, port: int, drain_timeout_s: float, access_log: bool) -> None:
    """Serve ``app`` with uvicorn until SIGTERM or SIGINT, then drain (see the module's docstring). Logging is the
    caller's (``log_config=None``: uvicorn's records, access lines included, go to the root logger's handler, so one
    stream and one format carry everything)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            begin_drain(app)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=access_log,
                            timeout_graceful_shutdown=drain_timeout_s)
    DrainingServer(config).run()
