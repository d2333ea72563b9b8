"""Policy backends behind one interface (:class:`routerag.policy.types.Generator`)."""

from __future__ import annotations

from ...config import GeneratorConfig
from ..types import Generator


def make_generator(cfg: GeneratorConfig) -> Generator:
    if cfg.backend == "transformers":
        from .transformers_backend import TransformersGenerator

        return TransformersGenerator(cfg)
    if cfg.backend == "openai":
        from .openai_backend import OpenAIGenerator

        return OpenAIGenerator(cfg)
    from .vllm_backend import VLLMGenerator

    return VLLMGenerator(cfg)
