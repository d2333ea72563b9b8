"""The reference for the fast engines' tests: the same torch model decoding eagerly, one request at a time, so no
padding or kept sequence is involved."""

from __future__ import annotations

from typing import Any

from routerag.policy.types import GenerationRequest


def eager_one_at_a_time(gen: Any, reqs: list[GenerationRequest]) -> list:
    """Each request alone through the transformers backend, with the adapter on or off as the request asks."""
    from routerag.policy.backends.transformers_backend import TransformersGenerator

    out = []
    for r in reqs:
        if r.adapter:
            out += TransformersGenerator._generate_group(gen, [r], r.stop, 0.0)
        else:
            with gen.model.disable_adapter():
                out += TransformersGenerator._generate_group(gen, [r], r.stop, 0.0)
    return out
