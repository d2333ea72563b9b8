"""OpenAI's conventions on ``/v1/chat/completions``, driven by the official ``openai`` client against a live server:
the usage chunk of ``stream_options.include_usage``, a 400 naming each parameter the policy cannot honour (with
OpenAI's ``param`` and ``code``), and a refusal in ``message.refusal``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.prompts import REFUSAL_ANSWER
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy, live_server

Q = "Where was Joran Veld born?"
UNANSWERABLE = "Who painted the ceiling of Joran Veld's chapel?"


@pytest.fixture(scope="module")
def client(index: Path, retriever: Retriever):
    settings = Settings(server={"api_key": "chat-key"})
    engine = Engine(index, settings, generator=RoutingPolicy("[graph]", refuse_on="ceiling"), retriever=retriever)
    engine.warm_up()
    with live_server(create_app(engine, settings)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="chat-key", max_retries=0)


def test_include_usage_sends_a_last_chunk_with_the_usage_and_no_choices(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="idx", messages=[{"role": "user", "content": Q}],
                                                 stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])  # only the last one carries it, as OpenAI's
    whole = client.chat.completions.create(model="idx", messages=[{"role": "user", "content": Q}])
    assert whole.usage.total_tokens == last.usage.total_tokens  # the same run, counted the same way
    plain = list(client.chat.completions.create(model="idx", messages=[{"role": "user", "content": Q}], stream=True))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("params, param, code", [
    ({"n": 2}, "n", "unsupported_value"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools",
     "unsupported_parameter"),
    ({"tool_choice": "required"}, "tool_choice", "unsupported_parameter"),
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
    ({"logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"top_logprobs": 3}, "top_logprobs", "unsupported_parameter"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),  # without stream
    ({"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
])
def test_a_parameter_the_policy_cannot_honour_is_a_400_naming_it(client: openai.OpenAI, params: dict[str, Any],
                                                                 param: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="idx", messages=[{"role": "user", "content": Q}], **params)
    e = err.value
    assert (e.status_code, e.param, e.code, e.type) == (400, param, code, "invalid_request_error")
    assert param in e.message
    assert set(e.body) == {"message", "type", "param", "code"}  # OpenAI's error object, nothing else


def test_the_accepted_values_of_those_parameters_still_answer(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(model="idx", messages=[{"role": "user", "content": Q}], n=1,
                                          response_format={"type": "text"}, logprobs=False, tool_choice="none",
                                          temperature=0.2, seed=3)
    assert done.choices[0].message.content and done.choices[0].message.refusal is None


def test_a_400_also_reaches_a_streaming_client_before_any_chunk(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="n=3"):
        client.chat.completions.create(model="idx", messages=[{"role": "user", "content": Q}], n=3, stream=True)


def test_a_refusal_is_message_refusal_with_null_content(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(model="idx", messages=[{"role": "user", "content": UNANSWERABLE}])
    message = done.choices[0].message
    assert message.content is None and message.refusal == REFUSAL_ANSWER
    assert done.choices[0].finish_reason == "stop" and done.model_extra["routerag"]["refused"] is True
    chunks = list(client.chat.completions.create(model="idx", stream=True,
                                                 messages=[{"role": "user", "content": UNANSWERABLE}]))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.refusal or "" for d in deltas) == REFUSAL_ANSWER
    assert "".join(d.content or "" for d in deltas) == ""


def test_every_error_has_param_and_code_even_outside_chat(client: openai.OpenAI) -> None:
    base = str(client.base_url).removesuffix("/v1/")
    r = httpx.post(f"{base}/ask", json={"question": Q})  # no key
    assert r.status_code == 401 and set(r.json()["error"]) == {"type", "message", "param", "code"}
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": Q}])
    assert err.value.type == "not_found" and err.value.param is None
