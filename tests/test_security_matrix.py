"""The security matrix: every route of the REST app and of the MCP transport × every kind of credential × every index,
against live servers over two indexes built from the test fixtures (the two-hop corpus and the Curie corpus).

Each cell asserts the allowed outcome (the status, or for MCP the refusal or tool error) and that the body holds no
data of an index the request had no business seeing: neither its name (unless the request sent it) nor its passages'
titles or ids. A route registered in either app that has no row here fails :func:`test_every_route_is_in_the_table`,
so a new route cannot ship unexamined.

Keys: ``reader`` is ``server.api_key`` (every index, read only, since an admin key is set), ``limited`` an
``index_keys`` entry for ``twohop`` only, ``admin`` ``server.admin_key``; ``wrong`` is no configured key.
"""

from __future__ import annotations

import asyncio
import json
import time
from importlib import resources
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import pytest

from routerag.config import RetrievalConfig, Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app
from server.mcp_tools import create_mcp, mcp_http_app
from server.security import flat_routes

from .helpers.curie_index import build_curie_index
from .helpers.server_helpers import RoutingPolicy, build_small_index, live_server

INDEXES = ("twohop", "curie")
QUESTION = {"twohop": "Where was Joran Veld born?", "curie": "Where was Marie Curie born?"}
KEYS = {"none": None, "wrong": "not-a-key", "reader": "reader-key", "limited": "twohop-key", "admin": "admin-key"}
VISIBLE = {"none": set(), "wrong": set(), "reader": set(INDEXES), "limited": {"twohop"}, "admin": set(INDEXES)}
Kind = Literal["public", "list", "read", "write"]
"""public: no key needed, lists only what the key sees; list: key needed, lists what it sees; read / write: one index,
named by the request."""


@dataclass(frozen=True)
class Served:
    rest: str
    mcp: str
    jobs: dict[str, str]
    """A finished job per index (for GET /jobs/{job_id})."""
    secrets: dict[str, list[str]]
    """Per index, what must not leak: its passages' titles and ids."""
    existing: dict[str, dict[str, str]]
    """Per index, one passage it already holds (an upload of it changes nothing)."""
    routes: set[tuple[str, str]]
    mcp_routes: set[tuple[str, str]]


def _wait(c: httpx.Client, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (state := c.get(f"/jobs/{job}").json())["state"] not in ("done", "failed"):
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    return state


@pytest.fixture(scope="module")
def served(tmp_path_factory, minilm, spacy_extractor) -> Iterator[Served]:
    from graph_index.builder import Components

    root = tmp_path_factory.mktemp("matrix")
    paths = {"twohop": build_small_index(root / "twohop" / "idx", minilm, spacy_extractor),
             "curie": build_curie_index(root / "curie", minilm) / "idx"}
    settings = Settings(cache_dir=root / "cache", server={
        "api_key": KEYS["reader"], "admin_key": KEYS["admin"],
        "index_keys": [{"key": KEYS["limited"], "indexes": ["twohop"]}]})
    policy = RoutingPolicy("[graph]")
    engines = {n: Engine(p, settings, generator=policy, retriever=Retriever(p, RetrievalConfig(), embedder=minilm))
               for n, p in paths.items()}
    for e in engines.values():
        e.warm_up()
    components = {n: Components(settings, embedder=minilm, extractor=spacy_extractor) for n in paths}
    app = create_app(engines, settings, components=components)
    mcp_app = mcp_http_app(create_mcp(engines, settings), settings, engines)
    secrets = {n: sorted({p.title for p in e.retriever.passages} | {p.id for p in e.retriever.passages})
               for n, e in engines.items()}
    existing = {n: {"id": e.retriever.passages[0].id, "title": e.retriever.passages[0].title,
                    "text": e.retriever.passages[0].text} for n, e in engines.items()}
    routes = {(m, r.path) for r in flat_routes(app.routes) for m in (r.methods or {"*"}) if m != "HEAD"}
    mcp_routes = {(m, r.path) for r in mcp_app.routes for m in (getattr(r, "methods", None) or {"*"}) if m != "HEAD"}
    with live_server(app) as rest, live_server(mcp_app, lifespan="on") as mcp:
        with httpx.Client(base_url=rest, timeout=60, headers={"Authorization": f"Bearer {KEYS['admin']}"}) as c:
            jobs = {}
            for n in INDEXES:  # an upload of a passage already there: a job that changes nothing
                r = c.post("/documents", params={"index": n}, json=[existing[n]])
                assert r.status_code == 202, r.text
                jobs[n] = r.json()["job"]
                assert _wait(c, jobs[n])["state"] == "done"
        yield Served(rest, mcp, jobs, secrets, existing, routes, mcp_routes)


# -- the table ----------------------------------------------------------------------------------------------------------

Request = Callable[[Served, str], dict[str, Any]]
"""(served, index) → the keyword arguments of ``httpx.Client.request`` (``url`` included)."""


@dataclass(frozen=True)
class Row:
    kind: Kind
    request: Request
    ok: int = 200
    needle: str = ""
    """Text the successful body must hold (to tell it from another answer with the same status)."""
    asset: str = ""
    """A file of the /ui page: the body must be that shipped file, byte for byte (its placeholder examples name
    fixture passages, so the passage check does not apply)."""


def _get(url: str) -> Request:
    return lambda s, n: {"url": url}


def _post(url: str, body: Callable[[str], Any]) -> Request:
    return lambda s, n: {"url": url, "json": body(n)}


def _chat(n: str) -> dict[str, Any]:
    return {"model": n, "messages": [{"role": "user", "content": QUESTION[n]}]}


def _upload(s: Served, n: str) -> dict[str, Any]:
    return {"url": "/documents", "params": {"index": n}, "content": json.dumps(s.existing[n]) + "\n",
            "headers": {"Content-Type": "application/x-ndjson"}}


TABLE: dict[tuple[str, str], Row] = {
    ("GET", "/health"): Row("public", _get("/health"), needle='"status":"ok"'),
    ("GET", "/docs"): Row("public", _get("/docs"), needle="swagger"),
    ("GET", "/docs/oauth2-redirect"): Row("public", _get("/docs/oauth2-redirect")),
    ("GET", "/redoc"): Row("public", _get("/redoc"), needle="redoc"),
    ("GET", "/docs/assets/swagger-ui-bundle.js"): Row("public", _get("/docs/assets/swagger-ui-bundle.js"),
                                                      needle="SwaggerUIBundle"),
    ("GET", "/docs/assets/swagger-ui.css"): Row("public", _get("/docs/assets/swagger-ui.css"), needle="swagger-ui"),
    ("GET", "/docs/assets/redoc.standalone.js"): Row("public", _get("/docs/assets/redoc.standalone.js"),
                                                     needle="Redoc"),
    ("GET", "/docs/assets/favicon.png"): Row("public", _get("/docs/assets/favicon.png"), needle="PNG"),
    ("GET", "/"): Row("public", _get("/"), ok=307),
    ("GET", "/openapi.json"): Row("public", _get("/openapi.json"), needle='"/ask"'),
    ("GET", "/ui"): Row("public", _get("/ui"), asset="index.html"),
    ("GET", "/ui/app.js"): Row("public", _get("/ui/app.js"), asset="app.js"),
    ("GET", "/ui/style.css"): Row("public", _get("/ui/style.css"), asset="style.css"),
    ("GET", "/ready"): Row("list", _get("/ready"), needle="ready"),
    ("GET", "/indexes"): Row("list", _get("/indexes"), needle='"indexes"'),
    ("GET", "/metrics"): Row("list", _get("/metrics"), needle="routerag_http_requests_total"),
    ("GET", "/v1/models"): Row("list", _get("/v1/models"), needle='"data"'),
    ("GET", "/jobs"): Row("list", _get("/jobs")),
    ("GET", "/jobs/{job_id}"): Row("read", lambda s, n: {"url": f"/jobs/{s.jobs[n]}"}, needle='"state":"done"'),
    ("POST", "/ask"): Row("read", _post("/ask", lambda n: {"question": QUESTION[n], "index": n}), needle="answer"),
    ("POST", "/retrieve"): Row("read", _post("/retrieve", lambda n: {"queries": [QUESTION[n]], "index": n}),
                               needle="result"),
    ("POST", "/retrieve/shard"): Row("read", _post("/retrieve/shard", lambda n: {"queries": [QUESTION[n]],
                                                                               "stage": "seeds", "index": n}),
                                     needle="seeds"),
    ("POST", "/explain"): Row("read", _post("/explain", lambda n: {"query": QUESTION[n], "mode": "graph",
                                                                   "index": n}), needle="nodes"),
    ("POST", "/v1/chat/completions"): Row("read", _post("/v1/chat/completions", _chat), needle="chat.completion"),
    ("GET", "/documents"): Row("read", lambda s, n: {"url": "/documents", "params": {"index": n}},
                               needle='"documents"'),
    ("POST", "/documents"): Row("write", _upload, ok=202, needle='"job"'),
    # an id the index does not hold: the admin key gets as far as the job's own 404
    ("DELETE", "/documents/{doc_id}"): Row("write", lambda s, n: {"url": "/documents/no-such-id",
                                                                  "params": {"index": n}},
                                           ok=404, needle="has no passages with ids"),
    ("POST", "/documents/delete"): Row("write", _post("/documents/delete", lambda n: {"ids": ["no-such-id"],
                                                                                      "index": n}),
                                       ok=404, needle="has no passages with ids"),
}
MCP_TABLE: dict[tuple[str, str], tuple[str, ...]] = {("*", "/mcp"): ("search", "ask")}
"""The MCP transport's one route, and the tools every cell calls through it."""


def expected(kind: Kind, cred: str, index: str | None, ok: int) -> tuple[int, bool]:
    """The status a cell must get, and whether the request reaches the route's own work (or a guard refuses it)."""
    if kind == "public":
        return ok, True
    if cred in ("none", "wrong"):
        return 401, False
    if kind in ("read", "write") and index not in VISIBLE[cred]:
        return 404, False  # as unknown as an index not served
    if kind == "write" and cred != "admin":
        return 403, False  # it may read this index, so it may know it exists
    return ok, True


def leaks(s: Served, body: str, kind: Kind, cred: str, index: str | None, failed: bool) -> list[str]:
    """What of another index the body shows: the passages of any index the request had no business reading, and
    the name of any index it neither named nor may see."""
    if kind in ("read", "write"):
        readable = {index} & VISIBLE[cred] if not failed else set()
        nameable = {index} | (VISIBLE[cred] if failed else set())
    else:
        readable = nameable = VISIBLE[cred]
    found = [f"passage {x!r} of {n}" for n in INDEXES if n not in readable for x in s.secrets[n] if x in body]
    return found + [f"the name {n!r}" for n in INDEXES if n not in nameable and n in body]


def _cells() -> list[Any]:
    out = []
    for (method, path), row in TABLE.items():
        for cred in KEYS:
            for index in (INDEXES if row.kind in ("read", "write") else (None,)):
                out.append(pytest.param(method, path, cred, index, id=f"{method} {path} {cred} {index or '-'}"))
    return out


# -- the tests ----------------------------------------------------------------------------------------------------------


def test_every_route_is_in_the_table(served: Served) -> None:
    assert served.routes == set(TABLE), ("routes without a row (add them to TABLE with their outcome)",
                                         served.routes - set(TABLE), "rows without a route", set(TABLE) - served.routes)
    assert served.mcp_routes == set(MCP_TABLE)


@pytest.mark.parametrize("method, path, cred, index", _cells())
def test_rest_route(served: Served, method: str, path: str, cred: str, index: str | None) -> None:
    row = TABLE[(method, path)]
    key = KEYS[cred]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    args = row.request(served, index or "")
    args["headers"] = {**args.get("headers", {}), **headers}
    with httpx.Client(base_url=served.rest, timeout=60) as c:
        r = c.request(method, **args)
    want, reached = expected(row.kind, cred, index, row.ok)
    assert r.status_code == want, (want, r.text[:500])
    if reached and row.needle:
        assert row.needle in r.text, r.text[:500]
    if r.headers.get("content-type", "").startswith("application/json") and r.status_code >= 400:
        assert set(r.json()) == {"error"}, r.text
    if row.asset:
        assert r.content == resources.files("server").joinpath("static", row.asset).read_bytes()
        return
    assert not leaks(served, r.text, row.kind, cred, index, r.status_code >= 400), leaks(
        served, r.text, row.kind, cred, index, r.status_code >= 400)


def test_hidden_and_unknown_indexes_look_alike(served: Served) -> None:
    """For the limited key, curie and an index that does not exist get the same status and the same body."""
    headers = {"Authorization": f"Bearer {KEYS['limited']}"}
    with httpx.Client(base_url=served.rest, timeout=60, headers=headers) as c:
        for method, path in (("POST", "/ask"), ("POST", "/retrieve"), ("POST", "/explain"),
                             ("POST", "/v1/chat/completions"), ("POST", "/documents/delete")):
            hidden = c.request(method, **{k: v for k, v in TABLE[(method, path)].request(served, "curie").items()})
            body = TABLE[(method, path)].request(served, "curie")
            text = json.dumps(body.get("json")).replace('"curie"', '"nothing"') if "json" in body else None
            unknown = c.request(method, url=body["url"], content=text, headers={"Content-Type": "application/json"})
            assert hidden.status_code == unknown.status_code == 404, (path, hidden.text, unknown.text)
            assert hidden.text.replace("'curie'", "'nothing'") == unknown.text, (path, hidden.text, unknown.text)


async def _mcp_call(url: str, key: str | None, tool: str, args: dict[str, Any]) -> Any:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    async with Client(streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=120) as client:
        return await client.call_tool(tool, args)


@pytest.mark.parametrize("cred", list(KEYS))
@pytest.mark.parametrize("index", INDEXES)
@pytest.mark.parametrize("tool", MCP_TABLE[("*", "/mcp")])
def test_mcp_tool(served: Served, tool: str, index: str, cred: str) -> None:
    key = KEYS[cred]
    args = {"query": QUESTION[index], "index": index} if tool == "search" else {"question": QUESTION[index],
                                                                                  "index": index}
    want, _ = expected("read", cred, index, 200)
    if want == 401:
        with pytest.raises(Exception):  # the SDK's client cannot even open a session
            asyncio.run(_mcp_call(served.mcp, key, tool, args))
        r = httpx.post(f"{served.mcp}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                  "params": {"name": tool, "arguments": args}},
                       headers={"Authorization": f"Bearer {key}"} if key else {})
        assert r.status_code == 401 and not leaks(served, r.text, "read", cred, index, True), r.text
        return
    result = asyncio.run(_mcp_call(served.mcp, key, tool, args))
    text = json.dumps([c.model_dump() for c in result.content]) + json.dumps(result.structured_content or {})
    assert result.is_error == (want == 404), text[:500]
    if want == 404:
        assert f"no index named '{index}'" in text
    else:
        titles = [d["title"] for d in result.structured_content["documents"]] if tool == "search" else [
            result.structured_content["answer"]]
        assert titles and all(t in served.secrets[index] for t in titles), titles
    assert not leaks(served, text, "read", cred, index, result.is_error), leaks(served, text, "read", cred, index,
                                                                               result.is_error)
