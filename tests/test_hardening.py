"""Issue #15's smaller defects, one test each: a dropped event stream is a client disconnect (499), an engine
ValueError is the server's 500 (not a client-blaming 422), /retrieve refuses blank queries and unknown fields as its
schema says, the stream's events (error included) are in the OpenAPI schema, a body that is not JSON is a 415, and a
training checkpoint cannot run code when it is loaded."""

from __future__ import annotations

import asyncio
import pickle
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy, live_server

Q = "Where was Joran Veld born?"


def make_app(index: Path, retriever: Retriever, policy: Any = None, **server: Any):
    settings = Settings(server=server)
    engine = Engine(index, settings, generator=policy or RoutingPolicy(), retriever=retriever)
    engine.warm_up()
    return create_app(engine, settings)


def call(app, method: str, url: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return await c.request(method, url, **kw)

    return asyncio.run(go())


def test_a_dropped_stream_is_counted_as_a_client_disconnect(index: Path, retriever: Retriever) -> None:
    policy = RoutingPolicy(delay_s=1.0)  # two turns: the client leaves after the first events
    app = make_app(index, retriever, policy)
    with live_server(app) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            with c.stream("POST", "/ask", json={"question": Q, "stream": True}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        break  # the first event arrived: hang up mid-stream
        time.sleep(1.5)  # past where the second turn would have ended
        metrics = httpx.get(f"{url}/metrics").text
    assert policy.calls <= 2  # the second turn may have started, but nothing after it
    assert 'routerag_http_requests_total{method="POST",route="/ask",status="499"} 1.0' in metrics
    assert 'route="/ask",status="200"' not in metrics
    assert 'routerag_request_errors_total{route="/ask",type="client_disconnected"} 1.0' in metrics
    assert 'routerag_admission_in_flight{route="/ask"} 0.0' in metrics  # its slot was given back


def test_an_engine_value_error_is_a_500_not_the_clients_422(index: Path, retriever: Retriever) -> None:
    class Broken(RoutingPolicy):
        async def generate(self, request):
            raise ValueError("the prompt of 9000 tokens fills the model's context of 8192")

    r = call(make_app(index, retriever, Broken()), "POST", "/ask", json={"question": Q})
    assert r.status_code == 500
    assert r.json() == {"error": {"type": "internal_error", "message": "internal server error (ValueError)",
                                  "param": None, "code": None}}


def test_retrieve_schema_and_behaviour_agree_on_blank_queries_and_unknown_fields(index: Path,
                                                                                 retriever: Retriever) -> None:
    app = make_app(index, retriever)
    spec = call(app, "GET", "/openapi.json").json()
    request = spec["components"]["schemas"]["RetrieveRequest"]
    assert request["additionalProperties"] is False
    item = request["properties"]["queries"]["items"]
    import re

    pattern = re.compile(item["pattern"])
    for blank in ("", " ", "\t\n", "\x1c", "\u3000"):  # every string Python strips to nothing fails the pattern
        assert not pattern.search(blank)
        r = call(app, "POST", "/retrieve", json={"queries": [blank]})
        assert r.status_code == 422 and r.json()["error"]["type"] == "validation_error", r.text
    assert call(app, "POST", "/retrieve", json={"queries": ["amber"], "topk": 1}).status_code == 200
    r = call(app, "POST", "/retrieve", json={"queries": ["amber"], "top_k": 1})
    assert r.status_code == 422 and "top_k: Extra inputs are not permitted" in r.json()["error"]["message"]


def test_the_stream_events_and_the_new_statuses_are_in_the_openapi_schema(index: Path, retriever: Retriever) -> None:
    spec = call(make_app(index, retriever), "GET", "/openapi.json").json()
    ask = spec["paths"]["/ask"]["post"]["responses"]
    events = {alt["properties"]["event"]["const"]: alt["properties"]["data"]["contentSchema"]["$ref"]
              for alt in ask["200"]["content"]["text/event-stream"]["itemSchema"]["oneOf"]}
    assert events == {"think": "#/components/schemas/ThinkEvent", "search": "#/components/schemas/SearchEvent",
                      "information": "#/components/schemas/InformationEvent",
                      "draft": "#/components/schemas/DraftEvent", "answer": "#/components/schemas/AnswerEvent",
                      "done": "#/components/schemas/AskResponse",
                      "error": "#/components/schemas/ErrorResponse"}
    schemas = spec["components"]["schemas"]
    assert all(ref.rsplit("/", 1)[-1] in schemas for ref in events.values())
    assert "retrieval_ms" in schemas["InformationEvent"]["properties"]
    for route in ("/ask", "/retrieve"):
        responses = spec["paths"][route]["post"]["responses"]
        assert {"415", "503"} <= set(responses)
        assert "Retry-After" in responses["503"]["headers"]
    assert "400" not in ask and "400" in spec["paths"]["/retrieve"]["post"]["responses"]  # /ask never answers 400


def test_the_stream_events_match_their_models(index: Path, retriever: Retriever) -> None:
    from server.protocol import STREAM_EVENTS

    from .helpers.scripted import ScriptedGenerator
    from .helpers.server_helpers import parse_sse

    gen = ScriptedGenerator(["<think>look</think><search>[graph] Joran Veld</search>", "<answer>Tarsk</answer>"])
    r = call(make_app(index, retriever, gen), "POST", "/ask", json={"question": Q, "stream": True})
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["think", "search", "information", "draft", "answer", "done"]
    for name, data in events:
        STREAM_EVENTS[name].model_validate(data)
    timeout = make_app(index, retriever, RoutingPolicy(delay_s=2.0), request_timeout_s=0.05)
    name, data = parse_sse(call(timeout, "POST", "/ask", json={"question": Q, "stream": True}).text)[-1]
    assert name == "error" and STREAM_EVENTS["error"].model_validate(data).error.type == "timeout"


@pytest.mark.parametrize("headers, status", [
    ({"content-type": "text/plain"}, 415),
    ({"content-type": "application/x-www-form-urlencoded"}, 415),
    ({}, 415),  # no type: not parsed, as FastAPI does not (cross-site requests), so not a 422 "field required"
    ({"content-type": "application/json; charset=utf-8"}, 200),
    ({"content-type": "application/vnd.api+json"}, 200),
])
def test_a_body_that_is_not_json_is_a_415(index: Path, retriever: Retriever, headers: dict[str, str],
                                          status: int) -> None:
    app = make_app(index, retriever)
    for path, body in (("/ask", b'{"question": "Where was Joran Veld born?"}'), ("/retrieve", b'{"queries": ["a"]}')):
        r = call(app, "POST", path, content=body, headers=headers)
        assert r.status_code == status, r.text
        if status == 415:
            assert r.json()["error"]["type"] == "unsupported_media_type" and "application/json" in r.text


class _Payload:
    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran() -> None:
    _Payload.ran = True


def test_a_checkpoint_state_is_loaded_without_running_code(tmp_path: Path) -> None:
    import random

    import torch

    from training.checkpoints import load_state

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    good = tmp_path / "state.pt"  # what save_checkpoint writes
    torch.save({"optimizer": opt.state_dict(), "step": 7, "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate()}, good)
    state = load_state(good)
    assert state["step"] == 7 and state["python_rng"] == random.getstate()
    opt.load_state_dict(state["optimizer"])

    evil = tmp_path / "evil.pt"
    torch.save({"step": 1, "payload": _Payload()}, evil)
    with pytest.raises(pickle.UnpicklingError):
        load_state(evil)
    assert not _Payload.ran
