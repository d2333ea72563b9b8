"""Policy backends: in-process transformers (batched, stop strings, token ids, log-probs), the embedded SmolLM2,
and vLLM's async engine through a stand-in module (vLLM itself needs a GPU)."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from routerag.config import GeneratorConfig
from routerag.policy.types import GenerationRequest


@pytest.fixture(scope="module")
def tiny():
    from routerag.policy.backends.transformers_backend import TransformersGenerator
    from training.models import tiny_random_model

    model, tok = tiny_random_model(0)
    return TransformersGenerator(GeneratorConfig(model="tiny-random", temperature=0.0), model=model, tokenizer=tok)


def test_stop_strings_cut_tokens_and_text_together(tiny) -> None:
    tok = tiny.tokenizer
    ids = tok.encode("<think>x</think><search>[graph] q</search> and more text", add_special_tokens=False)
    req = GenerationRequest("p", None, max_tokens=100, stop=("</search>", "</answer>"), logprobs=True)
    g = tiny._finish(ids, [-0.1] * len(ids), req, req.stop, {tok.eos_token_id}, 7)
    assert g.finish_reason == "stop" and g.text.startswith("<think>x</think><search>[graph] q</search>")
    assert tok.decode(g.token_ids) == g.text and len(g.logprobs) == len(g.token_ids)
    assert "more" not in g.text and g.prompt_tokens == 7
    g2 = tiny._finish(ids + [tok.eos_token_id], [0.0] * (len(ids) + 1), GenerationRequest("p", None, 5, ()), (),
                      {tok.eos_token_id}, 1)
    assert g2.finish_reason == "length" and len(g2.token_ids) == 5


def test_concurrent_requests_are_batched_and_each_gets_its_own_result(tiny) -> None:
    prompts = ["short", "a much longer prompt with many more words in it", "medium length prompt"]

    async def go():
        reqs = [GenerationRequest(p, tiny.tokenizer.encode(p, add_special_tokens=False), max_tokens=n, stop=(),
                                  logprobs=True) for p, n in zip(prompts, (3, 6, 4))]
        return await asyncio.gather(*(tiny.generate(r) for r in reqs))

    batches_before = tiny.batcher.batches
    out = asyncio.run(go())
    assert [len(g.token_ids) for g in out] == [3, 6, 4]
    assert all(g.finish_reason == "length" and len(g.logprobs) == len(g.token_ids) for g in out)
    assert all(lp <= 0 for g in out for lp in g.logprobs)
    assert tiny.batcher.batches - batches_before == 1  # three requests, one padded forward pass
    # greedy decoding of the same prompt alone gives the same tokens as inside the padded batch
    alone = asyncio.run(tiny.generate(GenerationRequest(prompts[1], tiny.tokenizer.encode(prompts[1],
                                                                                           add_special_tokens=False), 6, ())))
    assert alone.token_ids == out[1].token_ids
    assert alone.logprobs is None  # not asked for: no vocabulary-wide scores were kept


def test_base_view_generates_with_the_adapter_off_in_the_same_batcher() -> None:
    import torch

    from routerag.config import LoraConfig
    from routerag.policy.backends.transformers_backend import TransformersGenerator
    from training.models import add_lora, tiny_random_model

    model, tok = tiny_random_model(0)
    plain = TransformersGenerator(GeneratorConfig(model="tiny-random", temperature=0.0), model=model, tokenizer=tok)
    with pytest.raises(ValueError, match="no adapter"):
        plain.base_view()
    prompt = "a prompt for the base and the adapted model"
    ids = tok.encode(prompt, add_special_tokens=False)
    base_alone = asyncio.run(plain.generate(GenerationRequest(prompt, ids, 8, ()))).token_ids
    peft = add_lora(model, LoraConfig(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():  # LoRA starts as a no-op (B = 0): make the adapter change the outputs
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 1.0)
    gen = TransformersGenerator(GeneratorConfig(model="tiny-random", temperature=0.0), model=peft, tokenizer=tok)
    base = gen.base_view()

    async def both():
        req = GenerationRequest(prompt, ids, 8, ())
        return await asyncio.gather(gen.generate(req), base.generate(req))

    before = gen.batcher.batches
    adapted, through_view = asyncio.run(both())
    assert through_view.token_ids == base_alone != adapted.token_ids
    assert gen.batcher.batches - before == 1  # one batch, generated in two groups
    assert "adapter off" in base.name and base.tokenizer is tok


@pytest.mark.slow
def test_embedded_smollm2_generates() -> None:
    from routerag.policy.backends.transformers_backend import TransformersGenerator

    gen = TransformersGenerator(GeneratorConfig())  # the embedded default: SmolLM2-135M-Instruct (GGUF)
    text, ids = gen.render_prompt("What is the capital of France? Answer in one word.")
    assert "<|im_start|>assistant" in text and ids
    g = asyncio.run(gen.generate(GenerationRequest(text, ids, max_tokens=12, stop=("</answer>",))))
    assert g.token_ids and g.completion_tokens <= 12 and g.text.strip()


def test_vllm_backend_through_a_stand_in_engine(monkeypatch) -> None:
    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class Logprob:
        def __init__(self, v):
            self.logprob = v

    class Engine:
        def __init__(self):
            self.calls = []

        async def generate(self, prompt, params, request_id):
            self.calls.append((prompt, params.kw, request_id))
            out = types.SimpleNamespace(text="<search>[graph] q</search>", token_ids=[5, 6, 7],
                                        logprobs=[{5: Logprob(-0.1)}, {6: Logprob(-0.2)}, {7: Logprob(-0.3)}],
                                        finish_reason="stop", stop_reason="</search>")
            yield types.SimpleNamespace(outputs=[out])

    fake = types.ModuleType("vllm")
    fake.SamplingParams = SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from routerag.policy.backends import vllm_backend

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [1, 2, 3]

    monkeypatch.setattr(vllm_backend, "_engine_tokenizer", lambda engine, model: Tok())
    engine = Engine()
    gen = vllm_backend.VLLMGenerator(GeneratorConfig(backend="vllm", model="m"), engine=engine)
    g = asyncio.run(gen.generate(GenerationRequest("ctx", [9, 9], max_tokens=50, stop=("</search>",),
                                                   temperature=1.0)))
    assert g.token_ids == [5, 6, 7] and g.logprobs == pytest.approx([-0.1, -0.2, -0.3]) and g.finish_reason == "stop"
    prompt, params, _ = engine.calls[0]
    assert prompt == {"prompt_token_ids": [9, 9]}
    assert params["stop"] == ["</search>"] and params["include_stop_str_in_output"] and params["max_tokens"] == 50


@pytest.mark.slow
def test_the_shipped_router_adapter_loads_and_speaks_the_search_format() -> None:
    """The default policy is the embedded base plus the adapter shipped in routerag/policy/weights; unlike the
    base model, its first turn is a well-formed search (greedy, so deterministic)."""
    from routerag.config import EMBEDDED_ROUTER
    from routerag.policy import parse_turn
    from routerag.policy.backends.transformers_backend import TransformersGenerator
    from routerag.prompts import DEFAULT_INSTRUCTION, user_message

    assert GeneratorConfig().model == EMBEDDED_ROUTER
    gen = TransformersGenerator(GeneratorConfig())
    assert hasattr(gen.model, "peft_config")
    text, ids = gen.render_prompt(user_message(DEFAULT_INSTRUCTION, "In what city was Marisol Vantreigh born?"))
    g = asyncio.run(gen.generate(GenerationRequest(text, ids, max_tokens=60, stop=("</search>", "</answer>"))))
    turn = parse_turn(g.text)
    assert turn.kind == "search", g.text
    with pytest.raises(ValueError, match="already carries its adapter"):
        TransformersGenerator(GeneratorConfig(adapter="/some/other/adapter"))


def test_batchers_sharing_an_exclusive_lock_never_run_at_once() -> None:
    """The local trainer's generator and retriever share a lock so that retrieval (whose time stage 2 rewards) is
    never timed while a generation batch holds the cores."""
    import threading
    import time

    from routerag.batching import MicroBatcher

    lock = threading.Lock()
    active: list[str] = []
    overlaps: list[tuple[str, ...]] = []

    def work(name: str):
        def fn(items: list[int]) -> list[int]:
            active.append(name)
            if len(active) > 1:
                overlaps.append(tuple(active))
            time.sleep(0.02)
            active.remove(name)
            return [i * 2 for i in items]
        return fn

    async def go(shared: threading.Lock | None) -> list[int]:
        a = MicroBatcher(work("generate"), max_wait_ms=0.5, exclusive=shared)
        b = MicroBatcher(work("retrieve"), max_wait_ms=0.5, exclusive=shared)
        out = await asyncio.gather(*[(a if i % 2 else b).submit(i) for i in range(12)])
        a.close()
        b.close()
        return list(out)

    assert asyncio.run(go(lock)) == [i * 2 for i in range(12)]
    assert overlaps == []
    asyncio.run(go(None))  # without the lock the two workers do overlap: the check above can fail
    assert overlaps


def test_engine_isolates_retrieval_from_an_in_process_generator(index, retriever, tiny) -> None:
    """``policy.isolate_retrieval``: the engine's search batcher and the generator's batcher share one lock."""
    from routerag.config import Settings
    from routerag.engine import Engine

    # reader "policy": the shipped card's base-model reader needs an adapter, which the tiny model has not
    on = Settings(policy={"isolate_retrieval": True, "reader": "policy"})
    eng = Engine(index, on, generator=tiny, retriever=retriever)
    try:
        assert eng.search.batcher.exclusive is not None and eng.search.batcher.exclusive is tiny.batcher.exclusive
    finally:
        tiny.batcher.exclusive = None  # the module-scoped generator is shared with other tests
    off = Engine(index, Settings(policy={"reader": "policy"}), generator=tiny, retriever=retriever)
    assert off.search.batcher.exclusive is None and tiny.batcher.exclusive is None
