"""Who may do what, and the request guards that run before any parsing: the Host and Origin allow-lists, the API
keys, the body-size limit and the content type. :func:`install_guards` puts them on an app, the same way for the REST
server and the MCP streamable-HTTP transport; docs/security.md describes the model.

All are plain ASGI middlewares rather than FastAPI dependencies, because FastAPI reads and parses the body before it
solves dependencies: an unauthenticated, cross-site or oversized request must be turned away before its body is read
into memory or parsed, and without depending on which route it targets.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from routerag.config import ServerConfig

from .errors import APIError, error_body


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape of the API: ``{"error": {"type", "message", "param", "code"}}``."""
    return JSONResponse(error_body(kind, message), status_code=status, headers=headers)


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
NO_ACCESS = Access(frozenset(), False)
"""A caller without a key on a public path of a server with keys: it may see that the server lives, nothing more."""
ACCESS_STATE = "routerag_access"
"""Where the middleware leaves the caller's :class:`Access` in the request scope's ``state``."""


def key_ring(cfg: ServerConfig, served: Iterable[str]) -> dict[bytes, Access]:
    """Every configured key and what it allows (empty: the server is open). Index names in ``index_keys`` that the
    server does not serve are a configuration error, so a typo cannot hand a key nothing, or the wrong index.

    A key given two roles, or an empty key, is refused (``ServerConfig`` already refuses both when the settings are
    read; this keeps the ring right for settings built any other way): the ring is a lookup by key, so a second role
    would silently replace the first."""
    served = set(served)
    admin = cfg.admin_key.get_secret_value() if cfg.admin_key is not None else ""
    named: list[tuple[str, str, Access]] = []
    for n, entry in enumerate(cfg.index_keys):
        unknown = sorted(set(entry.indexes) - served)
        if unknown:
            raise ValueError(f"server.index_keys[{n}].indexes: {', '.join(map(repr, unknown))} not served (serving "
                             f"{', '.join(sorted(served))})")
        named.append((f"server.index_keys[{n}].key", entry.key.get_secret_value(),
                      Access(frozenset(entry.indexes), not admin)))
    if cfg.api_key is not None:
        named.append(("server.api_key", cfg.api_key.get_secret_value(), Access(None, not admin)))
    if cfg.admin_key is not None:
        named.append(("server.admin_key", admin, Access(None, True)))
    ring: dict[bytes, Access] = {}
    owner: dict[bytes, str] = {}
    for setting, key, access in named:
        raw = key.encode()
        if not key.strip():
            raise ValueError(f"{setting}: a key may not be empty")
        if raw in ring:
            raise ValueError(f"{setting} is the same key as {owner[raw]}: a key has one role, give each its own key")
        ring[raw], owner[raw] = access, setting
    return ring


def access_in(scope: Scope, keyed: bool) -> Access:
    """The caller's access, as the auth middleware left it in the request scope; without it, everything on a server
    without keys, nothing on one with keys (fail closed: an app mounted without the middleware serves no one)."""
    found = scope.get("state", {}).get(ACCESS_STATE)
    if found is not None:
        return found
    return NO_ACCESS if keyed else OPEN


def visible_index(access: Access, served: Sequence[str], name: str | None) -> str:
    """The index a request names (or the only one this key may use), or the error that says it cannot.

    An index the key may not read gets the same 404, with the same message, as one that does not exist: a status or
    a message that differed would tell a key limited to one index the names of the others."""
    visible = [n for n in served if access.can_read(n)]
    listed = ", ".join(visible) or "none for this key"
    if name is None:
        if len(served) == 1:
            name = served[0]
        elif len(visible) == 1:
            return visible[0]
        else:
            raise APIError(422, "validation_error", f"index: required, this key may use: {listed}")
    if name not in visible:
        raise APIError(404, "not_found", f"no index named {name!r} (this key may use: {listed})")
    return name


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


JSON = ("application/json",)
"""The media type of every JSON route (``application/<anything>+json`` matches it too)."""
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Methods that change state: browsers send them cross-site (with a form, or ``fetch`` in ``no-cors`` mode) only
with an ``Origin`` header, which the guard checks."""
MediaLookup = Callable[[Scope], Sequence[str] | None]
"""A request's route → the body media types it accepts (None: no body, so no check)."""


def media_matches(value: bytes | None, accepted: Sequence[str]) -> bool:
    """Whether a ``Content-Type`` header is one of ``accepted`` (parameters ignored; JSON also as ``+json``)."""
    if value is None:
        return False
    media = value.split(b";", 1)[0].strip().lower().decode("latin-1")
    return media in accepted or ("application/json" in accepted and is_json_media_type(value))


def flat_routes(routes: Sequence[Any]) -> list[Any]:
    """An app's routes with included routers flattened (FastAPI keeps an included router as one lazy entry), each
    with its ``path``, ``methods``, ``path_regex`` and, for an API route, ``body_field`` and ``openapi_extra``."""
    from fastapi import routing

    walk = getattr(routing, "iter_route_contexts", None)  # FastAPI's own walk for its OpenAPI schema (>= 0.120)
    return list(walk(routes)) if walk is not None else list(routes)


def declared_media(routes: Callable[[], Sequence[Any]]) -> MediaLookup:
    """The media types each route of an app declares for its body: an upload route's from the request body of its
    OpenAPI description (``openapi_extra``), JSON for one with a body model, nothing for a route without a body.
    Read from the routes themselves, so a new route is guarded as it is declared, with no list to keep."""
    table: list[tuple[Any, frozenset[str], Sequence[str] | None]] = []

    def accepted(route: Any) -> Sequence[str] | None:
        extra = (getattr(route, "openapi_extra", None) or {}).get("requestBody", {}).get("content")
        if extra:
            return tuple(extra)
        return JSON if getattr(route, "body_field", None) is not None else None

    def lookup(scope: Scope) -> Sequence[str] | None:
        if not table:  # built on the first request, once every route is registered
            table.extend((r.path_regex, frozenset(r.methods or ()), accepted(r)) for r in flat_routes(routes())
                         if getattr(r, "path_regex", None) is not None)
        path, method = scope.get("path", ""), scope.get("method", "")
        return next((media for regex, methods, media in table if method in methods and regex.match(path)), None)

    return lookup


def fixed_media(routes: Mapping[tuple[str, str], Sequence[str]]) -> MediaLookup:
    """The media types of an app that is not a FastAPI app (the MCP transport), by method and path."""
    return lambda scope: routes.get((scope.get("method", ""), scope.get("path", "")))


class ContentTypeGuard:
    """415 for a state-changing request whose ``Content-Type`` is not one its route declares (JSON, or an upload
    route's types), or missing, before the body is parsed.

    FastAPI would not parse such a body and answer 422 "field required", blaming the content. A missing type is
    refused too: browsers send cross-site requests without a preflight only with ``text/plain``, a form or
    multipart, which is why FastAPI does not parse them either. Installed inside the body limit, so the client has
    sent its (bounded) body and reads the 415 rather than a reset."""

    def __init__(self, app: ASGIApp, *, media: MediaLookup) -> None:
        self.app = app
        self.media = media

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        accepted = self.media(scope)
        got = _header(scope, b"content-type")
        if accepted is None or media_matches(got, accepted):
            await self.app(scope, receive, send)
            return
        what = f"Content-Type {got.decode('latin-1')!r}" if got is not None else "a request without a Content-Type"
        wanted = ("send the body as JSON with 'Content-Type: application/json'" if tuple(accepted) == JSON else
                  f"send one of: {', '.join(accepted)}")
        await error_response(415, "unsupported_media_type", f"{what} is not accepted: {wanted}")(scope, receive, send)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")


def _hostname(netloc: str) -> str:
    """``host[:port]`` or ``[v6]:port`` → the host, lower case, without brackets."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class OriginPolicy:
    """Which ``Host`` names the server answers (None: any) and which browser origins may change state (None: those
    on an allowed host); ``server.allowed_hosts`` and ``server.allowed_origins``, with their defaults."""

    hosts: frozenset[str] | None
    origins: frozenset[str] | None
    any_origin: bool = False

    @classmethod
    def from_settings(cls, cfg: ServerConfig) -> OriginPolicy:
        if cfg.allowed_hosts is not None:
            hosts = None if "*" in cfg.allowed_hosts else frozenset(_hostname(h) for h in cfg.allowed_hosts)
        elif _is_loopback(cfg.host):
            hosts = frozenset(LOOPBACK_NAMES)
        elif cfg.host.strip() in WILDCARD_BINDS:
            hosts = None
        else:
            hosts = frozenset({_hostname(cfg.host)})
        origins = cfg.allowed_origins
        return cls(hosts, None if origins is None else frozenset(o.strip().lower().rstrip("/") for o in origins),
                   origins is not None and "*" in origins)

    def host_ok(self, host: bytes | None) -> bool:
        if self.hosts is None:
            return True
        return host is not None and _hostname(host.decode("latin-1")) in self.hosts

    def origin_ok(self, origin: bytes, host: bytes | None) -> bool:
        if self.any_origin:
            return True
        value = origin.decode("latin-1").strip().lower().rstrip("/")
        if self.origins is not None and value in self.origins:
            return True
        scheme, sep, netloc = value.partition("://")
        if not sep or scheme not in ("http", "https"):
            return False  # "null" (a sandboxed frame, a file), or something that is no origin
        if host is not None and netloc == host.decode("latin-1").strip().lower():
            return True  # same origin: the server's own page (/ui)
        return self.origins is None and self.hosts is not None and _hostname(netloc) in self.hosts


class HostOriginGuard:
    """421 for a ``Host`` the server does not answer to (DNS rebinding: a page on ``attacker.example`` whose name
    now resolves to 127.0.0.1), and 403 for a state-changing request from a browser origin not allowed, both from
    the headers alone, before auth and before the body is read. A request without ``Origin`` is not a browser's
    (browsers send it on every cross-origin ``POST``) and passes; its key, if the server has keys, is what counts."""

    def __init__(self, app: ASGIApp, *, policy: OriginPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if not self.policy.host_ok(host):
            shown = host.decode("latin-1") if host is not None else "(none)"
            await error_response(421, "misdirected_request", f"Host {shown!r} is not served here (server."
                                 "allowed_hosts)")(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        if origin is not None and scope.get("method") in WRITE_METHODS and not self.policy.origin_ok(origin, host):
            await error_response(403, "forbidden", f"requests from origin {origin.decode('latin-1')!r} may not "
                                 "change anything here (server.allowed_origins)")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def install_guards(app: Any, cfg: ServerConfig, ring: dict[bytes, Access], *, media: MediaLookup,
                   public_paths: Iterable[str] = (), body_limits: dict[str, tuple[int, str]] | None = None) -> None:
    """Put the guards on a Starlette app, outermost first: Host and Origin, then the key (when the server has keys),
    then the body limit, then the content type. The REST app and the MCP transport both take them from here."""
    # add_middleware wraps: the last one added runs first
    app.add_middleware(ContentTypeGuard, media=media)
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_body_bytes, per_path=body_limits)
    if ring:
        app.add_middleware(APIKeyMiddleware, keys=ring, public_paths=public_paths)
    app.add_middleware(HostOriginGuard, policy=OriginPolicy.from_settings(cfg))


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
