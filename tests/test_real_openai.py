"""Every OpenAI-compatible integration against a real server: ``transformers serve`` with the embedded SmolLM2-135M
(tests/helpers/real_openai.py). The policy backend on both APIs (streamed and whole), the LLM OpenIE extractor, the fact
filter, and ``routerag ask --backend openai`` end to end on the sample index.

The model is tiny, so these tests assert protocol facts, not answer quality: requests reach the server and come
back as completions, streamed and whole replies agree, stop strings end the text wherever the server leaves them,
the chat continuation falls back on a server that refuses it, and a trajectory finishes without an exception."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from graph_index.openie.llm import LLMExtractor
from routerag.config import GeneratorConfig
from graph_index.corpus import Passage
from routerag.policy.backends.openai_backend import OpenAIGenerator
from routerag.policy.parsing import close_stop
from routerag.policy.types import Generation, GenerationRequest
from routerag.retrieval.fact_filter import LLMFactFilter

from .helpers import real_openai as real
from .helpers.real_openai import RealServer

real_openai = real.real_openai  # the session fixture, made visible to this module's tests

SAMPLE_QUESTION = "In what city was Marisol Vantreigh born?"


def generate(server: RealServer, request: GenerationRequest, **cfg: Any) -> tuple[Generation, OpenAIGenerator]:
    gen = OpenAIGenerator(GeneratorConfig(backend="openai", model=server.model, base_url=server.base_url,
                                          timeout_s=60, **cfg))

    async def go() -> Generation:
        try:
            return await gen.generate(request)
        finally:
            await gen.aclose()

    return asyncio.run(go()), gen


def test_chat_streamed_and_whole_agree_and_the_stop_string_ends_the_text(real_openai: RealServer) -> None:
    # greedy SmolLM2 answers this with "Paris is a city that ..."; the stop string makes it stop after a few tokens
    req = GenerationRequest("", None, max_tokens=12, stop=("city",), temperature=0.0,
                            user_message="<search>Paris</search>")
    before = real_openai.requests_seen()
    whole, _ = generate(real_openai, req, api="chat", stream=False)
    streamed, _ = generate(real_openai, req, api="chat", stream=True)
    assert real_openai.requests_seen() == before + 2
    assert streamed.text == whole.text and streamed.finish_reason == whole.finish_reason
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (whole.prompt_tokens, whole.completion_tokens)
    assert whole.prompt_tokens > 0 and 0 < whole.completion_tokens < 12  # the stop string fired before the limit
    # the text ends at the stop string, whether the server kept it (transformers serve) or cut it (OpenAI)
    assert whole.text.count("city") <= 1 and (whole.text.endswith("city") or "city" not in whole.text)
    assert whole.finish_reason == ("stop" if whole.text.endswith("city") else "eos")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_continue_a_search_tag_and_the_loop_closes_it(real_openai: RealServer, stream: bool) -> None:
    prompt = "<search>hello</search> <search>world</search> <search>foo"
    req = GenerationRequest(prompt, None, max_tokens=8, stop=("</search>", "</answer>"), temperature=0.0)
    before = real_openai.requests_seen()
    g, _ = generate(real_openai, req, api="completions", stream=stream)
    assert real_openai.requests_seen() == before + 1
    assert g.finish_reason == "stop" and g.completion_tokens < 8
    # whether the server kept "</search>" (it does) or cut it, the context the loop builds is the same
    assert close_stop("<search>foo" + g.text) == "<search>foo</search>"


def test_chat_continuation_falls_back_on_a_server_that_refuses_it(real_openai: RealServer,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    req = GenerationRequest("", None, max_tokens=8, stop=("</search>", "</answer>"), temperature=0.0,
                            user_message="Where is Paris?", response_text="<think>I should look it up.</think>\n")
    before = real_openai.requests_seen()
    g, gen = generate(real_openai, req, api="chat", chat_continuation="auto")
    # the request with continue_final_message is refused before generation: one generation reached the model
    assert real_openai.requests_seen() == before + 1
    assert gen.continues is False and g.completion_tokens > 0
    [warning] = [r.getMessage() for r in caplog.records if "rejected continue_final_message" in r.getMessage()]
    assert re.search(r"HTTP (400|422): \S", warning), warning  # the server's own reason, whatever its error format


def test_llm_openie_extracts_through_the_real_server(real_openai: RealServer) -> None:
    ex = LLMExtractor(real_openai.model, base_url=real_openai.base_url, max_attempts=1, max_tokens=48,
                      concurrency=1, timeout_s=60)
    passage = Passage(id="p1", title="Marisol Vantreigh", text="Marisol Vantreigh was born in Kestrel Harbor.")
    before = real_openai.requests_seen()
    try:
        [result] = list(ex.extract([passage]))
    finally:
        ex.close()
    stats = ex.stats()
    assert stats["requests"] >= 1 and real_openai.requests_seen() == before + stats["requests"]
    assert stats["prompt_tokens"] > 0 and stats["completion_tokens"] > 0
    # the tiny model may not write usable JSON: then the passage fails alone, with the model's reply as the reason
    assert result.ok or ("no usable reply" in (result.error or ""))


def test_fact_filter_asks_the_real_server(real_openai: RealServer) -> None:
    ff = LLMFactFilter(real_openai.base_url, real_openai.model, timeout_s=60, max_tokens=16)
    facts = [("Marisol Vantreigh", "born in", "Kestrel Harbor"), ("Kestrel Harbor", "is in", "Oreland")]
    before = real_openai.requests_seen()
    [kept] = ff.keep(["Where was Marisol Vantreigh born?"], [facts])
    assert ff.answered == 1 and real_openai.requests_seen() == before + 1
    assert kept is None or all(0 <= i < len(facts) for i in kept)  # unreadable keeps all; else valid indices


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory: pytest.TempPathFactory, minilm, spacy_extractor) -> Path:
    """The index ``make demo`` builds (samples/corpus.jsonl), with the session's models."""
    from graph_index.builder import Components, build_index
    from routerag.config import Settings

    from .conftest import ROOT

    out = tmp_path_factory.mktemp("sample") / "idx"
    cfg = Settings(cache_dir=out.parent / "cache")
    build_index([ROOT / "samples" / "corpus.jsonl"], out, cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return out


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_routerag_ask_against_the_real_server(real_openai: RealServer, sample_index: Path, api: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from routerag.cli import app

    monkeypatch.setenv("ROUTERAG_POLICY__MAX_TURN_TOKENS", "24")  # a tiny model on CPU: short turns keep it fast
    monkeypatch.setenv("ROUTERAG_POLICY__MAX_INVALID", "0")
    before = real_openai.requests_seen()
    res = CliRunner().invoke(app, ["ask", str(sample_index), SAMPLE_QUESTION, "--backend", "openai", "--base-url",
                                   real_openai.base_url, "--policy", real_openai.model, "--api", api, "--budget", "1",
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    steps = out["trace"]
    assert steps and out["finish"] in ("answer", "forced_answer", "no_answer")
    assert steps[-1]["action"] in ("answer", "forced_answer")
    assert all(s["completion_tokens"] > 0 and s["generation_ms"] > 0 for s in steps)
    assert out["tokens"]["prompt"] > 0 and out["searches"] <= 1
    assert real_openai.requests_seen() - before == len(steps)  # every turn was one request to the real server
    if out["finish"] != "no_answer":
        assert out["answer"]
