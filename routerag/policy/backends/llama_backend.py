"""GRPO rollouts on llama.cpp (``llama-cpp-python``): one context, a KV cache per rollout kept across its turns.

Why: a batch of rollouts re-read each row's whole history every turn on ONNX Runtime GenAI, whose batched generator
takes one prompt read and no rewind (93% of a batched rollout's time was that read; research note, fourth pass).
llama.cpp's batches carry a sequence id per token, so one ``llama_decode`` appends a different number of tokens to
each row's own sequence: a turn reads only what is new since the row's last turn (its ``<information>`` block), and
a prefix several rows share (the instruction; a GRPO group's whole first prompt) is read once and copied into the
others' sequences (``llama_memory_seq_cp``: a copy of cached cells in memory, not a pass of the model).

The weights: a float32 GGUF of the base model, written once into the cache directory (atomically, no hub), and the
LoRA adapter as a GGUF adapter of its own, rewritten and swapped after each optimiser step (:meth:`refresh`) instead
of the 540 MB model. Sampling is :class:`NumpySampling`'s, the ONNX engine's, from the full logits of each step.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...config import GeneratorConfig
from ..types import Generation, GenerationRequest
from .onnx_backend import MIN_ENGINE_PARAMETERS, NumpySampling
from .onnx_plain import common_prefix
from .transformers_backend import TransformersGenerator

log = logging.getLogger(__name__)

LLAMA_PACKAGE = "llama_cpp"
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
"""A transformers llama projection → its llama.cpp tensor (``blk.N.<name>.weight``)."""
BATCH_TOKENS = 512
"""Tokens per ``llama_decode`` call (a longer read is split): llama.cpp's default logical batch."""
SEQUENCES = 32
"""Kept sequences (the trainer's micro-batcher sends at most 32 rows at once)."""
SEQUENCE_CELLS = 2048
"""KV cells of each sequence (float32: 46 KB a token for the 135M model, 3 GB for 32 × 2,048): the recipe's longest
rollout (instruction, 1,024 response tokens, two 256-token ``<information>`` blocks) fits. Each sequence has its
own cells (llama.cpp's non-unified cache): a decoding row attends over its own sequence only, where a unified cache
makes every row attend over every kept sequence's cells (16 times the work at a batch of 16)."""


def llama_installed() -> bool:
    """Whether ``llama-cpp-python`` (the ``[llama]`` extra) is importable."""
    return importlib.util.find_spec(LLAMA_PACKAGE) is not None


def llama_unavailable_reason(model: Any) -> str | None:
    """Why rollouts of ``model`` cannot decode on llama.cpp (None: they can)."""
    if not llama_installed():
        return "llama-cpp-python is not installed (pip install 'routerag[llama]')"
    device = str(next(model.parameters()).device)
    if not device.startswith("cpu"):
        return f"the model runs on {device}; llama.cpp rollouts are for CPU decoding"
    if not hasattr(model, "peft_config"):
        return "the model carries no LoRA adapter (llama.cpp rollouts refresh the adapter after each step)"
    config = model.config
    if getattr(config, "model_type", None) != "llama":
        return f"the GGUF writer knows llama models, not {getattr(config, 'model_type', None)!r}"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return "the model scales its rotary embeddings, which the GGUF writer does not write"
    n = sum(p.numel() for p in model.parameters())
    if n < MIN_ENGINE_PARAMETERS:
        return f"a model of {n:,} parameters decodes faster eagerly than it converts"
    return None


# -- writing the GGUF files -------------------------------------------------------------------------------------------


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a query/key projection in llama.cpp's rotary order (transformers keeps halves, llama.cpp pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _heads(config: Any, proj: str) -> int | None:
    if proj == "q_proj":
        return int(config.num_attention_heads)
    if proj == "k_proj":
        return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    return None


def _layer_modules(model: Any) -> list[tuple[int, str, Any]]:
    """(layer, projection, module) of every decoder projection, LoRA-wrapped or not."""
    out = []
    for name, module in model.named_modules():
        bits = name.split(".")
        if bits[-1] in GGUF_NAMES and "layers" in bits and (hasattr(module, "weight") or hasattr(module, "base_layer")):
            out.append((int(bits[bits.index("layers") + 1]), bits[-1], module))
    return out


def base_tensors(model: Any) -> dict[str, np.ndarray]:
    """The model's base weights (any LoRA adapter left out) under llama.cpp's names, float32."""
    import torch

    config = model.config
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = inner.model
    with torch.no_grad():
        def f32(t: Any) -> np.ndarray:
            return t.detach().float().cpu().numpy().copy()

        out = {"token_embd.weight": f32(body.embed_tokens.weight), "output_norm.weight": f32(body.norm.weight)}
        if not getattr(config, "tie_word_embeddings", False):
            out["output.weight"] = f32(inner.lm_head.weight)
        for i, layer in enumerate(body.layers):
            out[f"blk.{i}.attn_norm.weight"] = f32(layer.input_layernorm.weight)
            out[f"blk.{i}.ffn_norm.weight"] = f32(layer.post_attention_layernorm.weight)
        for i, proj, module in _layer_modules(model):
            w = f32(getattr(module, "base_layer", module).weight)
            heads = _heads(config, proj)
            out[f"blk.{i}.{GGUF_NAMES[proj]}.weight"] = _permute(w, heads) if heads else w
    return out


def adapter_tensors(model: Any) -> tuple[dict[str, np.ndarray], float]:
    """The active LoRA adapter's A and B under llama.cpp's names, and the alpha that gives PEFT's scaling (llama.cpp
    scales B·A by alpha / rank)."""
    import torch

    out: dict[str, np.ndarray] = {}
    alpha = rank = None
    with torch.no_grad():
        for i, proj, module in _layer_modules(model):
            for name in getattr(module, "active_adapters", []) or []:
                if name not in getattr(module, "lora_A", {}):
                    continue
                a = module.lora_A[name].weight.detach().float().cpu().numpy().copy()
                b = module.lora_B[name].weight.detach().float().cpu().numpy().copy()
                heads = _heads(model.config, proj)
                key = f"blk.{i}.{GGUF_NAMES[proj]}.weight"
                out[key + ".lora_a"], out[key + ".lora_b"] = a, (_permute(b, heads) if heads else b)
                scale = float(module.scaling[name])
                if alpha is not None and abs(scale * a.shape[0] - alpha) > 1e-6 * alpha:
                    raise ValueError("the adapter's layers are scaled differently; one GGUF alpha cannot hold them")
                alpha, rank = scale * a.shape[0], a.shape[0]
    if not out or alpha is None or rank is None:
        raise ValueError("the model carries no active LoRA adapter")
    return out, alpha


def _write_atomic(path: Path, fill: Any) -> Path:
    """Write a GGUF beside ``path`` under a temporary name, then rename it (a crash leaves no half file)."""
    import gguf

    logging.getLogger("gguf").setLevel(logging.WARNING)  # its writer logs every file it writes at INFO
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        writer = gguf.GGUFWriter(str(tmp), "llama")
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_model_gguf(model: Any, tokenizer: Any, path: Path) -> Path:
    """A float32 GGUF of ``model``'s base weights with its tokenizer's vocabulary (llama.cpp needs one to load;
    rollouts hand it token ids, so only the ids must agree)."""
    import gguf

    config = model.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10_000.0)))
    tensors = base_tensors(model)

    def fill(w: Any) -> None:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_block_count(int(config.num_hidden_layers))
        w.add_context_length(int(config.max_position_embeddings))
        w.add_embedding_length(int(config.hidden_size))
        w.add_feed_forward_length(int(config.intermediate_size))
        w.add_head_count(heads)
        w.add_head_count_kv(int(getattr(config, "num_key_value_heads", None) or heads))
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(theta)
        w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
        w.add_vocab_size(int(config.vocab_size))
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        _add_vocabulary(w, tokenizer, int(config.vocab_size))
        for name, arr in tensors.items():
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    return _write_atomic(path, fill)


def _add_vocabulary(w: Any, tokenizer: Any, vocab_size: int) -> None:
    """The BPE vocabulary and merges of a fast tokenizer, padded to the model's vocabulary size."""
    import gguf

    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"].get("merges", [])
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), vocab_size))))
    special = set(tokenizer.all_special_ids)
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    types += [gguf.TokenType.UNUSED] * (vocab_size - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for add, value in ((w.add_bos_token_id, tokenizer.bos_token_id), (w.add_eos_token_id, tokenizer.eos_token_id)):
        if value is not None:
            add(int(value))
    w.add_add_bos_token(False)


def write_adapter_gguf(model: Any, path: Path) -> Path:
    """The model's LoRA adapter as a llama.cpp GGUF adapter (a few MB: rewritten after every optimiser step)."""
    import gguf

    tensors, alpha = adapter_tensors(model)

    def fill(w: Any) -> None:
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for name, arr in tensors.items():
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    return _write_atomic(path, fill)


def base_fingerprint(model: Any) -> str:
    """A short hash of the base weights (LoRA tensors left out): the cache key of the converted GGUF."""
    h = hashlib.sha256(b"llama-gguf-float32-v1")
    for name, p in sorted(model.state_dict().items()):
        if "lora_" in name:
            continue
        h.update(name.encode())
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# -- the context and its kept sequences -------------------------------------------------------------------------------


@dataclass
class Slot:
    """One kept sequence: its id in the context, the tokens its KV cells hold, and whether they were computed with
    the adapter on (a base-weights read cannot reuse the router's cells)."""

    seq: int
    tokens: list[int] = field(default_factory=list)
    adapter: bool = True
    used: int = 0


@dataclass
class ReadPlan:
    """How one row of a batch gets its prompt into its slot: copy ``copy`` tokens from ``source``'s slot (or keep
    ``copy`` of its own), then read the rest."""

    row: int
    slot: Slot
    start: int
    source: int | None = None
    depth: int = 0


class LlamaContext:
    """A llama.cpp model and one context holding :data:`SEQUENCES` sequences, each with its own float32 KV cells."""

    def __init__(self, gguf_path: Path, threads: int, sequences: int = SEQUENCES,
                 sequence_cells: int = SEQUENCE_CELLS) -> None:
        import llama_cpp as L

        _quiet(L)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(gguf_path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max = sequences * sequence_cells, sequences
        cp.n_batch = cp.n_ubatch = BATCH_TOKENS
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = 0  # GGML_TYPE_F32: float16 cells would move greedy text away from eager's
        cp.kv_unified = False
        cp.flash_attn_type = 0  # disabled: the float32 reference path
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.L = L
        self.mem = L.llama_get_memory(self.ctx)
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(BATCH_TOKENS, 0, 1)
        self.sequence_cells = L.llama_n_ctx_seq(self.ctx)
        self.adapter: Any = None
        self.adapter_on = False
        self.slots = [Slot(i) for i in range(sequences)]
        self.clock = 0
        self.prompt_tokens = self.read_tokens = 0
        """Prompt tokens asked for and the tokens actually read (the rest were kept or copied): what keeping the
        sequences saves, recorded in the trainer's metrics."""

    def close(self) -> None:
        L = self.L
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            self.ctx = None
        if self.adapter:
            L.llama_adapter_lora_free(self.adapter)
            self.adapter = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

    # -- weights ----------------------------------------------------------------------------------------------------

    def load_adapter(self, path: Path) -> None:
        """Swap in the LoRA adapter at ``path`` (every kept sequence was computed with the old one: dropped)."""
        L = self.L
        new = L.llama_adapter_lora_init(self.model, str(path).encode())
        if not new:
            raise RuntimeError(f"llama.cpp could not load the adapter {path}")
        old, self.adapter = self.adapter, new
        self.adapter_on = False
        self.use_adapter(True)
        if old:
            L.llama_adapter_lora_free(old)
        self.forget()

    def use_adapter(self, on: bool) -> None:
        """Switch the adapter on (the router) or off (its base weights, the reader) for the next reads."""
        on = on and self.adapter is not None
        if on == self.adapter_on:
            return
        L = self.L
        if on:
            adapters = (L.llama_adapter_lora_p_ctypes * 1)(self.adapter)
            scales = (ctypes.c_float * 1)(1.0)
            rc = L.llama_set_adapters_lora(self.ctx, adapters, 1, scales)
        else:
            rc = L.llama_set_adapters_lora(self.ctx, None, 0, None)
        if rc != 0:
            raise RuntimeError(f"llama.cpp refused to switch the adapter (code {rc})")
        self.adapter_on = on

    def forget(self) -> None:
        """Drop every kept sequence (the cells are marked free, not zeroed: 3 GB of memset otherwise)."""
        self.L.llama_memory_clear(self.mem, False)
        for s in self.slots:
            s.tokens = []

    # -- reading prompts --------------------------------------------------------------------------------------------

    def plan(self, prompts: list[list[int]]) -> list[ReadPlan]:
        """Give each row a slot, reusing the longest prefix a kept sequence holds or, better, a prefix an earlier row
        of the batch reads (a GRPO group's common first prompt; the instruction every row starts with)."""
        if len(prompts) > len(self.slots):
            raise ValueError(f"{len(prompts)} rows for {len(self.slots)} sequences")
        self.clock += 1
        claimed: set[int] = set()
        plans: list[ReadPlan] = []
        for row, p in enumerate(prompts):
            def usable(s: Slot) -> int:
                return min(common_prefix(s.tokens, p), len(p) - 1) if s.adapter == self.adapter_on else 0

            # the longest usable prefix, else an empty slot, else the one used longest ago
            best = max((s for s in self.slots if s.seq not in claimed),
                       key=lambda s: (usable(s), not s.tokens, -s.used))
            claimed.add(best.seq)
            plan = ReadPlan(row, best, usable(best))
            for earlier in plans:
                shared = min(common_prefix(prompts[earlier.row], p), len(p) - 1)
                if shared > plan.start:
                    plan.start, plan.source, plan.depth = shared, earlier.row, earlier.depth + 1
            plans.append(plan)
        return plans

    def read(self, prompts: list[list[int]]) -> tuple[list[Slot], np.ndarray]:
        """Read every prompt into its own sequence; the logits after each prompt's last token (rows × vocabulary).
        Rows whose prefix another row reads are read after it, depth by depth, each depth in one pass."""
        L = self.L
        plans = self.plan(prompts)
        logits = np.empty((len(prompts), self.vocab), dtype=np.float32)
        for depth in range(max(p.depth for p in plans) + 1):
            level = [p for p in plans if p.depth == depth]
            for p in level:
                if p.source is not None:  # the source's cells, copied whole (one sequence's buffer), then cut
                    L.llama_memory_seq_rm(self.mem, p.slot.seq, -1, -1)
                    L.llama_memory_seq_cp(self.mem, plans[p.source].slot.seq, p.slot.seq, -1, -1)
                L.llama_memory_seq_rm(self.mem, p.slot.seq, p.start, -1)
                p.slot.tokens = list(prompts[p.row][: p.start])
                p.slot.adapter, p.slot.used = self.adapter_on, self.clock
            items = [(p.slot, prompts[p.row][p.start:], p.row) for p in level]
            self.prompt_tokens += sum(len(prompts[p.row]) for p in level)
            self.read_tokens += sum(len(toks) for _, toks, _ in items)
            for row, out in self.append(items).items():
                logits[row] = out
        return [p.slot for p in plans], logits

    def append(self, items: list[tuple[Slot, list[int], int]]) -> dict[int, np.ndarray]:
        """Append each item's tokens to its slot's sequence, in passes of up to :data:`BATCH_TOKENS` tokens; the
        logits after each item's last token, by the item's key."""
        flat = [(slot, tok, j == len(toks) - 1, key) for slot, toks, key in items for j, tok in enumerate(toks)]
        out: dict[int, np.ndarray] = {}
        for start in range(0, len(flat), BATCH_TOKENS):
            chunk = flat[start : start + BATCH_TOKENS]
            self._decode(chunk)
            for i, (_, _, last, key) in enumerate(chunk):
                if last:
                    ptr = self.L.llama_get_logits_ith(self.ctx, i)
                    out[key] = np.ctypeslib.as_array(ptr, shape=(self.vocab,)).copy()
        return out

    def _decode(self, chunk: list[tuple[Slot, int, bool, int]]) -> None:
        b = self.batch
        for i, (slot, tok, last, _) in enumerate(chunk):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, len(slot.tokens), 1, int(last)
            b.seq_id[i][0] = slot.seq
            slot.tokens.append(tok)
        b.n_tokens = len(chunk)
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            for slot, *_ in chunk:  # what these sequences hold is unknown now: read them afresh next time
                self.L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
                slot.tokens = []
            raise RuntimeError(f"llama_decode failed (code {rc})")


def _quiet(L: Any) -> None:
    """Keep llama.cpp's loading chatter (hundreds of lines) out of the output; its errors go to the log."""
    @L.llama_log_callback
    def callback(level: int, text: bytes, user_data: Any) -> None:
        if level == 4:  # GGML_LOG_LEVEL_ERROR
            log.warning("llama.cpp: %s", text.decode(errors="replace").rstrip())

    L.llama_log_set(callback, ctypes.c_void_p(0))
    _quiet.callback = callback  # type: ignore[attr-defined]  # kept alive: llama.cpp holds the pointer


# -- the generator ----------------------------------------------------------------------------------------------------


class LlamaGenerator(NumpySampling, TransformersGenerator):
    """The trainer's rollout generator on llama.cpp: the torch model stays the one trained and the reference for
    requests llama.cpp cannot take; llama.cpp decodes a float32 copy of it, refreshed after each optimiser step."""

    def __init__(self, cfg: GeneratorConfig | None = None, *, model: Any = None, tokenizer: Any = None,
                 exclusive: threading.Lock | None = None, export_dir: Path | None = None,
                 sequences: int = SEQUENCES, sequence_cells: int = SEQUENCE_CELLS) -> None:
        import torch

        from ...config import default_model_dir

        super().__init__(cfg, model=model, tokenizer=tokenizer, exclusive=exclusive)
        self.name = self.name.replace("transformers:", "llama.cpp:", 1)
        self.export_dir = export_dir
        self._lock = threading.Lock()
        target = default_model_dir() / "llama-gguf" / f"{base_fingerprint(self.model)}-float32.gguf"
        if not target.is_file():
            log.info("converting the policy's base weights to a float32 GGUF (once) into %s", target)
            write_model_gguf(self.model, self.tokenizer, target)
        self.engine = LlamaContext(target, torch.get_num_threads(), sequences, sequence_cells)
        self.refresh()

    def refresh(self) -> None:
        """Give llama.cpp the adapter's current weights (after an optimiser step): a new adapter GGUF, swapped in."""
        if not self.has_adapter:
            return
        folder = self.export_dir or Path(self.engine_dir())
        path = write_adapter_gguf(self.model, folder / "router-lora.gguf")
        with self._lock:
            self.engine.load_adapter(path)

    def engine_dir(self) -> str:
        import tempfile

        if not hasattr(self, "_tmp"):
            self._tmp = tempfile.TemporaryDirectory(prefix="routerag-llama-")
        return self._tmp.name

    def _generate_group(self, reqs: list[GenerationRequest], stop: tuple[str, ...], temp: float) -> list[Generation]:
        prompts = [self.prompt_ids(r) for r in reqs]
        adapter = all(r.adapter for r in reqs) or not self.has_adapter
        out: list[Generation | None] = [None] * len(reqs)
        for part in self._parts(prompts, reqs):
            sub = [reqs[i] for i in part]
            if len(part) == 1 and len(prompts[part[0]]) + sub[0].max_tokens > self.engine.sequence_cells:
                out[part[0]] = super()._generate_group(sub, stop, temp)[0]
                continue
            try:
                with self._lock:
                    self.engine.use_adapter(adapter)
                    ids, logps = self._decode([prompts[i] for i in part], sub, stop, temp)
            except RuntimeError as e:  # a full cache, a refused batch: this part decodes eagerly
                log.warning("llama.cpp could not decode %d rows (%s): eager decoding takes them", len(part), e)
                self.engine.forget()
                for j, g in zip(part, super()._generate_group(sub, stop, temp)):
                    out[j] = g
                continue
            eos = self._eos_ids()
            for i, lp, r, j in zip(ids, logps, sub, part):
                out[j] = self._finish(i, lp, r, stop, eos, len(prompts[j]))
        return out  # type: ignore[return-value]

    def _parts(self, prompts: list[list[int]], reqs: list[GenerationRequest]) -> list[list[int]]:
        """The rows in groups of at most one per kept sequence; a row whose prompt and limit overflow a sequence's
        cells alone (eager decoding takes it: its error says what it says today)."""
        fits = [i for i, (p, r) in enumerate(zip(prompts, reqs)) if len(p) + r.max_tokens <= self.engine.sequence_cells]
        fit = set(fits)
        big = [[i] for i in range(len(prompts)) if i not in fit]
        n = len(self.engine.slots)
        return [fits[k : k + n] for k in range(0, len(fits), n)] + big

    def _decode(self, prompts: list[list[int]], reqs: list[GenerationRequest], stop: tuple[str, ...],
                temp: float) -> tuple[list[list[int]], list[list[float] | None]]:
        """Read the prompts (each into its kept sequence), then decode one token per unfinished row per pass until
        every row has met its end of sequence, a stop string or its limit."""
        slots, logits = self.engine.read(prompts)
        want = any(r.logprobs for r in reqs)
        rng = self._rng()
        eos = self._eos_ids()
        out: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        while live:
            chosen, lp = self._choose(logits, temp, rng, want)
            live = self._record(live, chosen, lp, out, logps, reqs, stop, eos)
            if not live:
                break
            got = self.engine.append([(slots[row], [out[row][-1]], row) for row in live])
            logits = np.stack([got[row] for row in live])
        return out, [lp if want else None for lp in logps]
