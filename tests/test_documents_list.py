"""``GET /documents``: an index's documents a page at a time, searched by id or title, per key; and, on a writable
index, a document added over HTTP is listed once its job is done and gone once deleted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy, build_small_index, live_server
from .test_ingestion import make_app as make_writable_app
from .test_ingestion import wait_job

KEY = "docs-key"
FIXTURE = [json.loads(line) for line in
           (Path(__file__).resolve().parent / "fixtures" / "twohop.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def client(index: Path, retriever: Retriever):
    settings = Settings(server={"api_key": KEY})
    engine = Engine(index, settings, generator=RoutingPolicy(), retriever=retriever)
    from fastapi.testclient import TestClient

    with TestClient(create_app(engine, settings), base_url="http://localhost",
                    headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def listed(c: Any, **params: Any) -> dict[str, Any]:
    r = c.get("/documents", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_pages_cover_the_index_in_corpus_order(client: Any, retriever: Retriever) -> None:
    first = listed(client, limit=4)
    assert (first["index"], first["total"], first["offset"], first["limit"]) == ("idx", len(FIXTURE), 0, 4)
    ids = []
    for offset in range(0, len(FIXTURE), 4):
        ids += [d["id"] for d in listed(client, limit=4, offset=offset)["documents"]]
    assert ids == [p.id for p in retriever.passages]
    assert [d["title"] for d in first["documents"]] == [r["title"] for r in FIXTURE[:4]]
    assert listed(client, offset=100)["documents"] == []  # past the end: an empty page, not an error


def test_search_by_title_or_id_is_case_insensitive(client: Any, retriever: Retriever) -> None:
    found = listed(client, q="jORAN")
    assert {d["title"] for d in found["documents"]} == {"Joran Veld", "Mira Joran"} and found["total"] == 2
    some = retriever.passages[3]
    assert [d["id"] for d in listed(client, q=some.id.upper())["documents"]] == [some.id]
    assert listed(client, q="no such thing")["total"] == 0


@pytest.mark.parametrize("params, status, text", [
    ({"limit": 101}, 422, "limit"), ({"limit": 0}, 422, "limit"), ({"offset": -1}, 422, "offset"),
    ({"index": "other"}, 404, "no index named 'other'"), ({"q": "x" * 201}, 422, "q"),
])
def test_bad_paging_is_a_located_4xx(client: Any, params: dict[str, Any], status: int, text: str) -> None:
    r = client.get("/documents", params=params)
    assert r.status_code == status and text in r.json()["error"]["message"], r.text


def test_the_list_needs_a_key(client: Any) -> None:
    assert client.get("/documents", headers={"Authorization": ""}).status_code == 401


def test_an_added_document_is_listed_and_a_deleted_one_is_not(tmp_path: Path, minilm, spacy_extractor) -> None:
    fresh = build_small_index(tmp_path / "idx", minilm, spacy_extractor)
    app, _ = make_writable_app({"idx": fresh}, minilm, spacy_extractor)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        row = {"id": "lute-1", "title": "Orla Brisk", "text": "Orla Brisk builds lutes in Harrow."}
        r = c.post("/documents", content=json.dumps(row) + "\n", headers={"Content-Type": "application/x-ndjson"})
        assert wait_job(c, r.json()["job"])["state"] == "done"
        page = listed(c, q="brisk")
        assert [(d["id"], d["title"], d["text"]) for d in page["documents"]] == [("lute-1", "Orla Brisk", row["text"])]
        assert listed(c)["total"] == len(FIXTURE) + 1
        assert wait_job(c, c.delete("/documents/lute-1").json()["job"])["state"] == "done"
        assert listed(c, q="brisk")["total"] == 0 and listed(c)["total"] == len(FIXTURE)
