"""Cancellation shared by every route that runs the policy (``/ask``, ``/v1/chat/completions``): a client that leaves
cancels its work and frees its admission slot, and a server shutting down ends the requests still running without a
traceback.

An abandoned question should not keep the model busy: with client timeouts and retries (the openai client's), the
requests nobody waits for would otherwise fill the admission queue and turn everyone else away with 503s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .security import error_response

log = logging.getLogger(__name__)
T = TypeVar("T")


async def wait_disconnect(request: Request) -> None:
    """Return when the client disconnects. The body has been read by then, so the next ASGI message is the
    disconnect (the body-limit middleware hands later ``receive`` calls to the client)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work``, or cancel it and return None as soon as the client disconnects."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        return None
    finally:
        for t in (task, watch):
            if not t.done():
                t.cancel()


def client_left(request: Request, route: str) -> Response:
    """The answer to a client that left before it: nobody reads it, but the access log and the metrics see nginx's
    499 ("client closed request"), not a 200."""
    request.app.state.metrics.errors.labels(route, "client_disconnected").inc()
    log.info("%s: the client closed the connection before the answer; its work was cancelled", route)
    return error_response(499, "client_disconnected", "the client closed the connection before the answer")


class ShutdownGuard:
    """The outermost middleware, for a server shutting down (:mod:`server.operations`): once it drains, a request
    that arrives is refused at once (503 ``shutting_down``, ``Connection: close``), except ``/health``; a request the
    server cancels (uvicorn cancels those still running when the drain time is over) ends with a logged line and, if
    nothing was sent yet, a 503, instead of one "Exception in ASGI application" traceback per request in flight."""

    def __init__(self, app: ASGIApp, *, draining: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining() and scope.get("path") != "/health":
            await error_response(503, "shutting_down", "the server is shutting down; retry on another replica or "
                                 "after it restarts", {"Connection": "close", "Retry-After": "1"})(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            log.warning("%s %s cancelled: the server is shutting down", scope.get("method"), scope.get("path"))
            if not started:
                await _try_send(error_response(503, "shutting_down", "the server is shutting down; retry on "
                                               "another replica or after it restarts"), scope, receive, send)


async def _try_send(response: Any, scope: Scope, receive: Receive, send: Send) -> None:
    try:
        await response(scope, receive, send)
    except (OSError, RuntimeError, asyncio.CancelledError):  # the connection is already gone
        pass
