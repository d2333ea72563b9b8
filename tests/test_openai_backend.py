"""The OpenAI-compatible policy backend against the scripted local server (tests/helpers/fake_openai.py): the chat and the
completions APIs (streamed or not) give the same trajectory for the same model replies; the chat API continues the
assistant's message, and falls back when a server refuses to; a stop string kept or cut changes nothing; and every
upstream fault (HTTP 500, garbage, no choices) is a 502 with a JSON error from /ask, never a 500.

The happy path against a real server (``transformers serve``) is in test_real_openai.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from routerag.config import GeneratorConfig, Settings
from routerag.engine import Engine
from graph_index.llm_clients import UpstreamError
from routerag.policy import LoopConfig, PolicyLoop, Trajectory
from routerag.policy.backends.openai_backend import CONTINUE_FIELDS, OpenAIGenerator
from routerag.prompts import BUDGET_NOTICE, DEFAULT_INSTRUCTION, INVALID_NOTICE, chatml, user_message
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.fake_openai import FakeOpenAIServer, Reply
from .helpers.scripted import FakeSearch
from .helpers.server_helpers import live_server, parse_sse

Q = "Where was Joran Veld born?"
TIMING = ("generation_ms", "retrieval_ms")


def context_of(req: dict[str, Any]) -> str:
    """What the model sees after its prompt: the completions prompt, or the chat request's assistant message."""
    if "prompt" in req:
        return req["prompt"]
    return "".join(m["content"] for m in req["messages"] if m["role"] == "assistant")


def scripted_policy(req: dict[str, Any]) -> Reply:
    """A model whose reply depends on its context only: an invalid turn, a search, a search past the budget, and the
    forced answer. Token counts are scripted so that both APIs report the same usage."""
    ctx = context_of(req)
    if ctx.endswith("<answer>"):
        return Reply(text=" Tarsk </answer> and more", prompt_tokens=300, completion_tokens=3)
    if "Let me try again" not in ctx:
        return Reply(text="I am not sure what to do.", prompt_tokens=100, completion_tokens=7)
    if "<information>Doc 1" not in ctx:
        return Reply(text="<think>I need the birthplace.</think>\n<search>[passage] Joran Veld birthplace</search>\n"
                          "<information>hallucinated</information>", prompt_tokens=150, completion_tokens=12)
    return Reply(text="<think>Not enough.</think><search>[graph] Joran Veld parents</search>", prompt_tokens=250,
                 completion_tokens=9)


def run_loop(server: FakeOpenAIServer, **cfg: Any) -> tuple[Trajectory, OpenAIGenerator]:
    gen = OpenAIGenerator(GeneratorConfig(backend="openai", model="policy", base_url=server.base_url, timeout_s=10,
                                          **cfg))
    search = FakeSearch()

    async def go() -> Trajectory:
        try:
            return await PolicyLoop(gen, search, LoopConfig(budget=1)).run(Q)
        finally:
            await gen.aclose()

    return asyncio.run(go()), gen


def comparable(traj: Trajectory) -> dict[str, Any]:
    """Everything a trajectory reports except wall-clock timings."""
    return {"trace": [{k: v for k, v in s.items() if k not in TIMING} for s in traj.trace()], "text": traj.text,
            "answer": traj.answer, "finish": traj.finish, "searches": traj.searches,
            "tokens": (traj.prompt_tokens, traj.completion_tokens), "segments": [s.kind for s in traj.segments]}


@pytest.fixture(scope="module")
def server() -> Any:
    with FakeOpenAIServer(scripted_policy) as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh(server: FakeOpenAIServer) -> None:
    server.reset(scripted_policy)
    server.keep_stop = False


def test_chat_and_completions_give_the_same_trajectory(server: FakeOpenAIServer) -> None:
    runs = {}
    for api in ("completions", "chat"):
        for stream in (False, True):
            server.reset(scripted_policy)
            traj, _ = run_loop(server, api=api, stream=stream)
            runs[api, stream] = (comparable(traj), list(server.requests))
    want, _ = runs["completions", False]
    assert [s["action"] for s in want["trace"]] == ["invalid", "search", "over_budget", "forced_answer"]
    assert want["answer"] == "Tarsk" and want["finish"] == "forced_answer" and want["searches"] == 1
    assert want["tokens"] == (800, 31)  # the server's usage, streamed or not
    for key, (got, requests) in runs.items():
        assert got == want, key
        assert [r.path for r in requests] == [f"/v1/{'chat/completions' if key[0] == 'chat' else 'completions'}"] * 4
        assert all(r.body.get("stream", False) is key[1] for r in requests)


def test_chat_sends_the_user_message_and_continues_the_assistant_message(server: FakeOpenAIServer) -> None:
    traj, gen = run_loop(server, api="chat")
    user = user_message(DEFAULT_INSTRUCTION, Q)
    first, *later = [r.body for r in server.requests]
    assert first["messages"] == [{"role": "user", "content": user}]
    assert "continue_final_message" not in first and first["stop"] == ["</search>", "</answer>"]
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    response = traj.text  # the whole response, as the completions prompt would carry it after the chat prompt
    for body in later:
        [u, a] = body["messages"]
        assert u == {"role": "user", "content": user} and a["role"] == "assistant"
        assert response.startswith(a["content"]) and a["content"]
        assert {k: body[k] for k in CONTINUE_FIELDS} == CONTINUE_FIELDS
    assert later[0]["messages"][1]["content"] == "I am not sure what to do." + INVALID_NOTICE
    assert later[-1]["messages"][1]["content"].endswith(BUDGET_NOTICE) and later[-1]["stop"] == ["</answer>"]
    assert gen.continues is True
    # the completions API sends the same response after the rendered prompt
    server.reset(scripted_policy)
    run_loop(server, api="completions")
    prompts = [r.body["prompt"] for r in server.requests]
    assert [p.removeprefix(chatml(user)) for p in prompts] == ["", *(b["messages"][1]["content"] for b in later)]


def rejects_continuation(req: dict[str, Any]) -> Reply:
    """A server that, like OpenAI and ``transformers serve``, refuses fields it does not know."""
    if "continue_final_message" in req:
        return Reply(status=422, error="Unexpected fields in the request: {'continue_final_message', "
                                       "'add_generation_prompt'}")
    return scripted_policy(req)


def test_auto_continuation_falls_back_once_when_the_server_refuses_it(server: FakeOpenAIServer,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    server.reset(rejects_continuation)
    traj, gen = run_loop(server, api="chat")
    sent = ["continue_final_message" in r.body for r in server.requests]
    # turn 1 needs no continuation; turn 2 tries it, is refused and is sent again without; then never again
    assert sent == [False, True, False, False, False]
    assert gen.continues is False
    assert traj.answer == "Tarsk" and [s.action for s in traj.steps] == ["invalid", "search", "over_budget",
                                                                           "forced_answer"]
    assert sum("rejected continue_final_message" in r.message for r in caplog.records) == 1


def test_continuation_on_reports_the_refusal_and_off_never_asks(server: FakeOpenAIServer) -> None:
    server.reset(rejects_continuation)
    with pytest.raises(openai.UnprocessableEntityError):
        run_loop(server, api="chat", chat_continuation="on")
    server.reset(rejects_continuation)
    traj, gen = run_loop(server, api="chat", chat_continuation="off")
    assert not any("continue_final_message" in r.body for r in server.requests) and traj.answer == "Tarsk"


def reopens_the_answer(req: dict[str, Any]) -> Reply:
    """A model that cannot continue its message writes a new turn, re-opening the forced answer's tag."""
    if context_of(req).endswith("<answer>"):
        return Reply(text="<think>Doc 1.</think><answer> Tarsk </answer>")
    return scripted_policy(req)


def test_a_reopened_answer_tag_is_read_as_the_forced_answer(server: FakeOpenAIServer) -> None:
    server.reset(reopens_the_answer)
    traj, _ = run_loop(server, api="chat", chat_continuation="off")
    assert traj.finish == "forced_answer" and traj.answer == "Tarsk"


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_kept_stop_string_gives_the_same_trajectory_as_a_cut_one(server: FakeOpenAIServer, api: str) -> None:
    cut, _ = run_loop(server, api=api)
    cut_turns = [r.body for r in server.requests]
    server.reset(scripted_policy)
    server.keep_stop = True  # transformers serve keeps "</search>" in the text
    kept, _ = run_loop(server, api=api)
    assert comparable(kept) == comparable(cut)
    assert [context_of(r.body) for r in server.requests] == [context_of(b) for b in cut_turns]
    assert "hallucinated" not in kept.text  # the text after the stop string never reaches the context


def test_a_request_without_the_user_message_is_refused_by_the_chat_api(server: FakeOpenAIServer) -> None:
    from routerag.policy.types import GenerationRequest

    gen = OpenAIGenerator(GeneratorConfig(backend="openai", model="m", base_url=server.base_url, api="chat"))
    with pytest.raises(ValueError, match="api = 'completions'"):
        asyncio.run(gen.generate(GenerationRequest("rendered", None, 8, ("</search>",))))
    assert server.requests == []


# -- upstream faults through the REST server --------------------------------------------------------------------------

FAULTS = {
    "http-500": Reply(status=500, error="upstream exploded", headers={"retry-after-ms": "1"}),
    "garbage": Reply(raw="<html>Bad Gateway</html>"),
    "no-choices": Reply(raw={"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "policy",
                             "choices": []}),
    "not-a-completion": Reply(raw={"status": "ok"}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_upstream_faults_are_a_502_with_a_json_error(index: Path, retriever: Retriever, fault: str,
                                                     stream: bool) -> None:
    with FakeOpenAIServer(lambda req: FAULTS[fault]) as llm:
        gen = OpenAIGenerator(GeneratorConfig(backend="openai", model="policy", base_url=llm.base_url, timeout_s=10,
                                              stream=stream))
        settings = Settings()
        app = create_app(Engine(index, settings, generator=gen, retriever=retriever), settings)
        with live_server(app) as url:
            r = httpx.post(f"{url}/ask", json={"question": Q}, timeout=30)
            sse = httpx.post(f"{url}/ask", json={"question": Q, "stream": True}, timeout=30)
    assert r.status_code == 502, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["type"] == "backend_error" and error["message"].startswith("a backend failed: ")
    if fault in ("no-choices", "not-a-completion", "garbage"):
        assert "UpstreamError" in error["message"] and "policy server" in error["message"]
    events = parse_sse(sse.text)
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "backend_error"


def test_no_choices_is_an_upstream_error_for_completions_too(server: FakeOpenAIServer) -> None:
    server.reset(lambda req: FAULTS["no-choices"])
    with pytest.raises(UpstreamError, match="no choices"):
        run_loop(server, api="completions", stream=False)


def test_resuming_an_evaluation_ignores_the_openai_only_settings_of_other_backends() -> None:
    from routerag.evaluation.runner import _fingerprint

    def fp(**gen: Any) -> dict[str, Any]:
        return _fingerprint({"policy": {"generator": gen}, "retrieval": {}}, "learned")["policy"]["generator"]

    # an evaluation started before these settings existed resumes: they change no other backend's answers
    assert fp(backend="transformers", api="completions", chat_continuation="on") == fp(backend="transformers")
    assert fp(backend="openai", api="chat", stream=True) == fp(backend="openai", api="chat", stream=False)
    assert fp(backend="openai", api="chat") != fp(backend="openai", api="completions")
