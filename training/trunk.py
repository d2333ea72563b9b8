"""The GRPO update's forward passes, without the work whose result is thrown away.

An update needs, for every sequence, the log-probability of each token the policy wrote, under the policy (with
gradient) and under its KL reference. Whole forward passes do two kinds of needless work on the CPU recipe:

- **The frozen trunk twice.** With LoRA on the top layers only (``lora.top_layers``, 8 of SmolLM2's 30), every
  layer below the lowest adapted one has the same frozen weights in the policy and in its reference (the base
  weights with the adapter off, or the warm-start adapter, which adapts the same layers). Their hidden states are
  computed once per micro-batch here and the adapted layers run from them.
- **The vocabulary everywhere.** ``logits_to_keep`` still projects every position from the first policy token on,
  the ``<information>`` blocks included, onto 49,152 words. Here only the positions that carry a loss are projected.

Both are exact (tests/test_trunk.py); the trainer checks the first micro-batch against the model's own forward pass
and falls back to whole passes, with a warning, for a model family where they are not
(docs/research/2026-11-27-generation-engine.md, "Third pass").
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def lowest_adapted_layer(model: Any) -> int | None:
    """Index of the lowest decoder layer holding a LoRA module (of any adapter), None when no layer holds one."""
    found = [int(m.group(1)) for name, _ in model.named_modules() if "lora_" in name and (m := _LAYER.search(name))]
    return min(found) if found else None


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _decoder(model: Any) -> Any:
    """The decoder stack (``LlamaModel`` and its kin): the module that owns ``layers`` and ``norm``."""
    inner = getattr(_base(model), "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise TypeError(f"{type(_base(model)).__name__} has no decoder stack with .layers and .norm")
    return inner


@contextlib.contextmanager
def _only_layers(decoder: Any, layers: list[Any], *, final_norm: bool) -> Iterator[None]:
    """Run the decoder over ``layers`` only (and without its final norm when ``final_norm`` is off)."""
    saved_layers, saved_norm = decoder.layers, decoder.norm
    decoder.layers = torch.nn.ModuleList(layers)
    if not final_norm:
        decoder.norm = torch.nn.Identity()
    try:
        yield
    finally:
        decoder.layers, decoder.norm = saved_layers, saved_norm


class UpdateForward:
    """Log-probabilities of the loss positions: ``hidden`` runs the frozen layers below ``split`` once (no gradient;
    nothing when ``split`` is 0), ``logprobs`` runs the rest with whatever adapter is active and projects only the
    positions that carry a loss."""

    def __init__(self, model: Any, split: int) -> None:
        self.decoder = _decoder(model)
        self.head = _base(model).get_output_embeddings()
        if self.head is None:
            raise TypeError(f"{type(_base(model)).__name__} has no output embeddings")
        self.split = split

    @classmethod
    def of(cls, model: Any) -> UpdateForward | None:
        """The passes for ``model``, split at its lowest adapted layer (0 without LoRA); None for a model without a
        recognisable decoder stack, which then runs whole passes."""
        try:
            return cls(model, lowest_adapted_layer(model) or 0)
        except TypeError:
            return None

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """The hidden states entering layer ``split`` (B, T, H); None when there is no frozen trunk."""
        if not self.split:
            return None
        layers = list(self.decoder.layers)[: self.split]
        with torch.no_grad(), _only_layers(self.decoder, layers, final_norm=False):
            return self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    def logprobs(self, batch: Any, hidden: torch.Tensor | None) -> torch.Tensor:
        """log p(token t+1 | tokens ≤ t) at every loss position of ``batch`` (B, T−1; 0 elsewhere), under the model's
        active adapter, with the caller's grad mode."""
        rows, cols = torch.nonzero(batch.loss_mask, as_tuple=True)
        if hidden is None:
            top = self.decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        else:
            with _only_layers(self.decoder, list(self.decoder.layers)[self.split :], final_norm=True):
                top = self.decoder(inputs_embeds=hidden, attention_mask=batch.attention_mask, use_cache=False)
        logits = self.head(top.last_hidden_state[rows, cols])
        picked = torch.log_softmax(logits.float(), dim=-1).gather(1, batch.input_ids[rows, cols + 1].unsqueeze(1))
        out = torch.zeros(batch.loss_mask.shape, dtype=picked.dtype, device=picked.device)
        return out.index_put((rows, cols), picked.squeeze(1))
