"""The in-process policy decoded by ONNX Runtime GenAI: the same model, adapter merged, several times faster than
eager transformers on a CPU (docs/benchmarks.md, ``benchmarks/generation_bench.py``).

Eager ``generate`` spends most of a token's time on per-operation overhead (hundreds of small torch calls, the LoRA
adapter's extra matrix products, the logits processors), not on reading the weights. ONNX Runtime GenAI runs the
whole decoder as one graph with a KV cache shared in place. The model is exported once by the package's own builder
from a transformers folder (the LoRA adapter merged into the weights), into the cache directory, atomically.

The torch model stays loaded: it checks requests, serves those the engine cannot take, and is what the trainers
update; :meth:`OnnxGenerator.refresh` re-exports it after an optimiser step. One request at a time decodes on a kept
GenAI sequence (:class:`OneSequence`); a batch decodes on the same export in a plain ONNX Runtime session that reads
the prompts' shared prefixes once (:mod:`.onnx_plain`). Decoding is driven from here one token at a time: greedy or
temperature/top-p sampling, per-sequence stop strings and token limits, and log-probabilities, all from the full
logits of each step, so a logits processor or a constraint can be applied in :meth:`OnnxGenerator._choose`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ...config import GeneratorConfig
from ..types import Generation, GenerationRequest
from .onnx_plain import PlainDecoder, common_prefix
from .transformers_backend import TransformersGenerator

log = logging.getLogger(__name__)

ENGINE_PACKAGE = "onnxruntime_genai"
BUILDER = "onnxruntime_genai.models.builder"
STOP_TAIL_TOKENS = 24
"""Tokens decoded at the end of a sequence to look for its stop strings each step (a stop string spans a few)."""


def engine_installed() -> bool:
    """Whether ONNX Runtime GenAI and its exporter's one extra dependency (onnx-ir) are importable."""
    return all(importlib.util.find_spec(m) is not None for m in (ENGINE_PACKAGE, "onnx_ir"))


MIN_ENGINE_PARAMETERS = 10_000_000
"""``engine = auto`` leaves smaller models (the tests' tiny random ones) to eager decoding: their export, tens of
seconds in a child process, and a trainer's re-export after every step cost more than their decoding."""


def engine_unavailable_reason(cfg: GeneratorConfig, model: Any) -> str | None:
    """Why ``cfg.engine`` decodes ``model`` eagerly (None: it uses ONNX Runtime GenAI)."""
    if cfg.engine == "transformers":
        return "policy.generator.engine = transformers"
    if not engine_installed():
        return "onnxruntime-genai is not installed (pip install onnxruntime-genai onnx-ir)"
    device = str(next(model.parameters()).device)
    if not device.startswith("cpu"):
        return f"the model runs on {device}; the ONNX engine is for CPU decoding"
    n = sum(p.numel() for p in model.parameters())
    if cfg.engine == "auto" and n < MIN_ENGINE_PARAMETERS:
        return f"a model of {n:,} parameters decodes faster than it exports"
    return None


def export_model(hf_folder: Path, target: Path, precision: str) -> Path:
    """Export a transformers folder to an ONNX Runtime GenAI folder ``target``, atomically: built beside it under a
    temporary name, then renamed (a crash leaves no half-written model under the real name). The builder runs in a
    child process: it loads its own copy of the weights and frees it when it exits."""
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [sys.executable, "-m", BUILDER, "-i", str(hf_folder), "-o", str(tmp), "-e", "cpu",
           "-p", {"float32": "fp32", "int4": "int4"}[precision], "-c", str(tmp / "_cache")]
    if precision == "int4":
        cmd += ["--extra_options", "int4_accuracy_level=4"]  # int8 activations: the fast CPU kernel
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not (tmp / "genai_config.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (done.stderr or done.stdout)[-1500:]
        raise RuntimeError(f"exporting {hf_folder} to ONNX Runtime GenAI failed (exit {done.returncode}): {tail}")
    shutil.rmtree(tmp / "_cache", ignore_errors=True)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def save_merged(model: Any, tokenizer: Any, folder: Path, adapter: bool = True) -> Path:
    """Write ``model`` as a plain transformers folder: a PEFT model with its LoRA merged into a copy of the weights
    (``adapter``) or its base weights alone; the model itself is left as it was."""
    if hasattr(model, "peft_config"):
        plain = copy.deepcopy(model)
        plain = plain.merge_and_unload() if adapter else plain.unload()
    else:
        plain = model
    folder.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def weights_fingerprint(model: Any, precision: str) -> str:
    """A short hash of the weights and the export's settings: the cache key of an exported model (a changed adapter
    or base model gets a new export; the same one is found again)."""
    import onnxruntime_genai

    h = hashlib.sha256(f"{precision}|{onnxruntime_genai.__version__}".encode())
    for name, p in sorted(model.state_dict().items()):
        t = p.detach().float().contiguous().cpu()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


PACKED_PROJECTIONS = {"q_proj": ("attn.qkv_proj", 0), "k_proj": ("attn.qkv_proj", 1), "v_proj": ("attn.qkv_proj", 2),
                      "o_proj": ("attn.o_proj", 0), "gate_proj": ("mlp.gate_proj", 0),
                      "up_proj": ("mlp.up_proj", 0), "down_proj": ("mlp.down_proj", 0)}
"""A transformers projection → the exported initializer holding it (``model.layers.N.<name>.MatMul.weight``, the
weight transposed) and its place among the projections packed into it (q, k and v share one)."""


class WeightPatch:
    """Writes a trained model's current projection weights (its LoRA merged) into an exported float32 model, in
    place of a re-export.

    Why: a GRPO step changes only the adapter; re-exporting the whole model after each step took 30-60 s on 2 cores,
    longer than the step's rollouts. The export's initializers are the transposed projections (q, k and v packed
    into one), stored at known offsets of ``model.onnx.data``; the patch copies that file, rewrites the projections
    of the layers that carry an adapter, and renames the copy over the original (a model still loaded from the old
    file keeps reading it). :meth:`check` first rebuilds one projection that has no adapter from the torch weights
    and compares bytes: a layout it does not know is re-exported instead."""

    def __init__(self, folder: Path) -> None:
        import onnx

        proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        self.folder = folder
        self.where: dict[str, tuple[int, int]] = {}
        for t in proto.graph.initializer:
            ext = {e.key: e.value for e in t.external_data}
            if ext.get("location") == "model.onnx.data":
                self.where[t.name] = (int(ext.get("offset", 0)), int(ext["length"]))

    def tensors(self, model: Any, layers: set[int]) -> dict[str, np.ndarray]:
        """The exported initializers of ``layers`` built from the torch model's weights (adapters merged)."""
        parts: dict[str, list[tuple[int, np.ndarray]]] = {}
        for name, module in model.named_modules():
            bits = name.split(".")
            if len(bits) < 2 or bits[-1] not in PACKED_PROJECTIONS or "layers" not in bits:
                continue
            layer = int(bits[bits.index("layers") + 1])
            if layer not in layers or not hasattr(module, "weight") and not hasattr(module, "base_layer"):
                continue
            target, order = PACKED_PROJECTIONS[bits[-1]]
            parts.setdefault(f"model.layers.{layer}.{target}.MatMul.weight", []).append((order, _merged(module)))
        return {k: np.ascontiguousarray(np.concatenate([w for _, w in sorted(v, key=lambda x: x[0])], 0).T)
                for k, v in parts.items()}

    def check(self, model: Any, layer: int) -> bool:
        """Whether the torch weights of ``layer`` (which no adapter changes) rebuild its exported bytes exactly."""
        built = self.tensors(model, {layer})
        data = self.folder / "model.onnx.data"
        with data.open("rb") as f:
            for name, arr in built.items():
                offset, length = self.where.get(name, (0, -1))
                f.seek(offset)
                if arr.nbytes != length or f.read(length) != arr.tobytes():
                    return False
        return bool(built)

    def write(self, model: Any, layers: set[int]) -> None:
        """Rewrite the projections of ``layers`` from the torch model, into a copy renamed over the data file."""
        data = self.folder / "model.onnx.data"
        tmp = data.with_name(f".{data.name}.tmp-{os.getpid()}")
        shutil.copyfile(data, tmp)
        try:
            with tmp.open("r+b") as f:
                for name, arr in self.tensors(model, layers).items():
                    offset, length = self.where[name]
                    blob = arr.tobytes()
                    if len(blob) != length:
                        raise ValueError(f"{name}: {len(blob)} bytes for a slot of {length}")
                    f.seek(offset)
                    f.write(blob)
            os.replace(tmp, data)
        finally:
            tmp.unlink(missing_ok=True)


def _merged(module: Any) -> np.ndarray:
    """A linear layer's weight (out × in) with its LoRA adapter merged, as float32."""
    import torch

    with torch.no_grad():
        base = getattr(module, "base_layer", module)
        w = base.weight.detach().float().clone()
        for name in getattr(module, "active_adapters", []) or []:
            if name in getattr(module, "lora_A", {}):
                w += module.get_delta_weight(name).float()
        return w.cpu().numpy()


def adapter_layers(model: Any) -> set[int]:
    """The decoder layers that carry LoRA weights (the only ones an optimiser step changes)."""
    out = set()
    for name, _ in model.named_parameters():
        bits = name.split(".")
        if "lora_" in name and "layers" in bits:
            out.add(int(bits[bits.index("layers") + 1]))
    return out


class OnnxModel:
    """One exported model loaded into ONNX Runtime GenAI, with the pad id its batches use."""

    def __init__(self, folder: Path, threads: int) -> None:
        import onnxruntime_genai as og

        cfg = json.loads((folder / "genai_config.json").read_text())
        vocab = int(cfg["model"]["vocab_size"])
        # GenAI recognises padding by the pad id; the highest id is padding here, and a prompt that holds it is
        # decoded by the plain session (OnnxGenerator._decode), whose attention mask is given, not inferred
        self.pad_id = vocab - 1
        self.vocab = vocab
        self.context = int(cfg["model"].get("context_length") or 8192)
        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": {"pad_token_id": self.pad_id,
                                             "decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        self.model = og.Model(config)
        self.folder = folder
        self.threads = threads
        # the kept sequence holds the ONNX model, not this object: no reference cycle, so an engine the trainer
        # replaces after an optimiser step (600 MB in float32) is freed at once, not at the next cyclic collection
        self.session = OneSequence(self.model, min(self.context, SESSION_TOKENS))
        self._plain: PlainDecoder | None = None
        self._plain_lock = threading.Lock()

    @property
    def plain(self) -> PlainDecoder:
        """The same export in a plain ONNX Runtime session, for batches (:mod:`.onnx_plain`); loaded at the first
        batch (0.4 s), so a server that only ever sees one request at a time holds the weights once."""
        with self._plain_lock:
            if self._plain is None:
                self._plain = PlainDecoder(self.folder, self.threads)
            return self._plain


SESSION_TOKENS = 4096
"""The longest sequence a kept single-sequence generator holds (its KV cache is allocated for this length: 190 MB
for the embedded 135M model in float32); a longer request is decoded by a fresh generator."""


HISTORY_TOKENS = 2048
"""Tokens of earlier sequences kept as a source of drafts (:attr:`OneSequence.history`)."""
DRAFT_TOKENS = 8
"""Tokens drafted from the context per greedy step (:func:`prompt_lookup`)."""


def prompt_lookup(context: list[int], n: int, ngram: int = 3) -> list[int]:
    """The ``n`` tokens that followed the latest earlier occurrence of the context's last ``ngram`` tokens (the
    longest n-gram of 3, 2 that occurs earlier; none: no draft). Prompt-lookup decoding's draft: no second model."""
    arr = np.asarray(context, dtype=np.int64)
    for size in range(ngram, 1, -1):
        if len(arr) <= size:
            continue
        tail = arr[-size:]
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], size)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + size
            return [int(t) for t in arr[start : start + n]]
    return []


class OneSequence:
    """A single-sequence generator kept between calls, with the tokens its KV cache holds.

    Why: a policy turn's prompt is the previous turn's prompt, its completion and the new documents, and every
    request starts with the same instruction. For a batch of one, ONNX Runtime GenAI can rewind a generator and
    append to it, so a prompt that shares a prefix with what the generator holds is read from where they differ:
    one request at a time (the server's usual load), the second turn reads only the documents, and the instruction
    is read once per process rather than once per turn."""

    def __init__(self, model: Any, length: int) -> None:
        self.model = model
        self.length = length
        self.lock = threading.Lock()
        self.generator: Any = None
        self.tokens: list[int] = []
        self.history: list[int] = []
        """The latest tokens rewound away (earlier requests' turns), searched for drafts after the current ones."""
        self.drafted = 0
        """Draft tokens kept so far (prompt-lookup decoding; for the benchmark and the tests)."""

    def fits(self, prompt: list[int], max_tokens: int) -> bool:
        return len(prompt) + max_tokens <= self.length

    def start(self, prompt: list[int]) -> Any:
        """The generator with ``prompt`` read, reusing the longest prefix it already holds (at least the prompt's
        last token is read again: its logits choose the first new token)."""
        import onnxruntime_genai as og

        keep = min(common_prefix(self.tokens, prompt), len(prompt) - 1) if self.generator is not None else 0
        if keep < len(self.tokens):  # what is dropped stays a source of drafts: the policy's turns repeat
            self.history = (self.history + self.tokens[keep:])[-HISTORY_TOKENS:]
        if keep == 0:
            params = og.GeneratorParams(self.model)
            params.set_search_options(max_length=self.length, batch_size=1)
            self.generator, self.tokens = None, []
            self.generator = og.Generator(self.model, params)
        elif keep < len(self.tokens):
            self.generator.rewind_to(keep)
            del self.tokens[keep:]
        self.append(prompt[keep:])
        return self.generator

    def rewind(self, length: int) -> None:
        """Forget every token after the first ``length`` (a rejected draft)."""
        if length < len(self.tokens):
            self.generator.rewind_to(length)
            del self.tokens[length:]

    def append(self, tokens: list[int]) -> None:
        try:
            self.generator.append_tokens(np.asarray([tokens], dtype=np.int32))
        except Exception:
            self.generator, self.tokens = None, []  # its state is unknown: the next call starts afresh
            raise
        self.tokens.extend(tokens)


class NumpySampling:
    """Choosing each next token from an engine's full logits in numpy, as eager ``generate`` does: greedy or
    temperature/top-p sampling, log-probabilities, stop strings and per-sequence limits. Shared by the engines that
    hand back logits (ONNX Runtime GenAI, llama.cpp) so their rollouts follow one set of rules."""

    def _eos_ids(self) -> set[int]:
        tok = self.tokenizer
        cfg_eos = getattr(self.model.generation_config, "eos_token_id", None)
        return {tok.eos_token_id} | set(cfg_eos if isinstance(cfg_eos, (list, tuple)) else [cfg_eos]) - {None}

    def _rng(self) -> np.random.Generator:
        """Sampling randomness drawn from torch's generator, so ``torch.manual_seed`` fixes a run's rollouts here as
        it does in eager ``generate``."""
        import torch

        return np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))

    def _choose(self, logits: np.ndarray, temp: float, rng: np.random.Generator,
                want_logprobs: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """The next token of every row (greedy at temperature 0, else sampled at ``temp`` within top-p) and, when
        asked, its log-probability under the distribution it was drawn from."""
        if temp <= 0:
            chosen = logits.argmax(-1)
            if not want_logprobs:
                return chosen, None
            return chosen, _log_softmax(logits)[np.arange(len(chosen)), chosen]
        logp = _log_softmax(logits.astype(np.float64) / temp)
        if self.cfg.top_p < 1:
            logp = _top_p(logp, self.cfg.top_p)
        probs = np.exp(logp)
        probs /= probs.sum(-1, keepdims=True)
        cdf = probs.cumsum(-1)
        u = rng.random((len(probs), 1)) * cdf[:, -1:]
        chosen = np.minimum((cdf < u).sum(-1), probs.shape[1] - 1)
        return chosen, (logp[np.arange(len(chosen)), chosen] if want_logprobs else None)

    def _row_done(self, ids: list[int], limit: int, stop: tuple[str, ...], eos: set[int]) -> bool:
        if len(ids) >= limit or ids[-1] in eos:
            return True
        if not stop:
            return False
        tail = self.tokenizer.decode(ids[-STOP_TAIL_TOKENS:], skip_special_tokens=True)
        return any(s in tail for s in stop)

    def _record(self, rows: list[int], chosen: np.ndarray, lp: np.ndarray | None, out: list[list[int]],
                logps: list[list[float]], reqs: list[GenerationRequest], stop: tuple[str, ...],
                eos: set[int]) -> list[int]:
        """Append each of ``rows``' chosen token (``chosen``/``lp`` are aligned with ``rows``) and its
        log-probability; the rows that go on (no end of sequence, stop string or limit yet)."""
        going = []
        for k, row in enumerate(rows):
            out[row].append(int(chosen[k]))
            if lp is not None:
                logps[row].append(float(lp[k]))
            if not self._row_done(out[row], reqs[row].max_tokens, stop, eos):
                going.append(row)
        return going


class OnnxGenerator(NumpySampling, TransformersGenerator):
    """The transformers backend with its decoding done by ONNX Runtime GenAI (``policy.generator.engine``)."""

    def __init__(self, cfg: GeneratorConfig | None = None, *, model: Any = None, tokenizer: Any = None,
                 exclusive: threading.Lock | None = None, export_dir: Path | None = None) -> None:
        super().__init__(cfg, model=model, tokenizer=tokenizer, exclusive=exclusive)
        self.name = self.name.replace("transformers:", "onnx:", 1) + f" ({self.cfg.precision})"
        self.export_dir = export_dir
        self._engines: dict[bool, OnnxModel] = {}
        self._lock = threading.Lock()
        self._patcher: WeightPatch | bool | None = None
        self.load_engines()

    # -- the exported models ----------------------------------------------------------------------------------------

    def load_engines(self, adapters: tuple[bool, ...] | None = None) -> None:
        """Export (or find in the cache) and load the router with its adapter merged (``True``) and, for a LoRA
        model, its base weights for the reader (``False``). A trainer's router (``export_dir``) changes every step
        and is exported without the cache; the frozen base weights are cached."""
        import torch

        from ...config import default_model_dir

        threads = torch.get_num_threads()
        if adapters is None:
            adapters = (True, False) if self.has_adapter else (True,)
        engines = dict(self._engines)
        for adapter in adapters:
            if self.export_dir is not None and adapter:
                target = self.export_dir / "router"
            else:
                precision = self.precision(adapter)
                key = weights_fingerprint(self._view(adapter), precision)
                target = default_model_dir() / "onnx-genai" / f"{key}-{precision}"
            if not (target / "genai_config.json").is_file() or (self.export_dir is not None and adapter):
                self._export(adapter, target)
            engines[adapter] = OnnxModel(target, threads)
        with self._lock:
            self._engines = engines

    def precision(self, adapter: bool) -> str:
        """The router's precision is the setting's; a LoRA model's base weights, which read the final answer
        (``reader = "base"``), stay float32: in int4 that reader's answers fell apart (docs/benchmarks.md)."""
        return self.cfg.precision if adapter or not self.has_adapter else "float32"

    def _view(self, adapter: bool) -> Any:
        if adapter or not self.has_adapter:
            return self.model
        return _BaseWeights(self.model)

    def _export(self, adapter: bool, target: Path) -> None:
        log.info("exporting the policy%s to ONNX Runtime GenAI (%s) into %s",
                 "" if adapter else "'s base weights", self.precision(adapter), target)
        staging = target.parent / f".{target.name}.hf-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            save_merged(self.model, self.tokenizer, staging, adapter=adapter)
            export_model(staging, target, self.precision(adapter))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def refresh(self) -> None:
        """Give the engine the router's current weights (after an optimiser step), decoded from the next batch on: the
        adapter's layers written into the export (:class:`WeightPatch`) where it can, else a re-export. A LoRA
        model's base weights do not change and stay loaded."""
        if self._patch_router():
            return
        self.load_engines((True,))

    def _patch_router(self) -> bool:
        """Patch the trainer's float32 export in place; False when it cannot (no export yet, not float32, no
        adapter, or a layout the patch does not know, found once and remembered)."""
        import torch

        if self.export_dir is None or self.cfg.precision != "float32" or not self.has_adapter:
            return False
        folder = self.export_dir / "router"
        if self._patcher is None and (folder / "genai_config.json").is_file():
            layers = adapter_layers(self.model)
            free = next((i for i in range(max(layers, default=0) + 1) if i not in layers), None)
            patch = WeightPatch(folder)
            if layers and free is not None and patch.check(self.model, free):
                self._patcher = patch
            else:
                log.warning("the exported router's layout is not the one WeightPatch writes: re-exporting each step")
                self._patcher = False
        if not self._patcher:
            return False
        self._patcher.write(self.model, adapter_layers(self.model))
        engine = OnnxModel(folder, torch.get_num_threads())
        with self._lock:
            self._engines = {**self._engines, True: engine}
        return True

    # -- decoding ---------------------------------------------------------------------------------------------------

    def _generate_group(self, reqs: list[GenerationRequest], stop: tuple[str, ...], temp: float) -> list[Generation]:
        prompts = [self.prompt_ids(r) for r in reqs]
        adapter = all(r.adapter for r in reqs) or not self.has_adapter
        with self._lock:
            engine = self._engines[adapter]
        ids, logps = self._decode(engine, prompts, reqs, stop, temp)
        eos = self._eos_ids()
        return [self._finish(i, lp, r, stop, eos, len(p)) for i, lp, r, p in zip(ids, logps, reqs, prompts)]

    def _decode(self, engine: OnnxModel, prompts: list[list[int]], reqs: list[GenerationRequest],
                stop: tuple[str, ...], temp: float) -> tuple[list[list[int]], list[list[float] | None]]:
        """Decode until every row has met its end of sequence, a stop string or its limit: one request on the kept
        sequence, a batch on plain ONNX Runtime with its prompts' shared prefixes read once (:mod:`.onnx_plain`)."""
        one = len(prompts) == 1 and engine.pad_id not in prompts[0]
        if one and engine.session.fits(prompts[0], reqs[0].max_tokens):
            if engine.session.lock.acquire(blocking=False):
                try:
                    ids, lp = self._decode_one(engine.session, prompts[0], reqs[0], stop, temp)
                    return [ids], [lp]
                finally:
                    engine.session.lock.release()
        length = min(max(len(p) + r.max_tokens for p, r in zip(prompts, reqs)), engine.context)
        logits, cache = engine.plain.batch(prompts, length)
        want_logprobs = any(r.logprobs for r in reqs)
        rng = self._rng()
        eos = self._eos_ids()
        out: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        while True:  # every row steps (the batch's cache is one buffer); only the live rows' tokens are kept
            chosen, lp = self._choose(logits, temp, rng, want_logprobs)
            live = self._record(live, chosen[live], None if lp is None else lp[live], out, logps, reqs, stop, eos)
            if not live or cache.full():  # the model's context is full: what is there is the answer
                break
            logits = cache.step(chosen)
        return out, [lp if want_logprobs else None for lp in logps]

    def _decode_one(self, session: OneSequence, prompt: list[int], req: GenerationRequest, stop: tuple[str, ...],
                    temp: float) -> tuple[list[int], list[float] | None]:
        """Decode one sequence on the kept generator (:class:`OneSequence`), each chosen token appended to it; greedy
        decoding also checks drafts copied from the context (:meth:`_accept_draft`)."""
        gen = session.start(prompt)
        rng = self._rng()
        eos = self._eos_ids()
        out: list[int] = []
        logps: list[float] = []
        logits = gen.get_logits().reshape(1, -1)
        while True:
            chosen, lp = self._choose(logits, temp, rng, req.logprobs)
            out.append(int(chosen[0]))
            if lp is not None:
                logps.append(float(lp[0]))
            if self._row_done(out, req.max_tokens, stop, eos):
                return out, (logps if req.logprobs else None)
            room = min(DRAFT_TOKENS, req.max_tokens - len(out), session.length - len(session.tokens) - 1)
            context = session.history + session.tokens + out[-1:]
            draft = prompt_lookup(context, room) if temp <= 0 and room > 0 else []
            if not draft:
                session.append(out[-1:])
                logits = gen.get_logits().reshape(1, -1)
                continue
            logits, finished = self._accept_draft(session, out, logps, draft, req, stop, eos)
            if finished:
                return out, (logps if req.logprobs else None)

    def _accept_draft(self, session: OneSequence, out: list[int], logps: list[float], draft: list[int],
                      req: GenerationRequest, stop: tuple[str, ...], eos: set[int]) -> tuple[np.ndarray, bool]:
        """Prompt-lookup decoding: append the chosen token and a draft copied from the context in one forward pass,
        keep the draft's tokens while each is what greedy decoding would choose, and rewind past the rest.

        Why: a policy's query mostly copies the question or a document's words, and one pass over nine tokens
        costs about what one token does (a decoder step on a CPU is bound by reading the weights). Greedy only, so
        the tokens are the ones one-at-a-time decoding chooses."""
        held = len(session.tokens)
        session.append(out[-1:] + draft)
        rows = session.generator.get_output("logits").reshape(len(draft) + 1, -1)
        chosen, lp = self._choose(rows, 0.0, None, req.logprobs)  # type: ignore[arg-type]
        kept, finished = 0, False
        for j, token in enumerate(draft):
            if int(chosen[j]) != token:
                break
            out.append(token)
            kept += 1
            if lp is not None:
                logps.append(float(lp[j]))
            finished = self._row_done(out, req.max_tokens, stop, eos)
            if finished:
                break
        session.rewind(held + 1 + kept)
        session.drafted += kept
        return rows[kept : kept + 1], finished


class _BaseWeights:
    """A PEFT model's base weights, for fingerprinting: its state dict less the LoRA tensors."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.model.state_dict().items() if "lora_" not in k}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _top_p(logp: np.ndarray, top_p: float) -> np.ndarray:
    """Keep, per row, the most likely tokens whose probabilities sum to ``top_p`` (the first always), as
    transformers' TopPLogitsWarper does; the rest get -inf."""
    order = np.argsort(-logp, axis=-1)
    sorted_p = np.exp(np.take_along_axis(logp, order, -1))
    keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, -1)
    out = np.where(keep, logp, -np.inf)
    return out - np.log(np.exp(out).sum(-1, keepdims=True))
