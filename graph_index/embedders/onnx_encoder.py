"""The MiniLM (any BERT-style mean-pooling sentence-transformers folder) run by ONNX Runtime instead of eager torch.

Why: one short query through eager torch costs 15-20 ms on two cores, almost all of it Python and dispatch
overhead around a 6-layer encoder; ONNX Runtime runs the same graph (fused attention and layer norm) in a few ms,
which is most of an end-to-end hybrid search's budget.

The graph is exported once from the local folder with ``torch.onnx`` (no hub access) and cached on disk under the
cache directory, keyed by the model weights' hash, so every later process only loads it. The write is atomic (a
temporary file renamed into place), so concurrent first users never read a half-written model. The tokenizer is the
folder's own ``tokenizer.json`` through the ``tokenizers`` library, truncated to the model's ``max_seq_length``, as
sentence-transformers does. Mean pooling is part of the exported graph; rows come back unnormalised, as the torch
embedder's do (:meth:`Embedder.encode` normalises).
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..ort_session import ProcessSession, onnx_available  # noqa: F401 - onnx_available is used from here
from ..status import STATUS
from .base import Embedder

log = logging.getLogger(__name__)

EXPORT_VERSION = 2
"""Bumped when the exported graph changes, so stale cached exports are not reused (2: eager attention, which ONNX
Runtime's transformer optimizer can fuse)."""


def _weights_digest(folder: Path) -> str:
    h = hashlib.sha256(f"v{EXPORT_VERSION}".encode())
    for name in ("model.safetensors", "pytorch_model.bin", "config.json", "1_Pooling/config.json"):
        p = folder / name
        if p.is_file():
            h.update(name.encode())
            with p.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


def _check_supported(folder: Path) -> None:
    pooling = folder / "1_Pooling" / "config.json"
    if not pooling.is_file() or not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens"):
        raise ValueError(f"{folder}: only mean-pooling sentence-transformers folders are exported to ONNX")
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder}: no tokenizer.json")


def export_onnx(folder: Path, target: Path) -> Path:
    """Export the folder's transformer with mean pooling to ``target`` (atomically: temp file, then rename)."""
    import torch
    from transformers import AutoModel

    # eager attention: its MatMul/Softmax pattern is what ONNX Runtime's optimizer fuses (the SDPA export's is not)
    model = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()

    class MeanPooled(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    ids = torch.ones((2, 8), dtype=torch.int64)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on the mask arithmetic: harmless here
        torch.onnx.export(MeanPooled(model), (ids, torch.ones_like(ids)), str(tmp), dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"}, "embedding": {0: "batch"}},
                          opset_version=17)
    return target


def cached_export(folder: Path, cache_dir: Path) -> Path:
    """The ONNX export of ``folder`` under ``cache_dir``, exported on first use."""
    folder = folder.resolve()
    _check_supported(folder)
    target = cache_dir / "onnx" / f"{folder.name}-{_weights_digest(folder)}.onnx"
    if not target.is_file():
        log.info("exporting the query encoder %s to ONNX (once, about 10 s) at %s", folder.name, target,
                 extra=STATUS)
        export_onnx(folder, target)
    return target


def cached_fused(plain: Path, folder: Path) -> Path:
    """ONNX Runtime's transformer optimizer applied to an export, beside it, made on first use (atomically): fused
    Attention, SkipLayerNormalization, BiasGelu and EmbedLayerNormalization nodes, about 60 instead of 350. Where
    the optimizer fails (an architecture it does not know), the plain graph is returned."""
    target = plain.with_name(plain.stem + "-fused.onnx")
    if target.is_file():
        return target
    try:
        from onnxruntime.transformers import optimizer

        config = json.loads((folder / "config.json").read_text())
        log.info("optimising the ONNX query encoder (once) at %s", target, extra=STATUS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fused = optimizer.optimize_model(str(plain), model_type="bert", opt_level=1,
                                             num_heads=int(config["num_attention_heads"]),
                                             hidden_size=int(config["hidden_size"]))
        with atomic_path(target, suffix=".onnx") as tmp:
            fused.save_model_to_file(str(tmp))
    except Exception as exc:  # noqa: BLE001 - the plain graph is correct, only slower for one query
        log.warning("could not fuse %s (%s); one query runs the unfused graph", plain, exc)
        return plain
    return target


def cached_int8(fp32: Path) -> Path:
    """A per-channel dynamic int8 copy of an exported graph beside it, made on first use (atomically).

    Why per channel: one scale per weight tensor (the default) gave query vectors at cosine 0.94-0.96 to torch's;
    one per output channel keeps them at 0.99 (PopQA-500: mean 0.993, min 0.987) and runs ~1.6x faster on AVX2."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = fp32.with_name(fp32.stem + "-int8.onnx")
    if target.is_file():
        return target
    log.info("quantising the ONNX query encoder to int8 (once) at %s", target, extra=STATUS)
    with atomic_path(target, suffix=".onnx") as tmp:
        quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True)
    return target


class OnnxEmbedder(Embedder):
    """A local mean-pooling sentence-transformers folder run by ONNX Runtime (vectors match the torch embedder's to
    float32 rounding; ``tests/test_onnx_encoder.py`` checks cosine > 0.9999)."""

    def __init__(self, folder: str | Path, *, identity: str, cache_dir: Path, batch_size: int = 64,
                 query_instruction: str = "", threads: int | None = None, int8: bool = False) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder).expanduser().resolve()

        def plain() -> Path:  # exported on first use; made again only if a cached graph proves unreadable
            return cached_export(folder, cache_dir)

        def graph() -> Path:
            return cached_int8(plain()) if int8 else plain()

        path, self.session = _cached_session(graph(), graph, threads)
        # one text at a time runs the fused graph (see _encode_batch); the int8 graph has none
        self.single_path, self.single_session = path, self.session
        if not int8:
            fused, session = _cached_session(cached_fused(path, folder), lambda: cached_fused(plain(), folder),
                                             threads)
            if fused != path:
                self.single_path, self.single_session = fused, session
        max_len = int(json.loads((folder / "sentence_bert_config.json").read_text()).get("max_seq_length", 256)) \
            if (folder / "sentence_bert_config.json").is_file() else 256
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_len)
        self.tokenizer.no_padding()
        self.identity = identity
        self.batch_size = batch_size
        self.query_instruction = query_instruction
        self.path = path
        self._dim = int(json.loads((folder / "config.json").read_text())["hidden_size"])

    @property
    def dim(self) -> int:
        return self._dim

    def _lengths(self, texts: Sequence[str]) -> list[int]:
        """Token counts: sorted by characters, PopQA's 500 questions padded to 1.30x their tokens in batches of 64;
        sorted by tokens, 1.10-1.15x (tokenising costs ~0.01 ms a question)."""
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts))]

    def _batches(self, order: list[int], lengths: Sequence[int], size: int) -> list[list[int]]:
        """Batches of at most ``size`` texts that also end where the token count grows, once they hold half of
        ``size``: padding 1.01x instead of 1.10-1.15x for PopQA's questions, and the encoder 7.3% faster (0.793
        against 0.848 ms per question, median of ten interleaved passes; half of 64 beat a quarter and an eighth),
        batched hybrid retrieval 2.5-2.8% faster end to end (two runs of sixteen), top 10 identical."""
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            if current and (len(current) >= size or (lengths[i] > lengths[current[-1]] and 2 * len(current) >= size)):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        """One text runs the fused graph, several the plain one. Why two: inside a single-query search the fused
        graph's encoding took 0.67 ms less (3.10 against 3.86 ms, median of 400 searches, each PopQA question
        searched both ways in turn), but it ran batches 2.5-15% slower (its Attention op), and from 8 texts on it
        no longer wins. The two graphs' vectors meet at cosine 0.9999998 (the plain graph's alone and in a batch
        differ by up to 7e-8), and the top 10 of all 500 PopQA questions encoded either way were identical in
        every mode. The second session costs about 45 MB."""
        enc = self.tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in enc)
        ids = np.zeros((len(enc), width), dtype=np.int64)
        mask = np.zeros((len(enc), width), dtype=np.int64)
        for r, e in enumerate(enc):
            ids[r, : len(e.ids)] = e.ids
            mask[r, : len(e.ids)] = 1
        session = self.single_session if len(texts) == 1 else self.session
        return session.run({"input_ids": ids, "attention_mask": mask})[0]


def _cached_session(path: Path, remake: Callable[[], Path], threads: int | None) -> tuple[Path, ProcessSession]:
    """A session for the cached graph at ``path``. A cached file ONNX Runtime cannot load (truncated or corrupt) is
    removed and made again once by ``remake``, instead of sending every later process to the slow torch
    fallback."""
    try:
        return path, ProcessSession(path, threads or 0)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own, unexported, exception types
        log.warning("cached ONNX graph %s could not be loaded (%s); making it again", path, str(exc)[:200])
        path.unlink(missing_ok=True)
        path = remake()
        return path, ProcessSession(path, threads or 0)
