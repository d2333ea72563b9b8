"""The LLM extractor against a real local OpenAI-compatible server (scripted replies), and its vLLM offline path
against a fake ``vllm`` module."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from graph_index.openie import prompts
from graph_index.openie.llm import LLMEndpointError, LLMExtractor, parse_entities, parse_triples
from graph_index.config import ExtractorConfig
from graph_index.corpus import Passage

try:
    from tests.helpers.fake_openai import FakeOpenAIServer, Reply, free_port, last_user_message
except ImportError:  # tests/ is not a package: pytest puts it on sys.path instead
    from fake_openai import FakeOpenAIServer, Reply, free_port, last_user_message

# -- helpers -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def server(_server: FakeOpenAIServer) -> FakeOpenAIServer:
    _server.reset()
    _server.models = None
    return _server


def make_extractor(url: str, **kw: Any) -> LLMExtractor:
    kw.setdefault("concurrency", 4)
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout_s", 10)
    return LLMExtractor("test-model", base_url=url, **kw)


def is_ner(req: dict[str, Any]) -> bool:
    return req["messages"][0]["content"] == prompts.NER_SYSTEM


def passage_in(req: dict[str, Any]) -> str:
    """The passage text of a request (between the fences of the last user message)."""
    return re.search(r"```\n(.*?)\n```", last_user_message(req), re.S).group(1)  # type: ignore[union-attr]


def ner_json(*entities: str) -> str:
    return json.dumps({"named_entities": list(entities)})


def triples_json(*triples: tuple[str, str, str]) -> str:
    return json.dumps({"triples": [list(t) for t in triples]})


P_ADA = Passage("p1", "Ada Lovelace", "She worked with Charles Babbage on the Analytical Engine.")


def title_handler(req: dict[str, Any]) -> str:
    """NER: the passage's title is its one entity; triples: (title, "has", "fact")."""
    title = passage_in(req).split("\n", 1)[0]
    return ner_json(title) if is_ner(req) else triples_json((title, "has", "fact"))


def run(ex: LLMExtractor, passages: list[Passage]) -> list:
    try:
        return list(ex.extract(passages))
    finally:
        ex.close()


# -- two-step extraction -----------------------------------------------------------------------------------------------


def test_two_step_extraction(server: FakeOpenAIServer) -> None:
    ner = ["Ada Lovelace", "Charles Babbage", "Analytical Engine"]
    triples = [("Ada Lovelace", "worked with", "Charles Babbage"),
               ("Ada Lovelace", "worked on", "Analytical Engine"),
               ("Charles Babbage", "designed", "difference engine")]
    server.handler = lambda req: ner_json(*ner) if is_ner(req) else triples_json(*triples)
    ex = make_extractor(server.base_url)
    [r] = run(ex, [P_ADA])

    assert r.ok and r.error is None
    assert r.triples == triples
    assert r.entities == ner  # the named entities only; triple ends may be common nouns (see OpenIEResult)
    assert r.source == ex.identity

    assert len(server.requests) == 2
    ner_req, tri_req = (q.body for q in server.requests)
    assert is_ner(ner_req) and not is_ner(tri_req)
    assert passage_in(ner_req) == P_ADA.content == passage_in(tri_req)
    assert json.dumps({"named_entities": ner}) in last_user_message(tri_req)  # conditioned on the NER output
    assert tri_req["model"] == "test-model" and tri_req["temperature"] == 0.0
    assert ex.requests == 2 and ex.retries == 0 and ex.failures == 0
    assert ex.prompt_tokens > 0 and ex.completion_tokens > 0


def test_identity_and_from_config(server: FakeOpenAIServer) -> None:
    a = LLMExtractor.from_config(ExtractorConfig(kind="llm", llm_model="m", llm_base_url=server.base_url,
                                                 llm_api_key="secret", concurrency=3, max_attempts=2))
    b = LLMExtractor.from_config(ExtractorConfig(kind="llm", llm_model="m", llm_base_url="http://elsewhere:1/v1"))
    try:
        assert a.identity == b.identity == f"llm:m:{prompts.PROMPT_VERSION}"
        assert a.concurrency == 3 and a.max_attempts == 2 and a.window == 12
    finally:
        a.close()
        b.close()
    with pytest.raises(ValueError, match="llm_model"):
        LLMExtractor.from_config(ExtractorConfig(kind="llm"))


def test_no_entities_skips_the_triple_step(server: FakeOpenAIServer) -> None:
    server.handler = lambda req: ner_json()
    [r] = run(make_extractor(server.base_url), [P_ADA])
    assert r.ok and r.entities == [] and r.triples == []
    assert len(server.requests) == 1


# -- lenient reading ---------------------------------------------------------------------------------------------------

MESSY_NER = [
    'Sure! Here are the entities:\n```json\n{"named_entities": ["Ada Lovelace", "Charles Babbage",]}\n```\nDone.',
    "{'named_entities': ['Ada Lovelace', 'Charles Babbage']}",
    '```\n["Ada Lovelace", "Charles Babbage"]\n```',
    '{"named_entities": ["Ada Lovelace", "Charles Babbage", "Ada Lovelace"]} {"other": 1}',
    '<think>Maybe {"named_entities": ["Ada"]}? No, both names.</think>\n{"named_entities": ["Ada Lovelace", '
    '"Charles Babbage"]}',
]


@pytest.mark.parametrize("reply", MESSY_NER)
def test_messy_entities_are_repaired(reply: str) -> None:
    assert parse_entities(reply) == ["Ada Lovelace", "Charles Babbage"]


@pytest.mark.parametrize("reply", [
    "I'm sorry, I cannot help with that.",
    "",
    '{"entities": ["A"]}',
    '{"named_entities": "Ada"}',
    '{"named_entities": [{"name": "Ada"}]}',
])
def test_garbage_entities_are_rejected(reply: str) -> None:
    with pytest.raises(ValueError):
        parse_entities(reply)


def test_truncated_replies_keep_complete_elements() -> None:
    assert parse_entities('{"named_entities": ["Ada", "Charles Bab', truncated=True) == ["Ada"]
    assert parse_triples('{"triples": [["A", "r", "B"], ["A", "r2", "C"], ["A", "r3", "Dar',
                         truncated=True) == [("A", "r", "B"), ("A", "r2", "C")]
    with pytest.raises(ValueError):
        parse_triples('{"triples": [["A", "r", "B', truncated=True)


def test_messy_and_truncated_replies_end_to_end(server: FakeOpenAIServer) -> None:
    def handler(req: dict[str, Any]) -> Reply:
        if is_ner(req):
            return Reply(text="Entities:\n```json\n{'named_entities': ['Ada Lovelace', 'Charles Babbage',],}\n```")
        # cut off by max_tokens in the middle of the third triple
        return Reply(text='Here you go: {"triples": [["Ada Lovelace", "worked with", "Charles Babbage"], '
                          '["Ada Lovelace", "born in", "London"], ["Ada Lovelace", "died in", "Lon',
                     finish_reason="length")

    server.handler = handler
    ex = make_extractor(server.base_url)
    [r] = run(ex, [P_ADA])
    assert r.ok
    assert r.triples == [("Ada Lovelace", "worked with", "Charles Babbage"), ("Ada Lovelace", "born in", "London")]
    assert r.entities == ["Ada Lovelace", "Charles Babbage"]  # the NER reply's entities
    assert ex.retries == 0 and len(server.requests) == 2


# -- retries and failures ----------------------------------------------------------------------------------------------


def test_garbage_then_good_is_retried(server: FakeOpenAIServer) -> None:
    calls = {"triples": 0}

    def handler(req: dict[str, Any]) -> str:
        if is_ner(req):
            return ner_json("Ada Lovelace")
        calls["triples"] += 1
        if calls["triples"] == 1:
            return "As an AI model I think Ada Lovelace is interesting."
        return triples_json(("Ada Lovelace", "worked with", "Charles Babbage"))

    server.handler = handler
    ex = make_extractor(server.base_url, max_attempts=3)
    [r] = run(ex, [P_ADA])
    assert r.ok and r.triples == [("Ada Lovelace", "worked with", "Charles Babbage")]
    assert ex.retries == 1 and ex.requests == 3 and ex.failures == 0
    temps = [q.body["temperature"] for q in server.requests if not is_ner(q.body)]
    assert temps == [0.0, pytest.approx(0.2)]  # the retry is a little hotter


def test_garbage_always_fails_only_that_passage(server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    passages = [Passage(f"p{i}", f"Title {i}", f"Text {i}.") for i in range(4)]

    def handler(req: dict[str, Any]) -> str:
        title = passage_in(req).split("\n", 1)[0]
        if is_ner(req):
            return ner_json(title)
        return "{{{ not json at all" if title == "Title 2" else triples_json((title, "is", "page"))

    server.handler = handler
    ex = make_extractor(server.base_url, max_attempts=3)
    with caplog.at_level(logging.WARNING, logger="graph_index.openie.llm"):
        results = run(ex, passages)

    assert [r.ok for r in results] == [True, True, False, True]
    bad = results[2]
    assert bad.triples == [] and bad.entities == ["Title 2"] and "3 attempts" in (bad.error or "")
    assert results[3].triples == [("Title 3", "is", "page")]
    assert any("p2" in rec.getMessage() and rec.levelno == logging.WARNING for rec in caplog.records)
    assert ex.failures == 1 and ex.retries == 2
    assert sum(1 for q in server.requests if "Title 2" in passage_in(q.body)) == 1 + 3


def test_bad_request_fails_one_passage(server: FakeOpenAIServer) -> None:
    passages = [Passage("p0", "Short", "ok"), Passage("p1", "Long", "too long"), Passage("p2", "Other", "ok")]

    def handler(req: dict[str, Any]) -> Reply | str:
        if "Long" in passage_in(req):
            return Reply(status=400, error="This model's maximum context length is 4096 tokens.")
        return title_handler(req)

    server.handler = handler
    results = run(make_extractor(server.base_url), passages)
    assert [r.ok for r in results] == [True, False, True]
    assert "maximum context length" in (results[1].error or "")


# -- endpoint failures abort -------------------------------------------------------------------------------------------


def test_server_down_raises_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    ex = make_extractor(url, max_retries=1)
    with pytest.raises(RuntimeError, match=re.escape(f"LLM endpoint {url}") + ".*unreachable"):
        run(ex, [P_ADA])


def test_http_500_raises_after_client_retries(server: FakeOpenAIServer) -> None:
    server.handler = lambda req: Reply(status=500, error="engine crashed", headers={"retry-after-ms": "1"})
    ex = make_extractor(server.base_url, max_retries=2)
    with pytest.raises(LLMEndpointError, match="unreachable.*500.*engine crashed"):
        run(ex, [P_ADA])
    assert len(server.requests) == 3  # the openai client's own retries


def test_transient_500_is_retried_by_the_client(server: FakeOpenAIServer) -> None:
    seen = {"n": 0}

    def handler(req: dict[str, Any]) -> Reply | str:
        seen["n"] += 1
        if seen["n"] == 1:
            return Reply(status=503, error="warming up", headers={"retry-after-ms": "1"})
        return title_handler(req)

    server.handler = handler
    [r] = run(make_extractor(server.base_url, max_retries=2), [P_ADA])
    assert r.ok and r.triples == [("Ada Lovelace", "has", "fact")]


def test_unknown_model_raises(server: FakeOpenAIServer) -> None:
    server.models = ["served-model"]
    with pytest.raises(RuntimeError, match="404.*'test-model'.*does not exist"):
        run(make_extractor(server.base_url), [P_ADA])


def test_abort_keeps_finished_windows(server: FakeOpenAIServer) -> None:
    passages = [Passage(f"p{i}", f"T{i}", "x") for i in range(6)]

    def handler(req: dict[str, Any]) -> Reply | str:
        if passage_in(req).startswith("T4"):
            return Reply(status=500, error="down")
        return title_handler(req)

    server.handler = handler
    ex = make_extractor(server.base_url, concurrency=1, window=2)
    got = []
    with pytest.raises(LLMEndpointError):
        for r in ex.extract(passages):
            got.append(r)
    ex.close()
    assert [r.entities[0] for r in got] == ["T0", "T1", "T2", "T3"]


# -- concurrency and order ---------------------------------------------------------------------------------------------


def test_requests_run_concurrently_and_results_stay_in_order(server: FakeOpenAIServer) -> None:
    passages = [Passage(f"p{i}", f"Title {i}", f"Text {i}.") for i in range(16)]
    lock = threading.Lock()
    state = {"now": 0, "max": 0}

    def handler(req: dict[str, Any]) -> str:
        head = passage_in(req).split("\n", 1)[0]
        if not head.startswith("Title "):  # a straggler aborted by an earlier test on the shared server
            return title_handler(req)
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        # later passages answer faster, so completion order differs from passage order
        i = int(head.split()[1])
        time.sleep(0.2 if i < 8 else 0.05)
        with lock:
            state["now"] -= 1
        return title_handler(req)

    server.handler = handler
    ex = make_extractor(server.base_url, concurrency=4)
    t0 = time.perf_counter()
    results = run(ex, passages)
    elapsed = time.perf_counter() - t0

    assert elapsed < 4.0, elapsed  # serially this would take 16 × 2 × 0.2 s
    assert 2 <= state["max"] <= 4
    assert [r.entities[0] for r in results] == [p.title for p in passages]
    assert all(r.ok for r in results) and ex.requests == 32


def test_extract_works_inside_a_running_event_loop(server: FakeOpenAIServer) -> None:
    import asyncio

    server.handler = title_handler
    ex = make_extractor(server.base_url)

    async def main() -> list:
        return list(ex.extract([P_ADA]))

    try:
        [r] = asyncio.run(main())
    finally:
        ex.close()
    assert r.ok and r.entities == ["Ada Lovelace"] and r.triples == [("Ada Lovelace", "has", "fact")]


# -- vLLM offline backend ----------------------------------------------------------------------------------------------


class _FakeVLLM:
    """A stand-in for the ``vllm`` module: ``LLM.chat`` answers with a script and records its batches."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.calls: list[tuple[str, int, float]] = []
        self.module = types.ModuleType("vllm")
        fake = self

        class SamplingParams:
            def __init__(self, temperature: float = 1.0, max_tokens: int = 16, **kw: Any) -> None:
                self.temperature = temperature
                self.max_tokens = max_tokens

        class LLM:
            def __init__(self, model: str, **kw: Any) -> None:
                self.model = model

            def chat(self, messages: list, sampling_params: Any = None, use_tqdm: bool = True, **kw: Any) -> list:
                step = "ner" if messages[0][0]["content"] == prompts.NER_SYSTEM else "triples"
                fake.calls.append((step, len(messages), sampling_params.temperature))
                outs = []
                for conv in messages:
                    text, finish = fake.script(step, conv)
                    comp = types.SimpleNamespace(text=text, finish_reason=finish, token_ids=[0] * len(text.split()))
                    outs.append(types.SimpleNamespace(outputs=[comp], prompt_token_ids=[0] * 10))
                return outs

        self.module.LLM = LLM  # type: ignore[attr-defined]
        self.module.SamplingParams = SamplingParams  # type: ignore[attr-defined]


def _conv_title(conv: list[dict[str, str]]) -> str:
    return re.search(r"```\n(.*?)\n", conv[-1]["content"]).group(1)  # type: ignore[union-attr]


def test_vllm_backend_batches_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    def script(step: str, conv: list[dict[str, str]]) -> tuple[str, str]:
        title = _conv_title(conv)
        if step == "ner":
            return ner_json(title), "stop"
        assert json.dumps({"named_entities": [title]}) in conv[-1]["content"]
        return triples_json((title, "has", "fact")), "stop"

    fake = _FakeVLLM(script)
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    passages = [Passage(f"p{i}", f"T{i}", "x") for i in range(5)]
    ex = LLMExtractor("some/model", backend="vllm", window=3)
    results = run(ex, passages)
    assert [(s, n) for s, n, _ in fake.calls] == [("ner", 3), ("triples", 3), ("ner", 2), ("triples", 2)]
    assert [r.triples for r in results] == [[(p.title, "has", "fact")] for p in passages]
    assert all(r.ok for r in results) and ex.requests == 10 and ex.prompt_tokens == 100


def test_vllm_backend_retries_only_the_garbage(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    seen: dict[str, int] = {}

    def script(step: str, conv: list[dict[str, str]]) -> tuple[str, str]:
        title = _conv_title(conv)
        seen[step + title] = seen.get(step + title, 0) + 1
        if step == "ner":
            if title == "T1" and seen[step + title] == 1:
                return "no idea", "stop"
            return ner_json(title), "stop"
        if title == "T2":
            return '{"triples": [["T2", "is', "length"  # never a complete triple
        return triples_json((title, "has", "fact")), "stop"

    fake = _FakeVLLM(script)
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    ex = LLMExtractor("some/model", backend="vllm", window=8, max_attempts=2)
    with caplog.at_level(logging.WARNING, logger="graph_index.openie.llm"):
        results = run(ex, [Passage(f"p{i}", f"T{i}", "x") for i in range(3)])
    assert fake.calls == [("ner", 3, 0.0), ("ner", 1, pytest.approx(0.2)),
                          ("triples", 3, 0.0), ("triples", 1, pytest.approx(0.2))]
    assert [r.ok for r in results] == [True, True, False]
    assert results[1].triples == [("T1", "has", "fact")]
    assert results[2].entities == ["T2"] and results[2].triples == []
    assert ex.retries == 2 and ex.failures == 1
    assert any("p2" in rec.getMessage() for rec in caplog.records)


def test_vllm_missing_says_install_gpu_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    ex = LLMExtractor("some/model", backend="vllm")
    with pytest.raises(RuntimeError, match=r"gpu"):
        run(ex, [P_ADA])


# -- the fake server itself (reused by other tests) --------------------------------------------------------------------


def test_fake_server_stop_strings_usage_and_endpoints(server: FakeOpenAIServer) -> None:
    server.handler = lambda req: Reply(text="alpha beta STOP gamma", finish_reason="length")
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}],
                                              stop=["STOP", "beta"])
        assert chat.choices[0].message.content == "alpha " and chat.choices[0].finish_reason == "stop"
        assert chat.usage is not None and chat.usage.prompt_tokens == 2 and chat.usage.completion_tokens == 1
        comp = client.completions.create(model="m", prompt=["one", "two"])
        assert [c.text for c in comp.choices] == ["alpha beta STOP gamma"] * 2
        assert {c.finish_reason for c in comp.choices} == {"length"}
        assert [q.path for q in server.requests] == ["/v1/chat/completions", "/v1/completions"]
        assert [m.id for m in client.models.list()] == ["fake-model"]
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True,
                                                stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "alpha beta STOP gamma"
        assert chunks[-1].usage is not None
    finally:
        client.close()
