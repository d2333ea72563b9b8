"""An index built with an OpenAI-compatible embedder that needs a key: the manifest names the environment variable
that holds the key (never the key), and every later reader of the index (a fresh Retriever, ``routerag search``)
finds the key there; without it, the error names the variable. Against the scripted local server, which answers
401 to a missing or wrong key as OpenAI does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graph_index import embedders
from routerag.cli import app
from graph_index.config import EmbedderConfig
from routerag.config import RetrievalConfig
from graph_index.llm_clients import UpstreamError
from routerag.retrieval import Retriever

from .helpers.fake_openai import FakeOpenAIServer

FIX = Path(__file__).parent / "fixtures"
KEY = "sk-test-embedder-key-1234"
QUERY = "Where was Marie Curie born?"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(api_key=KEY) as s:
        yield s


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(embedders, "_LOADED", {})  # no embedder carried over from other tests
    return CliRunner()


def build(runner: CliRunner, server: FakeOpenAIServer, out: Path) -> dict:
    res = runner.invoke(app, ["build-graph", str(FIX / "curie.jsonl"), "--out", str(out), "--openie-results",
                              str(FIX / "curie_openie.json"), "--embedder", "openai:fake-embed", "--embed-base-url",
                              server.base_url])
    assert res.exit_code == 0, res.output
    return json.loads((out / "manifest.json").read_text())


def fresh_search(out: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(embedders, "_LOADED", {})  # a new process, as far as the embedder is concerned
    [res] = Retriever(out, RetrievalConfig(device="cpu")).search([QUERY], mode="passage", k=2)
    return [d.title for d in res.docs]


@pytest.mark.parametrize("how", ["named-variable", "explicit-key"])
def test_searching_an_index_finds_the_key_through_the_variable_its_manifest_names(
        runner: CliRunner, server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    server.reset()
    env = "EMBEDDINGS_TEST_KEY" if how == "named-variable" else "OPENAI_API_KEY"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if how == "named-variable":
        monkeypatch.setenv("ROUTERAG_EMBEDDER__API_KEY_ENV", env)
        monkeypatch.setenv(env, KEY)
    else:  # the key given as a setting at build time, the variable left at its default
        monkeypatch.setenv("ROUTERAG_EMBEDDER__API_KEY", KEY)
    out = tmp_path / "idx"
    manifest = build(runner, server, out)
    saved = manifest["config"]["embedder"]
    assert saved["api_key_env"] == env and "api_key" not in saved
    assert not [f.name for f in out.rglob("*") if f.is_file() and KEY.encode() in f.read_bytes()]
    assert {r.path for r in server.requests} == {"/v1/embeddings"}

    # query time: only the manifest and the environment, no build settings
    monkeypatch.delenv("ROUTERAG_EMBEDDER__API_KEY_ENV", raising=False)
    monkeypatch.delenv("ROUTERAG_EMBEDDER__API_KEY", raising=False)
    monkeypatch.setenv(env, KEY)
    server.reset()
    assert fresh_search(out, monkeypatch)[0] == "Marie Curie"
    res = runner.invoke(app, ["search", str(out), QUERY, "--mode", "passage", "-k", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["docs"][0]["title"] == "Marie Curie"
    assert server.requests and all(r.path == "/v1/embeddings" for r in server.requests)

    monkeypatch.delenv(env)
    with pytest.raises(UpstreamError, match=rf"refused the API key \(HTTP 401\).*set \${env}"):
        fresh_search(out, monkeypatch)
    res = runner.invoke(app, ["search", str(out), QUERY, "--mode", "passage"])
    assert res.exit_code == 1 and f"${env}" in res.output and "unset" in res.output

    monkeypatch.setenv(env, "sk-wrong")
    with pytest.raises(UpstreamError, match=rf"comes from \${env}.*check its value"):
        fresh_search(out, monkeypatch)


def test_the_default_variable_is_the_one_every_openai_client_reads() -> None:
    assert EmbedderConfig().api_key_env == "OPENAI_API_KEY"
    assert EmbedderConfig.model_validate({"name": "openai:m"}).api_key_env == "OPENAI_API_KEY"  # older manifests
