"""The RouteRAG agent loop through verl's own agent-loop worker on CPU: verl's ``AgentLoopWorker`` reads the YAML the
launcher wrote, instantiates our loop from its registry with Hydra and runs it against a rollout-server client that
generates in-process (the tiny random model through our transformers backend, or a script), then pads the result
into verl's ``DataProto``. The response ids, mask and log-probabilities are checked against an expectation rebuilt
from what the server itself saw and returned, not from the trajectory."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker
from verl.protocol import DataProto

from routerag.config import GeneratorConfig, RetrievalConfig, Settings, TrainConfig
from routerag.policy.backends.transformers_backend import TransformersGenerator
from training.models import tiny_random_model
from training.verl_plugin.agent_loop import search_backend
from training.verl_plugin.compose import compose_launch
from training.verl_plugin.cpu_server import InProcessServerClient
from training.verl_plugin.launch import prepare_launch

from .helpers.scripted import ScriptedGenerator

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Who composed The Glass Lighthouse?"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """The tiny random model, saved as a model folder (verl's workers load the tokenizer and config from a path)."""
    model, tok = tiny_random_model(0)
    folder = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory: pytest.TempPathFactory, minilm: Any, spacy_extractor: Any) -> Path:
    """An index of the first 8 passages of the shipped sample corpus, built with the session's models."""
    from graph_index.builder import Components, build_index

    tmp = tmp_path_factory.mktemp("sample-index")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("\n".join((ROOT / "samples" / "corpus.jsonl").read_text().splitlines()[:8]) + "\n")
    cfg = Settings(cache_dir=tmp / "cache")
    build_index([corpus], tmp / "idx", cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return tmp / "idx"


class RecordingWorker(AgentLoopWorker):
    """verl's agent-loop worker, keeping each loop's own output before verl pads it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outputs: list[Any] = []

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> Any:
        self.outputs.append(output)
        return await super()._agent_loop_postprocess(output, validate, **kwargs)


def _objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def prompts(question: str, golds: list[str]) -> DataProto:
    """One dataset row as verl's RL dataset hands it to the agent-loop worker (``routerag prepare-data`` columns)."""
    return DataProto.from_dict(non_tensors={
        "raw_prompt": _objects([[{"role": "user", "content": f"Answer with searches. Question: {question}"}]]),
        "extra_info": _objects([{"question": question, "index": 0}]),
        "reward_model": _objects([{"style": "rule", "ground_truth": {"target": golds}}]),
        "data_source": _objects(["sample"]), "index": _objects([0])})


def launch_config(tmp_path: Path, model_dir: Path, *, index: Path | None = None,
                  retrieval: RetrievalConfig | None = None, **verl: Any) -> DictConfig:
    """The composed verl config of a small launch (the agent-loop YAML is written by the launcher, as for a run)."""
    cfg = TrainConfig(engine="verl", budget=2, max_turn_tokens=16, max_information_tokens=64, group_size=2,
                      verl={"train_files": ["train.parquet"], "model": str(model_dir), "max_prompt_length": 256,
                            "max_response_length": 512, **verl})
    plan = prepare_launch(cfg, tmp_path / "run", index_dir=str(index) if index else None, retrieval=retrieval)
    return compose_launch(plan["overrides"])


def run_worker(config: DictConfig, server: InProcessServerClient, batch: DataProto) -> tuple[Any, DataProto]:
    worker = RecordingWorker(config, llm_client=server)
    out = asyncio.run(worker.generate_sequences(batch))
    [loop_output] = worker.outputs
    return loop_output, out


def expected_from_server(server: InProcessServerClient) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt, response ids, mask, log-probs) rebuilt from the server's calls alone: each call's context is the
    previous context plus what the loop appended (mask 0), and each answer is the policy's (mask 1)."""
    prompt = server.calls[0].prompt_ids
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for call in server.calls:
        assert call.prompt_ids[: len(prompt) + len(ids)] == prompt + ids  # the context only ever grows
        appended = call.prompt_ids[len(prompt) + len(ids):]
        ids, mask, logprobs = ids + appended, mask + [0] * len(appended), logprobs + [0.0] * len(appended)
        ids, mask = ids + call.token_ids, mask + [1] * len(call.token_ids)
        logprobs += list(call.log_probs or [])
    return prompt, ids, mask, logprobs


def check_against_padding(loop_output: AgentLoopOutput, out: DataProto) -> None:
    """verl's padded DataProto holds exactly the loop's output (prompt left-padded, response right-padded)."""
    n_prompt, n_resp = len(loop_output.prompt_ids), len(loop_output.response_ids)
    width = out.batch["prompts"].shape[1]
    assert out.batch["prompts"][0, width - n_prompt:].tolist() == loop_output.prompt_ids
    assert out.batch["responses"][0, :n_resp].tolist() == loop_output.response_ids
    assert out.batch["response_mask"][0, :n_resp].tolist() == loop_output.response_mask
    assert int(out.batch["response_mask"][0, n_resp:].sum()) == 0
    assert int(out.batch["attention_mask"][0, width:].sum()) == n_resp


def test_tiny_model_rollout_through_verls_agent_loop_worker(tmp_path: Path, tiny: tuple[Path, Any, Any],
                                                            sample_index: Path) -> None:
    folder, model, tok = tiny
    config = launch_config(tmp_path, folder, index=sample_index)
    torch.manual_seed(0)
    generator = TransformersGenerator(GeneratorConfig(model="tiny-random", max_batch=4), model=model, tokenizer=tok)
    server = InProcessServerClient(config, generator)
    loop_output, out = run_worker(config, server, prompts(QUESTION, ["Marisol Vantreigh"]))

    assert isinstance(loop_output, AgentLoopOutput)
    prompt, ids, mask, logprobs = expected_from_server(server)
    assert loop_output.prompt_ids == prompt
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")  # verl built the chat prompt, generation follows
    assert loop_output.response_ids == ids and loop_output.response_mask == mask
    assert loop_output.response_logprobs == pytest.approx(logprobs)
    # a random model never writes a valid turn: the loop's notices are appended, masked out, between its turns
    assert 0 in mask and 1 in mask and len(server.calls) >= 2
    notices = tok.decode([t for t, m in zip(ids, mask) if m == 0])
    assert "My previous action is invalid" in notices or "search budget is used up" in notices
    assert all(c.sampling_params["logprobs"] and c.sampling_params["max_tokens"] <= 16 for c in server.calls)
    check_against_padding(loop_output, out)
    assert out.batch["rollout_log_probs"][0, : len(ids)].tolist() == pytest.approx(logprobs, abs=1e-6)
    rollout = out.non_tensor_batch["rollout"][0]
    assert rollout["searches"] == 0 and out.non_tensor_batch["searches"][0] == 0


def test_in_process_retrieval_uses_the_users_retrieval_settings(tmp_path: Path, tiny: tuple[Path, Any, Any],
                                                                sample_index: Path) -> None:
    folder, _, tok = tiny
    settings = RetrievalConfig(max_query_chars=48, fact_top_k=2, rrf_k=30)  # the default max_query_chars is 4000
    config = launch_config(tmp_path, folder, index=sample_index, retrieval=settings)
    long_query = "which opera house hosted the premiere of this particular opera"  # 61 characters
    turns = ["<think>I need the composer.</think>\n<search>[graph] The Glass Lighthouse opera</search>",
             f"<search>[passage] {long_query}</search>", "<answer>Marisol Vantreigh</answer>"]
    server = InProcessServerClient(config, ScriptedGenerator(list(turns), tokenizer=tok))
    loop_output, out = run_worker(config, server, prompts(QUESTION, ["Marisol Vantreigh"]))

    prompt, ids, mask, _ = expected_from_server(server)
    assert loop_output.response_ids == ids and loop_output.response_mask == mask
    # the policy's tokens are exactly the script's, each span masked 1; everything between them is masked 0
    assert [c.token_ids for c in server.calls] == [tok.encode(t, add_special_tokens=False) for t in turns]
    info = [tok.decode(server.calls[i].prompt_ids[len(server.calls[i - 1].prompt_ids) +
                                                  len(server.calls[i - 1].token_ids):]) for i in (1, 2)]
    assert "<information>Doc 1 (Title: " in info[0] and "The Glass Lighthouse" in info[0]
    assert "That search failed: query longer than 48 characters" in info[1]  # the user's limit, not the default
    assert sum(mask) == sum(len(c.token_ids) for c in server.calls) and mask.count(0) > 0
    check_against_padding(loop_output, out)
    rollout = out.non_tensor_batch["rollout"][0]
    assert rollout["answer"] == "Marisol Vantreigh" and rollout["searches"] == 1
    assert rollout["queries"] == ["The Glass Lighthouse opera"] and rollout["retrieval_ms"] > 0
    same = search_backend(retriever_url=None, retriever_api_key_env=None, index_dir=str(sample_index.resolve()),
                          retrieval=settings)
    assert same.retriever.cfg == settings  # the worker's cached retriever was built with the user's settings


def test_a_remote_retriever_is_called_with_the_key_from_the_named_variable(
        tmp_path: Path, tiny: tuple[Path, Any, Any], sample_index: Path, minilm: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from routerag.engine import Engine
    from routerag.retrieval import Retriever
    from server.app import create_app

    from .helpers.server_helpers import RoutingPolicy, live_server

    folder, _, tok = tiny
    settings = Settings(server={"api_key": "s3cret-key"})
    retriever = Retriever(sample_index, RetrievalConfig(), embedder=minilm)
    app = create_app(Engine(sample_index, settings, generator=RoutingPolicy(), retriever=retriever), settings)
    turns = ["<search>[passage] The Glass Lighthouse</search>", "<answer>Marisol Vantreigh</answer>"]
    with live_server(app) as url:
        config = launch_config(tmp_path, folder, retriever_url=url, retriever_api_key_env="RETRIEVER_KEY_FOR_TEST")
        written = (tmp_path / "run" / "agent_loops.yaml").read_text()
        assert "RETRIEVER_KEY_FOR_TEST" in written and "s3cret-key" not in written

        monkeypatch.delenv("RETRIEVER_KEY_FOR_TEST", raising=False)  # no key: the server refuses the search
        server = InProcessServerClient(config, ScriptedGenerator(list(turns), tokenizer=tok))
        with pytest.raises(httpx.HTTPStatusError, match="401"):
            run_worker(config, server, prompts(QUESTION, ["Marisol Vantreigh"]))

        monkeypatch.setenv("RETRIEVER_KEY_FOR_TEST", "s3cret-key")
        server = InProcessServerClient(config, ScriptedGenerator(list(turns), tokenizer=tok))
        loop_output, out = run_worker(config, server, prompts(QUESTION, ["Marisol Vantreigh"]))
    info = tok.decode(server.calls[1].prompt_ids[len(server.calls[0].prompt_ids) + len(server.calls[0].token_ids):])
    assert "<information>Doc 1 (Title: " in info
    rollout = out.non_tensor_batch["rollout"][0]
    assert rollout["searches"] == 1 and rollout["answer"] == "Marisol Vantreigh"
    assert json.loads(json.dumps(rollout)) == rollout  # travels through verl's extra_fields as plain JSON
