"""Ingestion over HTTP (issue 17): documents added and deleted by background jobs while queries keep being answered,
several indexes in one server with per-key access, and a server killed mid-job that serves its last version and
resumes the job when restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from graph_index.builder import Components
from routerag.config import RetrievalConfig, Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.fake_openai import free_port
from .helpers.server_helpers import RoutingPolicy, build_small_index, live_server

ROOT = Path(__file__).resolve().parents[1]
NEW = [{"id": "new-1", "title": "Mirela Osk", "text": "Mirela Osk is a luthier who builds cellos in Vantry."},
       {"id": "new-2", "title": "Vantry", "text": "Vantry is a mountain village known for its spruce forests."},
       {"id": "new-3", "title": "Osk cello", "text": "An Osk cello has a varnish of amber and walnut oil."}]
QUERIES = ["Where was Joran Veld born?", "What does Tarsk trade?", "Which river flows through Brannock?",
           "Who builds cellos in Vantry?"]


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def fresh_index(tmp_path: Path, minilm, spacy_extractor) -> Path:
    return build_small_index(tmp_path / "idx", minilm, spacy_extractor)


def make_app(paths: dict[str, Path], minilm, spacy_extractor, **server: Any) -> tuple[Any, dict[str, Engine]]:
    settings = Settings(cache_dir=next(iter(paths.values())).parent / "cache", server=server)
    policy = RoutingPolicy()
    engines = {name: Engine(p, settings, generator=policy, retriever=Retriever(p, RetrievalConfig(), embedder=minilm))
               for name, p in paths.items()}
    for e in engines.values():
        e.warm_up()
    components = {name: Components(settings, embedder=minilm, extractor=spacy_extractor) for name in paths}
    return create_app(engines, settings, components=components), engines


def wait_job(c: httpx.Client, job: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body = c.get(f"/jobs/{job}").json()
        if body["state"] in ("done", "failed"):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def top10(c: httpx.Client, **extra: Any) -> dict[str, list[list[str]]]:
    out = {}
    for mode in ("passage", "graph", "hybrid"):
        r = c.post("/retrieve", json={"queries": QUERIES, "topk": 10, "mode": mode, **extra})
        assert r.status_code == 200, r.text
        out[mode] = [[d["id"] for d in row] for row in r.json()["result"]]
    return out


def test_add_and_delete_over_http_while_retrieve_runs(fresh_index: Path, minilm, spacy_extractor) -> None:
    """Zero failed requests during two jobs and two swaps; the added passages are found; after the delete the index
    equals the original (counts and top-10 in every mode)."""
    app, engines = make_app({"idx": fresh_index}, minilm, spacy_extractor)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        before = top10(c)
        statuses: list[int] = []
        stop = threading.Event()

        def hammer() -> None:  # a bounded stream: one request at a time per thread, 2 threads
            with httpx.Client(base_url=url, timeout=60) as h:
                while not stop.is_set():
                    r = h.post("/retrieve", json={"queries": QUERIES[:2], "topk": 5, "mode": "hybrid"})
                    statuses.append(r.status_code)

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            r = c.post("/documents", content=jsonl(NEW), headers={"Content-Type": "application/x-ndjson"})
            assert r.status_code == 202 and r.headers["Location"] == f"/jobs/{r.json()['job']}", r.text
            job = wait_job(c, r.json()["job"])
            assert job["state"] == "done" and job["counts"]["added"] == 3 and job["counts"]["passages"] == 13, job
            hit = c.post("/retrieve", json={"queries": ["Who builds cellos in Vantry?"], "topk": 1,
                                            "mode": "passage"}).json()
            assert hit["result"][0][0]["id"] == "new-1"
            r = c.post("/documents/delete", json={"ids": ["new-1", "new-2"]})
            assert r.status_code == 202, r.text
            assert wait_job(c, r.json()["job"])["counts"]["deleted"] == 2
            r = c.delete("/documents/new-3")
            assert r.status_code == 202 and wait_job(c, r.json()["job"])["state"] == "done"
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert len(statuses) > 10 and set(statuses) == {200}, sorted(set(statuses))
        assert c.get("/indexes").json()["indexes"][0]["passages"] == 10
        assert top10(c) == before
        assert engines["idx"].retriever.data.version != ".idx.v0001"  # three new versions were swapped in


def test_ingestion_refuses_bad_input_with_a_clear_4xx(fresh_index: Path, minilm, spacy_extractor) -> None:
    app, engines = make_app({"idx": fresh_index}, minilm, spacy_extractor, max_upload_bytes=4096,
                            max_pending_jobs=1)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        ndjson = {"Content-Type": "application/x-ndjson"}
        r = c.post("/documents", content=b'{"title": "A", "text": "fine"}\n{"title": "B", "text": \n',
                   headers=ndjson)
        assert r.status_code == 422 and r.json()["error"]["message"].startswith("body:2:"), r.text
        r = c.post("/documents", content=b'{"title": "A"}\n', headers=ndjson)
        assert r.status_code == 422 and "body:1" in r.json()["error"]["message"], r.text
        r = c.post("/documents", content=b"x" * 5000, headers=ndjson)
        assert r.status_code == 413 and "server.max_upload_bytes" in r.json()["error"]["message"]
        r = c.post("/documents", content=b"title,text\n", headers={"Content-Type": "text/csv"})
        assert r.status_code == 415
        assert c.post("/documents", content=b"  \n", headers=ndjson).status_code == 422
        assert c.delete("/documents/no-such-id").status_code == 404
        r = c.post("/documents/delete", json={"ids": ["new-1", "nope"]})
        assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
        assert c.post("/documents?index=other", content=jsonl(NEW), headers=ndjson).status_code == 404
        assert c.get("/jobs/unknown").status_code == 404
        # a JSON array and a multipart file are accepted too; a second job while one is pending is a 409
        first = c.post("/documents", json=NEW[:1])
        assert first.status_code == 202, first.text
        r = c.post("/documents", files={"file": ("more.jsonl", jsonl(NEW[1:]), "application/octet-stream")})
        assert r.status_code in (202, 409), r.text
        if r.status_code == 409:  # the first job had not finished: refused, naming it
            assert first.json()["job"] in r.json()["error"]["message"]
            wait_job(c, first.json()["job"])
            r = c.post("/documents", files={"file": ("more.jsonl", jsonl(NEW[1:]), "application/octet-stream")})
            assert r.status_code == 202, r.text
        assert wait_job(c, r.json()["job"])["counts"]["added"] == 2
        assert wait_job(c, first.json()["job"])["counts"]["added"] == 1
        # adding the same passages again is a job that adds nothing
        again = c.post("/documents", json=NEW)
        assert wait_job(c, again.json()["job"])["counts"] == {"records": 3, "uploaded": 3, "added": 0,
                                                              "duplicates": 3, "passages": 13}
        # deleting everything would leave an empty index
        ids = [p.id for p in engines["idx"].retriever.passages]
        assert c.post("/documents/delete", json={"ids": ids}).status_code == 409


def test_two_indexes_and_keys_limited_to_one(tmp_path: Path, fresh_index: Path, minilm, spacy_extractor) -> None:
    other = build_small_index(tmp_path / "second" / "idx", minilm, spacy_extractor)
    app, _ = make_app({"a": fresh_index, "b": other}, minilm, spacy_extractor, api_key="all", admin_key="admin",
                      index_keys=[{"key": "only-a", "indexes": ["a"]}])
    with live_server(app) as url:
        def client(key: str) -> httpx.Client:
            return httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"})

        with client("all") as c, client("only-a") as a, client("admin") as admin:
            q = {"question": "Where was Joran Veld born?"}
            r = c.post("/ask", json=q)
            assert r.status_code == 422 and "a, b" in r.json()["error"]["message"]  # which one?
            assert c.post("/ask", json={**q, "index": "b"}).status_code == 200
            assert c.post("/ask", json={**q, "index": "c"}).status_code == 404
            assert a.post("/ask", json={**q, "index": "a"}).status_code == 200
            # an index the key may not see is as unknown as one not served: same status, same body
            hidden, unknown = a.post("/ask", json={**q, "index": "b"}), a.post("/ask", json={**q, "index": "zz"})
            assert hidden.status_code == unknown.status_code == 404
            assert hidden.json()["error"]["message"].replace("'b'", "'zz'") == unknown.json()["error"]["message"]
            assert a.post("/retrieve", json={"queries": ["x y"], "index": "b"}).status_code == 404
            assert a.post("/ask", json=q).status_code == 200  # its one index needs no naming
            assert [i["name"] for i in a.get("/indexes").json()["indexes"]] == ["a"]
            assert [i["name"] for i in c.get("/health").json()["indexes"]] == ["a", "b"]
            assert httpx.get(f"{url}/health").json()["indexes"] == []  # no key: alive, nothing more
            assert [m["id"] for m in a.get("/v1/models").json()["data"]] == ["a"]
            # writes need the admin key once one is set
            body = {"content": jsonl(NEW[:1]), "headers": {"Content-Type": "application/x-ndjson"}}
            assert c.post("/documents?index=a", **body).status_code == 403
            assert a.post("/documents?index=a", **body).status_code == 403
            r = admin.post("/documents?index=b", **body)
            assert r.status_code == 202 and wait_job(admin, r.json()["job"])["state"] == "done"
            assert a.get(f"/jobs/{r.json()['job']}").status_code == 404  # another index's job is not its business
            sizes = {i["name"]: i["passages"] for i in c.get("/indexes").json()["indexes"]}
            assert sizes == {"a": 10, "b": 11}
            metrics = c.get("/metrics").text
            assert 'routerag_index_passages{index="b"} 11.0' in metrics
            assert 'routerag_ingestion_jobs_total{index="b",op="add",state="done"} 1.0' in metrics
            assert 'routerag_index_memory_bytes{index="a"}' in metrics
            limited = a.get("/metrics").text  # the key limited to a sees no series of b
            assert 'index="a"' in limited and 'index="b"' not in limited


def test_index_keys_naming_an_unserved_index_are_refused(fresh_index: Path, minilm, spacy_extractor) -> None:
    with pytest.raises(ValueError, match=r"index_keys\[0\]\.indexes: 'typo' not served"):
        make_app({"idx": fresh_index}, minilm, spacy_extractor, index_keys=[{"key": "k", "indexes": ["typo"]}])


def _start(index: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.ingest_server", str(index), str(port)], cwd=ROOT,
                            stdout=open(log, "a"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)


def test_a_server_killed_mid_job_serves_the_last_version_and_resumes_the_job(fresh_index: Path,
                                                                             tmp_path: Path) -> None:
    rows = [{"id": f"bulk-{i}", "title": f"Village {i}",
             "text": f"Village {i} lies on the river Ossel; its mill {i} grinds rye and its bell was cast in {1500 + i}."}
            for i in range(400)]
    port, log = free_port(), tmp_path / "server.log"
    proc = _start(fresh_index, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        r = httpx.post(f"{url}/documents", content=jsonl(rows), headers={"Content-Type": "application/x-ndjson"},
                       timeout=60)
        assert r.status_code == 202, r.text
        job = r.json()["job"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/jobs/{job}").json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # inside the update: extracting and embedding 400 passages
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = _start(fresh_index, port, log)
        # the previous version serves at once, and the job is reported as resumed
        assert httpx.get(f"{url}/indexes").json()["indexes"][0]["passages"] == 10
        r = httpx.post(f"{url}/retrieve", json={"queries": QUERIES, "mode": "hybrid"})
        assert r.status_code == 200
        state = httpx.get(f"{url}/jobs/{job}").json()
        assert state["resumed"] == 1 and state["state"] in ("queued", "running", "done"), state
        with httpx.Client(base_url=url, timeout=60) as c:
            done = wait_job(c, job, timeout=300)
            assert done["state"] == "done" and done["counts"]["added"] == 400, done
            assert c.get("/indexes").json()["indexes"][0]["passages"] == 410
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_job_that_adds_nothing_new_serves_what_another_writer_published(fresh_index: Path, tmp_path: Path,
                                                                          minilm, spacy_extractor) -> None:
    """Issue 34, item 9: passages already indexed are ``added 0, duplicates N`` (not an empty corpus), and a job
    that says ``done`` has its passages served, even when another writer (``routerag index add``) put them there;
    likewise a delete of ids another writer already removed is ``deleted 0``, not a failed job."""
    from graph_index.builder import add_to_index, delete_from_index

    app, _ = make_app({"idx": fresh_index}, minilm, spacy_extractor)
    (tmp_path / "new.jsonl").write_bytes(jsonl(NEW))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        cfg = Settings(cache_dir=fresh_index.parent / "cache")
        add_to_index(fresh_index, [tmp_path / "new.jsonl"], cfg, progress=False,
                     components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
        assert c.get("/indexes").json()["indexes"][0]["passages"] == 10  # the server still serves its version
        r = c.post("/documents", content=jsonl(NEW), headers={"Content-Type": "application/x-ndjson"})
        assert r.status_code == 202, r.text
        assert wait_job(c, r.json()["job"])["counts"] == {"records": 3, "uploaded": 3, "added": 0, "duplicates": 3,
                                                          "passages": 13}
        assert c.get("/indexes").json()["indexes"][0]["passages"] == 13
        delete_from_index(fresh_index, ["new-1"], cfg, progress=False, components=Components(cfg, embedder=minilm))
        r = c.post("/documents/delete", json={"ids": ["new-1"]})  # the server still serves new-1: accepted
        assert r.status_code == 202, r.text
        assert wait_job(c, r.json()["job"])["counts"] == {"requested": 1, "deleted": 0, "passages": 12}
        assert c.get("/indexes").json()["indexes"][0]["passages"] == 12
