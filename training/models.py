"""Loading the policy for training: the embedded SmolLM2, a local or hub model, or a tiny random model for smoke
tests; optionally wrapped in a LoRA adapter (peft)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from routerag.config import LoraConfig, TrainConfig
from routerag.policy.backends.transformers_backend import embedded_policy_folder, load_model_and_tokenizer

TINY_RANDOM = "tiny-random"


def tiny_random_model(seed: int = 0) -> tuple[Any, Any]:
    """A 2-layer, 64-wide Llama with SmolLM2's tokenizer and random weights: it trains in seconds on a CPU, so the
    whole training path can be exercised end to end (it learns nothing useful)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(embedded_policy_folder()))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


REFERENCE_ADAPTER = "reference"
"""Name of the frozen copy of ``--init-adapter`` that serves as the KL reference."""


def load_policy(cfg: TrainConfig, *, device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer), with a trainable LoRA adapter when ``cfg.lora.enabled`` (or ``cfg.init_adapter``)."""
    if cfg.model == TINY_RANDOM:
        model, tok = tiny_random_model(cfg.seed)
    else:
        model, tok = load_model_and_tokenizer(cfg.model, device=device)
    if cfg.init_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, cfg.init_adapter, is_trainable=True)
        # a frozen second copy is the KL reference: the warm start, not the untrained base (RouteRAG's reference is
        # the policy training starts from)
        model.load_adapter(cfg.init_adapter, adapter_name=REFERENCE_ADAPTER, is_trainable=False)
        model.set_adapter("default")
    elif cfg.lora.enabled:
        model = add_lora(model, cfg.lora)
    if device:
        model.to(device)
    return model, tok


def add_lora(model: Any, lora: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [m for m in lora.target_modules if m in present]
    if not targets:
        raise ValueError(f"none of the LoRA target modules {lora.target_modules} exist in this model")
    layers = None
    if lora.top_layers:
        n = int(model.config.num_hidden_layers)
        layers = list(range(max(n - lora.top_layers, 0), n))
    return get_peft_model(model, PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                target_modules=targets, layers_to_transform=layers,
                                                task_type="CAUSAL_LM"))


def is_peft(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


@contextlib.contextmanager
def reference_policy(model: Any) -> Iterator[Any]:
    """The model as the KL reference: the frozen warm-start adapter when there is one, else the base weights
    (adapter off). Switching adapters flips peft's ``requires_grad`` flags; they are restored on exit."""
    if REFERENCE_ADAPTER in model.peft_config:
        active = model.active_adapter
        model.set_adapter(REFERENCE_ADAPTER)
        try:
            yield model
        finally:
            model.set_adapter(active)
    else:
        with model.disable_adapter():
            yield model


def merge_adapter(model: str, adapter: str | None, out: str | Path, *, seed: int = 0) -> Path:
    """Fold a LoRA adapter into its base model and save a plain transformers folder (model and tokenizer).

    verl trains full weights and vLLM serves a folder, so a LoRA warm start (``train-sft``) or a local GRPO
    checkpoint reaches them merged. ``model`` is the base the adapter was trained on (``smollm2``, a folder, a hub
    name, or ``tiny-random`` with its ``seed``); ``smollm2-routerag`` needs no adapter. The folder is written
    beside ``out`` and renamed into place, so a failed merge leaves nothing half-written.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty: remove it or choose another --out")
    if model == TINY_RANDOM:
        lm, tok = tiny_random_model(seed)
        if adapter:
            from peft import PeftModel

            lm = PeftModel.from_pretrained(lm, adapter)
    else:
        lm, tok = load_model_and_tokenizer(model, adapter=adapter, device="cpu", dtype="float32")
    if not is_peft(lm):
        raise ValueError("no adapter to merge: pass --adapter (or --model smollm2-routerag)")
    merged = lm.merge_and_unload()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out
