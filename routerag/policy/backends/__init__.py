"""Policy backends behind one interface (:class:`routerag.policy.types.Generator`)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from ...config import GeneratorConfig
from ...vocabulary import ReaderKind
from ..types import Generator

log = logging.getLogger(__name__)


def make_generator(cfg: GeneratorConfig) -> Generator:
    if cfg.backend == "transformers":
        return in_process_generator(cfg)
    if cfg.backend == "openai":
        from .openai_backend import OpenAIGenerator

        return OpenAIGenerator(cfg)
    from .vllm_backend import VLLMGenerator

    return VLLMGenerator(cfg)


def reader_model(reader: ReaderKind, policy: Generator, answer_generator: GeneratorConfig | None) -> Generator | None:
    """The model that writes the final answer when ``reader`` says who: None (the policy's own ``<answer>``), the
    policy's base weights with its adapter off (same weights, no second copy), or the configured answer generator.
    The server and the trainers both ask here, so rollouts are read as served answers are."""
    if reader == "base":
        base_view = getattr(policy, "base_view", None)
        if base_view is None:
            raise ValueError(f"reader = 'base' reads with the policy's base model, which only the in-process "
                             f"transformers backend can switch to ({policy.name} cannot); set policy.reader "
                             "= 'policy', or 'generator' with a [policy.answer_generator]")
        return base_view()
    if reader == "generator":
        if answer_generator is None:
            raise ValueError("policy.reader = 'generator' needs a [policy.answer_generator]")
        return make_generator(answer_generator)
    return None


def in_process_generator(cfg: GeneratorConfig, *, model: Any = None, tokenizer: Any = None,
                         exclusive: threading.Lock | None = None, export_dir: Path | None = None) -> Any:
    """The in-process policy: decoded by ONNX Runtime GenAI where ``cfg.engine`` allows it and it can run (several
    times faster on a CPU), else by eager transformers, saying why in one log line. ``export_dir``: a trainer's
    folder for the engine's copy of weights that change (no cache)."""
    from .transformers_backend import TransformersGenerator, load_model_and_tokenizer

    if model is None:
        model, tokenizer = load_model_and_tokenizer(cfg.model, adapter=cfg.adapter, device=cfg.device,
                                                    dtype=cfg.dtype)
    from .onnx_backend import OnnxGenerator, engine_unavailable_reason

    why = engine_unavailable_reason(cfg, model)
    if why is not None and cfg.engine == "onnx":
        raise RuntimeError(f"policy.generator.engine = onnx cannot run: {why}")
    if why is None:
        try:
            return OnnxGenerator(cfg, model=model, tokenizer=tokenizer, exclusive=exclusive, export_dir=export_dir)
        except Exception as e:  # an architecture the exporter does not know, a full disk, ...
            if cfg.engine == "onnx":
                raise
            why = f"the ONNX export failed: {e}"
    if cfg.engine != "transformers":
        log.warning("the policy decodes with eager transformers: %s", why)
    return TransformersGenerator(cfg, model=model, tokenizer=tokenizer, exclusive=exclusive)


def rollout_generator(engine: str, cfg: GeneratorConfig, *, model: Any, tokenizer: Any,
                      exclusive: threading.Lock | None = None, export_dir: Path | None = None) -> Any:
    """A trainer's rollout generator (``train.rollout_engine``): llama.cpp where it is asked for or, for ``auto``,
    installed and able to take the model; otherwise the in-process policy (ONNX Runtime GenAI or eager, as
    ``cfg.engine`` says), with one log line saying why llama.cpp is not used."""
    if engine in ("auto", "llama"):
        from .llama_backend import LlamaGenerator, llama_unavailable_reason

        why = llama_unavailable_reason(model)
        if why is None:
            try:
                return LlamaGenerator(cfg, model=model, tokenizer=tokenizer, exclusive=exclusive,
                                      export_dir=export_dir)
            except Exception as e:  # a model the GGUF writer gets wrong, a full disk, ...
                if engine == "llama":
                    raise
                why = f"its conversion failed: {e}"
        if engine == "llama":
            raise RuntimeError(f"train.rollout_engine = llama cannot run: {why}")
        log.warning("rollouts decode without llama.cpp: %s", why)
    else:
        cfg = cfg.model_copy(update={"engine": "onnx" if engine == "onnx" else "transformers"})
    return in_process_generator(cfg, model=model, tokenizer=tokenizer, exclusive=exclusive, export_dir=export_dir)
