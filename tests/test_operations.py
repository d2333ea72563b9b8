"""What an operator meets (server/operations.py, the logging of ``routerag serve``): ``/`` sends a browser to
``/ui``; ``/docs`` and ``/redoc`` load their assets from this server, not a CDN; ``server.public_metrics`` opens
``/metrics`` to a scraper without a key; a draining server refuses new work with 503 while ``/health`` stays up; and
a real server process, sent SIGTERM with a question in flight, finishes it, logs JSON lines (access lines included)
with no traceback, and exits."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app
from server.operations import DOCS_ASSETS, begin_drain

from .helpers.fake_openai import free_port
from .helpers.server_helpers import RoutingPolicy, wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
Q = "Where was Joran Veld born?"
KEY = "ops-key"


def make_app(index: Path, retriever: Retriever, **server: Any):
    settings = Settings(server={"api_key": KEY, **server})
    engine = Engine(index, settings, generator=RoutingPolicy(), retriever=retriever)
    engine.warm_up()
    return create_app(engine, settings)


def get(app: Any, method: str, path: str, **kw: Any) -> httpx.Response:
    from fastapi.testclient import TestClient

    with TestClient(app, base_url="http://localhost") as client:
        return client.request(method, path, follow_redirects=False, **kw)


def test_the_root_redirects_to_the_page_without_a_key(index: Path, retriever: Retriever) -> None:
    r = get(make_app(index, retriever), "GET", "/")
    assert r.status_code == 307 and r.headers["location"] == "/ui"


def test_the_api_docs_load_everything_from_this_server(index: Path, retriever: Retriever) -> None:
    app = make_app(index, retriever)
    for page in ("/docs", "/redoc"):
        html = get(app, "GET", page).text  # public, as the schema is
        sources = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert sources and all(s.startswith("/docs/assets/") for s in sources), (page, sources)
        assert "cdn" not in html and "fonts.googleapis" not in html
    for path in DOCS_ASSETS:
        r = get(app, "GET", path)
        assert r.status_code == 200 and len(r.content) > 1000, path
    assert b"SwaggerUIBundle" in get(app, "GET", "/docs/assets/swagger-ui-bundle.js").content
    assert get(app, "GET", "/openapi.json").status_code == 200


def test_metrics_need_the_key_unless_server_public_metrics(index: Path, retriever: Retriever) -> None:
    closed = make_app(index, retriever)
    assert get(closed, "GET", "/metrics").status_code == 401
    assert 'routerag_index_passages{index="idx"}' in get(closed, "GET", "/metrics",
                                                          headers={"Authorization": f"Bearer {KEY}"}).text
    assert get(closed, "GET", "/ask").status_code == 401
    opened = make_app(index, retriever, public_metrics=True)
    r = get(opened, "GET", "/metrics")
    assert r.status_code == 200 and 'routerag_index_passages{index="idx"}' in r.text
    assert get(opened, "POST", "/ask", json={"question": Q}).status_code == 401  # only /metrics opened
    spec = get(opened, "GET", "/openapi.json").json()
    assert "security" not in spec["paths"]["/metrics"]["get"] and spec["paths"]["/ask"]["post"]["security"]


def test_a_draining_server_refuses_new_work_and_stays_alive(index: Path, retriever: Retriever) -> None:
    app = make_app(index, retriever)
    auth = {"Authorization": f"Bearer {KEY}"}
    assert get(app, "GET", "/ready", headers=auth).status_code == 200
    begin_drain(app)  # what SIGTERM does (server.operations.run)
    r = get(app, "POST", "/ask", json={"question": Q}, headers=auth)
    assert r.status_code == 503 and r.json()["error"]["type"] == "shutting_down"
    assert r.headers["connection"] == "close" and r.headers["retry-after"] == "1"
    assert get(app, "GET", "/ready", headers=auth).status_code == 503  # a load balancer stops sending work
    assert get(app, "GET", "/health").status_code == 200  # liveness: the process is not dead, do not kill it


def test_sigterm_drains_the_question_in_flight_and_logs_json(index: Path, tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "server.log"
    # a 1.5 s turn (the question takes two) and 20 s to drain: the question in flight finishes after the signal
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.slow_server", str(index), str(port), "1.5", "20"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(proc, url, log)
        answers: list[httpx.Response] = []
        asking = threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/ask", json={"question": Q},
                                                                           timeout=30)))
        asking.start()
        time.sleep(0.8)  # in the policy's first turn
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        asking.join(timeout=30)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        drained_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answers and answers[0].status_code == 200 and answers[0].json()["finish"] == "answer"
    assert 1.0 < drained_s < 20  # it waited for the answer, not for the whole drain time
    with pytest.raises(httpx.TransportError):  # and is gone
        httpx.get(f"{url}/health", timeout=1)
    text = log.read_text()
    assert "Traceback" not in text, text
    records = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is a JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records
    access = [r for r in records if r["logger"] == "uvicorn.access"]
    assert {"method": "POST", "path": "/ask", "status": 200} in [
        {k: r[k] for k in ("method", "path", "status")} for r in access], access
    assert any(r["path"] == "/ready" for r in access)  # access lines on by default
