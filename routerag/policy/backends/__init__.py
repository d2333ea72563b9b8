"""Policy backends behind one interface (:class:`routerag.policy.types.Generator`)."""

from __future__ import annotations

from ...config import GeneratorConfig
from ...vocabulary import ReaderKind
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
