"""The ONNX Runtime GenAI engine of the in-process policy: the embedded router exported once (adapter merged) and its
base weights for the reader, checked against eager transformers on the same torch model; the fallback to eager."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from routerag.config import GeneratorConfig
from routerag.policy.types import GenerationRequest

from .helpers.eager_decoding import eager_one_at_a_time

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnx_ir")

STOP = ("</search>", "</answer>")


@pytest.fixture(scope="module")
def onnx_gen():
    from routerag.policy.backends import in_process_generator

    return in_process_generator(GeneratorConfig(engine="onnx"))


def _prompts(gen, n: int) -> list[tuple[str, list[int]]]:
    from routerag.prompts import DEFAULT_INSTRUCTION

    questions = ["Who wrote the libretto of The Glass Lighthouse?", "What is the occupation of Lena Okafor?",
                 "In which city was the composer of The Glass Lighthouse born?"]
    return [gen.render_prompt(DEFAULT_INSTRUCTION.format(question=q)) for q in questions[:n]]


@pytest.mark.parametrize("adapter", [True, False])
def test_greedy_batch_equals_eager_with_stops_and_logprobs(onnx_gen, adapter: bool) -> None:
    """A batch of prompts of different lengths decodes as each prompt alone does eagerly: the same tokens,
    the same stop, log-probabilities to within float32 noise; the router (adapter merged) and its base weights."""
    reqs = [GenerationRequest(t, ids, 40, STOP, temperature=0.0, adapter=adapter, logprobs=True)
            for t, ids in _prompts(onnx_gen, 3)]
    fast = onnx_gen.generate_batch(reqs)
    slow = eager_one_at_a_time(onnx_gen, reqs)
    for f, s in zip(fast, slow):
        assert f.token_ids == s.token_ids and f.text == s.text and f.finish_reason == s.finish_reason
        assert len(f.logprobs) == len(f.token_ids)
        assert max(abs(a - b) for a, b in zip(f.logprobs, s.logprobs)) < 2e-3


def test_a_batch_reads_each_distinct_prompt_once_from_its_neighbours_cache(onnx_gen, monkeypatch) -> None:
    """A GRPO group repeats its prompt and every policy prompt starts with the instruction: the plain session reads
    a repeated prompt once and a prompt only from where it leaves its sorted neighbour, and decodes as eager does."""
    from routerag.policy.backends.onnx_plain import common_prefix

    prompts = _prompts(onnx_gen, 3)
    reqs = [GenerationRequest(t, ids, 12, STOP, temperature=0.0) for t, ids in [prompts[0]] * 3 + prompts[1:]]
    plain = onnx_gen._engines[True].plain
    read: list[int] = []
    original = plain.read
    monkeypatch.setattr(plain, "read", lambda tokens, past, n: read.append(len(tokens)) or original(tokens, past, n))
    fast = onnx_gen.generate_batch(reqs)
    assert [f.token_ids for f in fast] == [s.token_ids for s in eager_one_at_a_time(onnx_gen, reqs)]
    distinct = [ids for _, ids in prompts]
    shared = min(common_prefix(distinct[0], p) for p in distinct[1:])
    assert len(read) == 3 and sum(read) <= sum(len(p) for p in distinct) - 2 * shared


def test_each_sequence_keeps_its_own_limit_and_the_reader_shares_the_batcher(onnx_gen) -> None:
    (t, ids), (t2, ids2) = _prompts(onnx_gen, 2)
    out = onnx_gen.generate_batch([GenerationRequest(t, ids, 3, (), temperature=0.0),
                                   GenerationRequest(t2, ids2, 9, (), temperature=0.0)])
    assert [len(g.token_ids) for g in out] == [3, 9] and [g.finish_reason for g in out] == ["length", "length"]
    base = onnx_gen.base_view()
    assert base.inner is onnx_gen and "adapter off" in base.name


def test_sampling_follows_torch_seed(onnx_gen) -> None:
    import torch

    reqs = [GenerationRequest(t, ids, 12, STOP, temperature=1.0) for t, ids in _prompts(onnx_gen, 2)]
    torch.manual_seed(7)
    a = [g.token_ids for g in onnx_gen.generate_batch(reqs)]
    torch.manual_seed(7)
    b = [g.token_ids for g in onnx_gen.generate_batch(reqs)]
    assert a == b


def test_a_prompt_holding_the_pad_id_decodes_as_eager_on_the_plain_session(onnx_gen) -> None:
    """GenAI infers padding from the pad id; such a prompt goes to the plain session, whose mask is explicit."""
    t, ids = _prompts(onnx_gen, 1)[0]
    pad = onnx_gen._engines[True].pad_id
    req = GenerationRequest(t, ids[:-3] + [pad] + ids[-3:], 6, (), temperature=0.0)
    assert onnx_gen.generate_batch([req])[0].token_ids == eager_one_at_a_time(onnx_gen, [req])[0].token_ids


def test_without_the_package_the_policy_decodes_eagerly_with_one_log_line(onnx_gen, monkeypatch, caplog) -> None:
    from routerag.policy.backends import in_process_generator, onnx_backend
    from routerag.policy.backends.transformers_backend import TransformersGenerator

    monkeypatch.setattr(onnx_backend, "engine_installed", lambda: False)
    with caplog.at_level(logging.WARNING):
        gen = in_process_generator(GeneratorConfig(), model=onnx_gen.model, tokenizer=onnx_gen.tokenizer)
    assert type(gen) is TransformersGenerator
    lines = [r.getMessage() for r in caplog.records if "eager" in r.getMessage()]
    assert len(lines) == 1 and "onnxruntime-genai is not installed" in lines[0]
    with pytest.raises(RuntimeError, match="engine = onnx cannot run"):
        in_process_generator(GeneratorConfig(engine="onnx"), model=onnx_gen.model, tokenizer=onnx_gen.tokenizer)


def test_a_failed_export_leaves_nothing_under_the_real_name(tmp_path: Path) -> None:
    from routerag.policy.backends.onnx_backend import export_model

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{not json")
    target = tmp_path / "out" / "model"
    with pytest.raises(RuntimeError, match="export"):
        export_model(tmp_path / "hf", target, "float32")
    assert not target.exists() and list((tmp_path / "out").iterdir()) == []


def test_refresh_decodes_with_the_updated_weights(onnx_gen, tmp_path: Path) -> None:
    """A trainer's engine (``export_dir``): after the torch weights change, ``refresh`` writes the adapter's layers
    into the export (no re-export: the data file is byte for byte what a fresh export of the new weights writes) and
    greedy decoding follows the new weights exactly as eager does; the base weights' engine is left as it was."""
    import copy

    import torch

    from routerag.policy.backends.onnx_backend import OnnxGenerator

    model = copy.deepcopy(onnx_gen.model)
    gen = OnnxGenerator(GeneratorConfig(engine="onnx"), model=model, tokenizer=onnx_gen.tokenizer,
                        export_dir=tmp_path / "engine")
    base_engine = gen._engines[False]
    import gc
    import weakref

    replaced = weakref.ref(gen._engines[True])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(4.0)
    gc.disable()  # the replaced engine must go by reference counting: a run refreshes every step, and waiting for
    try:          # the cyclic collector kept each step's copy of the weights (600 MB for the 135M model) alive
        gen.refresh()
        assert replaced() is None, "the engine the refresh replaced is still alive"
    finally:
        gc.enable()
    reqs = [GenerationRequest(t, ids, 24, STOP, temperature=0.0) for t, ids in _prompts(gen, 2)]
    fast = [g.token_ids for g in gen.generate_batch(reqs)]
    assert fast == [g.token_ids for g in eager_one_at_a_time(gen, reqs)]
    assert gen._engines[False] is base_engine and (tmp_path / "engine" / "router" / "genai_config.json").is_file()
    assert gen._patcher, "the refresh re-exported instead of patching"
    from routerag.policy.backends.onnx_backend import export_model, save_merged

    fresh = export_model(save_merged(model, gen.tokenizer, tmp_path / "hf"), tmp_path / "fresh", "float32")
    patched = (tmp_path / "engine" / "router" / "model.onnx.data").read_bytes()
    assert patched == (fresh / "model.onnx.data").read_bytes()


def test_one_request_at_a_time_reuses_the_kept_sequence_and_decodes_as_eager(onnx_gen) -> None:
    """Batches of one go through the kept generator (``OneSequence``): a turn, the next turn of the same trajectory
    (its prompt extends the first's prompt and completion), an unrelated prompt and the first again each decode
    exactly as eager transformers does, and the second turn reads only its new tokens."""
    (t1, ids1), (t2, ids2) = _prompts(onnx_gen, 2)
    session = onnx_gen._engines[True].session
    first = onnx_gen.generate_batch([GenerationRequest(t1, ids1, 30, STOP, temperature=0.0, logprobs=True)])[0]
    info = onnx_gen.tokenizer.encode("\n\n<information>Doc 1 (Title: Idris Calloway) a poet.</information>\n\n",
                                     add_special_tokens=False)
    ids_next = ids1 + first.token_ids + info
    held = list(session.tokens)
    reqs = [GenerationRequest("", ids_next, 20, STOP, temperature=0.0, logprobs=True),
            GenerationRequest(t2, ids2, 20, STOP, temperature=0.0, logprobs=True),
            GenerationRequest(t1, ids1, 30, STOP, temperature=0.0, logprobs=True)]
    outs = [first]
    for r in reqs:
        outs.append(onnx_gen.generate_batch([r])[0])
        if r is reqs[0]:
            assert ids_next[: len(held)] == held  # the second turn kept everything the first left in the cache
    first = GenerationRequest(t1, ids1, 30, STOP, temperature=0.0, logprobs=True)
    eager = eager_one_at_a_time(onnx_gen, [first] + reqs)
    for f, s in zip(outs, eager):
        assert f.token_ids == s.token_ids and f.finish_reason == s.finish_reason
        assert max(abs(a - b) for a, b in zip(f.logprobs, s.logprobs)) < 2e-3
    assert session.tokens[: len(ids1)] == ids1
    assert session.drafted > 0  # the queries copy the question: drafts from the context were checked and kept


def test_prompt_lookup_drafts_what_followed_the_latest_earlier_ngram() -> None:
    from routerag.policy.backends.onnx_backend import prompt_lookup

    assert prompt_lookup([1, 2, 3, 4, 5, 9, 1, 2, 3], 2) == [4, 5]
    assert prompt_lookup([1, 2, 3, 7, 2, 3, 8, 0, 2, 3], 3) == [8, 0, 2]  # the latest occurrence of the bigram
    assert prompt_lookup([5, 6, 7], 4) == [] and prompt_lookup([4], 4) == []


def test_int4_applies_to_the_router_and_the_base_weights_reader_stays_float32(onnx_gen) -> None:
    from routerag.policy.backends.onnx_backend import OnnxGenerator

    gen = OnnxGenerator.__new__(OnnxGenerator)
    gen.cfg, gen.model = GeneratorConfig(engine="onnx", precision="int4"), onnx_gen.model
    assert (gen.precision(True), gen.precision(False)) == ("int4", "float32")
