"""llama.cpp rollouts (the ``[llama]`` extra): the embedded router as a float32 GGUF and a GGUF LoRA adapter, each
rollout's sequence kept across turns, a shared prefix read once, checked against eager transformers and against a
fresh read of the whole history on the same weights."""

from __future__ import annotations

import logging
import threading

import pytest

from routerag.config import GeneratorConfig
from routerag.policy.types import GenerationRequest

from .helpers.eager_decoding import eager_one_at_a_time

pytest.importorskip("llama_cpp")

STOP = ("</search>", "</answer>")


@pytest.fixture(scope="module")
def llama_gen(tmp_path_factory):
    from routerag.policy.backends.llama_backend import LlamaGenerator
    from routerag.policy.backends.transformers_backend import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("smollm2-routerag")
    return LlamaGenerator(GeneratorConfig(), model=model, tokenizer=tok, sequences=8, sequence_cells=1024,
                          export_dir=tmp_path_factory.mktemp("llama-engine"))


def _prompts(gen, questions: list[str]) -> list[tuple[str, list[int]]]:
    from routerag.prompts import DEFAULT_INSTRUCTION

    return [gen.render_prompt(DEFAULT_INSTRUCTION.format(question=q)) for q in questions]


QUESTIONS = ["Who wrote the libretto of The Glass Lighthouse?", "What is the occupation of Lena Okafor?",
             "In which city was the composer of The Glass Lighthouse born?"]


@pytest.mark.parametrize("adapter", [True, False])
def test_greedy_batch_equals_eager_with_stops_and_logprobs(llama_gen, adapter: bool) -> None:
    """Prompts of different lengths in one batch decode as each alone does eagerly: the same tokens and stop, and
    log-probabilities to within float32 noise; the router (runtime LoRA) and its base weights (adapter off)."""
    reqs = [GenerationRequest(t, ids, 40, STOP, temperature=0.0, adapter=adapter, logprobs=True)
            for t, ids in _prompts(llama_gen, QUESTIONS)]
    fast = llama_gen.generate_batch(reqs)
    slow = eager_one_at_a_time(llama_gen, reqs)
    for f, s in zip(fast, slow):
        assert f.token_ids == s.token_ids and f.text == s.text and f.finish_reason == s.finish_reason
        assert max(abs(a - b) for a, b in zip(f.logprobs, s.logprobs)) < 2e-3


def _second_turn(gen, first: list, prompts: list[tuple[str, list[int]]]) -> list[GenerationRequest]:
    info = "\n<information>(1) The Glass Lighthouse is an opera by Mara Vell, libretto by Tomas Reyes.</information>\n"
    reqs = []
    for (text, ids), g in zip(prompts, first):
        extra = gen.tokenizer.encode(info, add_special_tokens=False)
        reqs.append(GenerationRequest(text + g.text + info, ids + list(g.token_ids) + extra, 30, STOP,
                                      temperature=0.0))
    return reqs


def test_kept_sequences_continue_as_a_fresh_read_does(llama_gen) -> None:
    """A second turn read onto each row's kept sequence (only its new tokens) decodes what a fresh read of the whole
    history does, and what eager decoding does; a group's identical prompts are read once and copied."""
    engine = llama_gen.engine
    prompts = _prompts(llama_gen, QUESTIONS[:2]) * 2  # two groups of two identical prompts
    first = llama_gen.generate_batch([GenerationRequest(t, ids, 30, STOP, temperature=0.0) for t, ids in prompts])
    plans = engine.plan([r.prompt_ids for r in _second_turn(llama_gen, first, prompts)])
    # each row finds its own first turn in a kept sequence and reads only the turn's last token and the block; the
    # second group's rows are the first's again (greedy), so they copy those rows' sequences
    assert all(p.start >= len(ids) for p, (_, ids) in zip(plans, prompts))
    assert [p.source for p in plans] == [None, None, 0, 1]
    engine.clock -= 1  # plan() above was a dry run
    second = _second_turn(llama_gen, first, prompts)
    kept = llama_gen.generate_batch(second)
    engine.forget()
    fresh = llama_gen.generate_batch(second)
    assert [g.token_ids for g in kept] == [g.token_ids for g in fresh]
    assert [g.token_ids for g in kept] == [g.token_ids for g in eager_one_at_a_time(llama_gen, second)]


def test_a_shared_prefix_is_read_once_and_copied(llama_gen) -> None:
    """Rows of one batch that share a prefix copy it from the first row that reads it, and decode as they would
    alone: identical prompts read only their last token, other questions share the instruction."""
    engine = llama_gen.engine
    engine.forget()
    prompts = [ids for _, ids in _prompts(llama_gen, [QUESTIONS[0], QUESTIONS[0], QUESTIONS[1], QUESTIONS[1]])]
    plans = engine.plan(prompts)
    engine.clock -= 1
    assert plans[0].source is None and plans[0].start == 0
    assert plans[1].source == 0 and plans[1].start == len(prompts[1]) - 1
    assert plans[2].source == 0 and 50 < plans[2].start < len(prompts[2]) - 5  # the instruction before the question
    assert plans[3].source == 2 and plans[3].start == len(prompts[3]) - 1 and plans[3].depth == 2
    reqs = [GenerationRequest("", p, 24, STOP, temperature=0.0) for p in prompts]
    together = llama_gen.generate_batch(reqs)
    alone = []
    for r in reqs:
        engine.forget()
        alone += llama_gen.generate_batch([r])
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


def test_rewind_to_a_shorter_prompt(llama_gen) -> None:
    """A prompt that differs from a kept sequence part-way (a rewound turn, a re-encoded query) removes the kept
    tail and reads from the difference: the output is a fresh read's."""
    engine = llama_gen.engine
    engine.forget()
    (text, ids), = _prompts(llama_gen, QUESTIONS[:1])
    long = GenerationRequest(text, ids, 30, STOP, temperature=0.0)
    first = llama_gen.generate_batch([long])[0]
    changed = ids[:-6] + llama_gen.tokenizer.encode(" Who composed it?", add_special_tokens=False) + ids[-5:]
    slot = engine.plan([changed])[0]
    engine.clock -= 1
    assert slot.source is None and slot.start == len(ids) - 6
    req = GenerationRequest("", changed, 24, STOP, temperature=0.0)
    rewound = llama_gen.generate_batch([req])[0]
    engine.forget()
    assert rewound.token_ids == llama_gen.generate_batch([req])[0].token_ids
    assert first.token_ids  # the first read decoded something to rewind over


def test_stop_strings_and_limits_per_row(llama_gen) -> None:
    """Each row stops at its own limit or at a stop string, which the text keeps."""
    prompts = _prompts(llama_gen, QUESTIONS[:2])
    reqs = [GenerationRequest(t, ids, n, stop, temperature=0.0)
            for (t, ids), n, stop in zip(prompts, (3, 60), ((), ("<search>",)))]
    short, stopped = llama_gen.generate_batch(reqs)
    assert len(short.token_ids) == 3 and short.finish_reason == "length"
    assert stopped.text.endswith("<search>") and stopped.finish_reason == "stop"


def test_sampling_follows_torch_seed(llama_gen) -> None:
    """Sampled rollouts are fixed by ``torch.manual_seed``, as eager ``generate``'s are."""
    import torch

    (t, ids), = _prompts(llama_gen, QUESTIONS[2:])
    reqs = [GenerationRequest(t, ids, 20, STOP, temperature=1.0)] * 3
    torch.manual_seed(7)
    a = llama_gen.generate_batch(reqs)
    torch.manual_seed(7)
    b = llama_gen.generate_batch(reqs)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_refresh_after_an_adapter_change(llama_gen) -> None:
    """After the adapter's weights change (an optimiser step), refresh() gives llama.cpp the new adapter: its greedy
    output follows the torch model's again, and differs from the old adapter's."""
    import torch

    reqs = [GenerationRequest(t, ids, 24, STOP, temperature=0.0) for t, ids in _prompts(llama_gen, QUESTIONS)]
    before = llama_gen.generate_batch(reqs)
    saved = {n: p.detach().clone() for n, p in llama_gen.model.named_parameters() if "lora_B" in n}
    try:
        with torch.no_grad():
            for n, p in llama_gen.model.named_parameters():
                if "lora_B" in n:
                    p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
        stale = llama_gen.generate_batch(reqs)
        llama_gen.refresh()
        after = llama_gen.generate_batch(reqs)
        assert [g.token_ids for g in stale] == [g.token_ids for g in before]  # not refreshed: the old adapter
        assert [g.token_ids for g in after] != [g.token_ids for g in before]
        assert [g.token_ids for g in after] == [g.token_ids for g in eager_one_at_a_time(llama_gen, reqs)]
    finally:
        with torch.no_grad():
            for n, p in llama_gen.model.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
        llama_gen.refresh()


def test_rollout_engine_setting_falls_back_with_one_line(llama_gen, caplog) -> None:
    """The embedded router is taken; ``auto`` with a model llama.cpp cannot take says why once and decodes with the
    in-process policy; ``llama`` refuses instead."""
    from routerag.policy.backends import rollout_generator
    from routerag.policy.backends.llama_backend import llama_unavailable_reason
    from training.models import tiny_random_model

    assert llama_unavailable_reason(llama_gen.model) is None

    model, tok = tiny_random_model(0)
    with caplog.at_level(logging.WARNING):
        gen = rollout_generator("auto", GeneratorConfig(engine="transformers"), model=model, tokenizer=tok,
                                exclusive=threading.Lock())
    assert "llama.cpp" not in gen.name
    assert sum("rollouts decode without llama.cpp" in r.message for r in caplog.records) == 1
    with pytest.raises(RuntimeError, match="rollout_engine = llama"):
        rollout_generator("llama", GeneratorConfig(engine="transformers"), model=model, tokenizer=tok)
