"""Request guards that run before any parsing: the optional API key, the JSON content type and the body-size limit.

Both are plain ASGI middlewares rather than FastAPI dependencies, because FastAPI reads and parses the body before it
solves dependencies: an unauthenticated or oversized request must be turned away before its body is read into
memory or parsed, and without depending on which route it targets.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from routerag.config import ServerConfig

from .protocol import ErrorDetail, ErrorResponse


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape of the API: ``{"error": {"type", "message"}}``."""
    body = ErrorResponse(error=ErrorDetail(type=kind, message=message)).model_dump()
    return JSONResponse(body, status_code=status, headers=headers)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


@dataclass(frozen=True, slots=True)
class Access:
    """What the caller's key allows: the indexes it may read (None: all) and whether it may write to them."""

    indexes: frozenset[str] | None
    write: bool

    def can_read(self, index: str) -> bool:
        return self.indexes is None or index in self.indexes

    def can_write(self, index: str) -> bool:
        return self.write and self.can_read(index)


OPEN = Access(None, True)
"""A server without keys: anyone may read and write."""
ACCESS_STATE = "routerag_access"
"""Where the middleware leaves the caller's :class:`Access` in the request scope's ``state``."""


def key_ring(cfg: ServerConfig, served: Iterable[str]) -> dict[bytes, Access]:
    """Every configured key and what it allows (empty: the server is open). Index names in ``index_keys`` that the
    server does not serve are a configuration error, so a typo cannot hand a key nothing, or the wrong index."""
    served = set(served)
    admin = cfg.admin_key.get_secret_value() if cfg.admin_key is not None else ""
    ring: dict[bytes, Access] = {}
    for n, entry in enumerate(cfg.index_keys):
        unknown = sorted(set(entry.indexes) - served)
        if unknown:
            raise ValueError(f"server.index_keys[{n}].indexes: {', '.join(map(repr, unknown))} not served (serving "
                             f"{', '.join(sorted(served))})")
        ring[entry.key.get_secret_value().encode()] = Access(frozenset(entry.indexes), not admin)
    if cfg.api_key is not None and cfg.api_key.get_secret_value():
        ring[cfg.api_key.get_secret_value().encode()] = Access(None, not admin)
    if admin:
        ring[admin.encode()] = Access(None, True)
    if b"" in ring:
        raise ValueError("server.index_keys: a key may not be empty")
    return ring


class APIKeyMiddleware:
    """``Authorization: Bearer <key>`` on every path except ``public_paths`` (liveness and the API docs); the key's
    :class:`Access` goes into the request's state for the routes, which check it per index.

    Each comparison is constant-time. Without keys configured the middleware is not installed at all. A public path
    still learns the caller's access when a valid key comes with it (``/health`` then lists the key's indexes)."""

    def __init__(self, app: ASGIApp, *, keys: dict[bytes, Access], public_paths: Iterable[str] = ()) -> None:
        if not keys:
            raise ValueError("APIKeyMiddleware needs at least one key")
        self.app = app
        self.keys = keys
        self.public = frozenset(public_paths)

    def _lookup(self, token: bytes) -> Access | None:
        found = None
        for key, access in self.keys.items():  # no early exit: the time does not depend on which key matched
            if hmac.compare_digest(token, key):
                found = access
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = _header(scope, b"authorization")
        scheme, _, token = (raw or b"").strip().partition(b" ")
        access = self._lookup(token.strip()) if scheme.lower() == b"bearer" else None
        if scope.get("path") in self.public:
            if access is not None:
                scope.setdefault("state", {})[ACCESS_STATE] = access
            await self.app(scope, receive, send)
            return
        if raw is None:
            response = error_response(401, "authentication_error",
                                      "missing API key: send the header 'Authorization: Bearer <key>'",
                                      {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        if access is None:
            response = error_response(401, "authentication_error", "invalid API key",
                                      {"WWW-Authenticate": 'Bearer error="invalid_token"'})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[ACCESS_STATE] = access
        await self.app(scope, receive, send)


def is_json_media_type(value: bytes | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters (charset) allowed."""
    if value is None:
        return False
    media = value.split(b";", 1)[0].strip().lower()
    kind, _, subtype = media.partition(b"/")
    return kind == b"application" and (subtype == b"json" or subtype.endswith(b"+json"))


class JSONContentTypeMiddleware:
    """415 for a ``POST`` to a JSON route whose ``Content-Type`` is not JSON, or missing, before the body is read.

    FastAPI would not parse such a body and answer 422 "field required", blaming the content. A missing type is
    refused too: browsers send cross-site requests without a preflight only with non-JSON types, which is why FastAPI
    does not parse them either."""

    def __init__(self, app: ASGIApp, *, paths: Iterable[str]) -> None:
        self.app = app
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in self.paths
                or is_json_media_type(_header(scope, b"content-type"))):
            await self.app(scope, receive, send)
            return
        got = _header(scope, b"content-type")
        what = f"Content-Type {got.decode('latin-1')!r}" if got is not None else "a request without a Content-Type"
        response = error_response(415, "unsupported_media_type", f"{what} is not accepted: send the body as JSON "
                                                                 "with 'Content-Type: application/json'")
        await response(scope, receive, send)


class BodyLimitMiddleware:
    """Turn away request bodies over ``max_bytes`` with 413, before the app sees them.

    A declared ``Content-Length`` over the limit is refused without parsing anything; a body without one (chunked)
    is counted as it arrives and refused as soon as it passes the limit. Before answering, up to ``drain_bytes`` of
    the refused body are read and dropped: a client that sends its whole body before reading the answer (most do)
    then gets the 413, where closing on unread data would reset the connection under it. Bigger bodies are cut
    off. An accepted body is buffered (it is small by construction) and handed to the app in one message; later
    ``receive`` calls go to the client, so the app still hears a disconnect (Server-Sent Events rely on it)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, drain_bytes: int = 1 << 20,
                 per_path: dict[str, tuple[int, str]] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.drain_bytes = drain_bytes
        self.per_path = per_path or {}
        """path → (limit, the setting that sets it): uploads get a larger limit than questions."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit, setting = self.per_path.get(scope.get("path", ""), (self.max_bytes, "server.max_body_bytes"))
        await self._limited(scope, receive, send, limit, setting)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, size: int | None, seen: int,
                      more: bool, limit: int, setting: str) -> None:
        while more and seen <= self.drain_bytes and (size is None or size <= self.drain_bytes):
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            seen += len(message.get("body", b""))
            more = message.get("more_body", False)
        what = f"request body of {size} bytes" if size is not None else "request body"
        response = error_response(413, "request_too_large",
                                  f"{what} is over the limit of {limit} bytes ({setting})",
                                  {"Connection": "close"} if more else None)
        await response(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send, limit: int, setting: str) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                size = int(declared)
                if size < 0:
                    raise ValueError
            except ValueError:
                await error_response(400, "bad_request", "invalid Content-Length header")(scope, receive, send)
                return
            if size > limit:
                await self._reject(scope, receive, send, size, 0, True, limit, setting)
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nobody to answer
            body = message.get("body", b"")
            total += len(body)
            more = message.get("more_body", False)
            if total > limit:
                await self._reject(scope, receive, send, None, total, more, limit, setting)
                return
            if body:
                chunks.append(body)
            if not more:
                break
        buffered: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal buffered
            if buffered is not None:
                message, buffered = buffered, None
                return message
            return await receive()

        await self.app(scope, replay, send)
