"""vLLM's async engine in this process (needs the ``gpu`` extra): continuous batching across every concurrent
trajectory, token ids in and out, stop strings kept in the output, log-probabilities on request."""

from __future__ import annotations

import itertools
from typing import Any

from graph_index.llm_clients import import_vllm, vllm_engine

from ...config import GeneratorConfig
from ...prompts import chatml
from ..types import Generation, GenerationRequest

_ids = itertools.count()


class VLLMGenerator:
    tracks_tokens = True

    def __init__(self, cfg: GeneratorConfig, *, engine: Any = None) -> None:
        vllm = import_vllm("the vllm backend")
        if engine is None and cfg.model.startswith("smollm2"):
            raise ValueError(f"{cfg.model} is the embedded CPU policy (transformers backend); the vllm backend needs "
                             "a model folder or hub name: --policy PATH")
        self.vllm = vllm
        self.cfg = cfg
        self.name = f"vllm:{cfg.model}"
        if engine is None:
            engine = vllm_engine(cfg.model, asynchronous=True, user="the vllm backend", dtype=cfg.dtype,
                                 gpu_memory_utilization=cfg.gpu_memory_utilization,
                                 tensor_parallel_size=cfg.tensor_parallel_size)
        self.engine = engine
        self.tokenizer = _engine_tokenizer(engine, cfg.model)

    def render_prompt(self, user_message: str) -> tuple[str, list[int]]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": user_message}], add_generation_prompt=True,
                                           tokenize=False)
        else:
            text = chatml(user_message)
        return text, list(tok.encode(text, add_special_tokens=False))

    async def generate(self, request: GenerationRequest) -> Generation:
        temp = self.cfg.temperature if request.temperature is None else request.temperature
        params = self.vllm.SamplingParams(max_tokens=request.max_tokens, temperature=temp,
                                          top_p=self.cfg.top_p if temp > 0 else 1.0, stop=list(request.stop),
                                          include_stop_str_in_output=True, logprobs=1)
        ids = request.prompt_ids
        if ids is None:
            ids = list(self.tokenizer.encode(request.prompt_text, add_special_tokens=False))
        final = None
        async for out in self.engine.generate({"prompt_token_ids": ids}, params, f"routerag-{next(_ids)}"):
            final = out
        if final is None:
            raise RuntimeError("vLLM returned no output")
        o = final.outputs[0]
        logprobs = None
        if o.logprobs:
            logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs, o.token_ids)]
        finish = "length" if o.finish_reason == "length" else ("stop" if isinstance(o.stop_reason, str) else "eos")
        return Generation(text=o.text, token_ids=list(o.token_ids), logprobs=logprobs, finish_reason=finish,
                          prompt_tokens=len(ids), completion_tokens=len(o.token_ids))


def _engine_tokenizer(engine: Any, model: str) -> Any:
    """The model's tokenizer, loaded by transformers as vLLM itself does (no event loop needed here)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)
