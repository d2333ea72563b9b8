"""Swappable text embedders: the embedded MiniLM default, any sentence-transformers model, or an
OpenAI-compatible endpoint. :func:`make_embedder` turns an :class:`~graph_index.config.EmbedderConfig` into one."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Literal

from ..config import EMBEDDED_EMBEDDER, EmbedderConfig, default_cache_dir
from .base import Embedder, normalize_rows
from .cached import CachedEmbedder

__all__ = ["Embedder", "CachedEmbedder", "make_embedder", "normalize_rows", "embedder_identity"]

_LOADED: dict[str, Embedder] = {}
log = logging.getLogger(__name__)

Runtime = Literal["auto", "onnx", "onnx-int8", "torch"]
"""How a local sentence-transformers model runs: ``torch`` (eager, as sentence-transformers runs it), ``onnx``
(exported once, run by ONNX Runtime; several times faster for a short query on a CPU), ``onnx-int8`` (the same
export quantised per channel: faster, vectors at cosine ~0.99 to torch's, so results can differ; activations are
quantised with one scale per batch, so a text's vector also depends on the texts encoded with it: 200 PopQA
questions alone and within their batch of 500 gave different hybrid top-10 lists 91% of the time) or ``auto`` (ONNX
where the runtime is installed, the model can be exported and no GPU is in use; torch otherwise, with a log line
why)."""


def embedder_identity(cfg: EmbedderConfig) -> str:
    """The identity :func:`make_embedder` would give, without loading the model."""
    if cfg.name == EMBEDDED_EMBEDDER:
        return "st:all-MiniLM-L6-v2"
    if cfg.name.startswith("openai:"):
        return f"openai:{cfg.endpoint.host}:{cfg.name.split(':', 1)[1]}"
    from pathlib import Path

    p = Path(cfg.name).expanduser()
    return f"st:{p.resolve().name}" if p.exists() else f"st:{cfg.name}"


def make_embedder(cfg: EmbedderConfig, *, reuse: bool = True, runtime: Runtime = "torch",
                  cache_dir: Path | None = None) -> Embedder:
    """Build (or reuse, per process) the embedder ``cfg`` names; ``runtime`` picks how a local model runs (an
    ``openai:`` embedder ignores it). ``cache_dir`` holds the ONNX export (default: the build cache directory)."""
    api_key = cfg.endpoint.key() if cfg.name.startswith("openai:") else None
    # the dump masks secrets: the key's fingerprint tells apart embedders that differ only in their key
    key = cfg.model_dump_json() + (hashlib.sha256(api_key.encode()).hexdigest() if api_key else "") + runtime
    if reuse and key in _LOADED:
        return _LOADED[key]
    emb: Embedder
    if cfg.name.startswith("openai:"):
        from .openai_compat import OpenAIEmbedder

        emb = OpenAIEmbedder(cfg.name.split(":", 1)[1], cfg.endpoint, batch_size=cfg.batch_size,
                             query_instruction=cfg.query_instruction)
    else:
        from .sentence_transformers import SentenceTransformerEmbedder, embedded_minilm_path

        source = embedded_minilm_path() if cfg.name == EMBEDDED_EMBEDDER else cfg.name
        fast = _onnx_embedder(cfg, source, runtime, cache_dir) if runtime != "torch" else None
        emb = fast or SentenceTransformerEmbedder(source, identity=embedder_identity(cfg), batch_size=cfg.batch_size,
                                          device=cfg.device, query_instruction=cfg.query_instruction)
    if reuse:
        _LOADED[key] = emb
    return emb


def _onnx_embedder(cfg: EmbedderConfig, source: str | Path, runtime: Runtime, cache_dir: Path | None
                   ) -> Embedder | None:
    """The ONNX Runtime embedder, or None (``auto``) where it cannot be used; ``onnx`` raises instead."""
    from .onnx_encoder import OnnxEmbedder, onnx_available

    why = None
    folder = Path(source).expanduser()
    if not onnx_available():
        why = "onnxruntime is not installed (pip install onnxruntime)"
    elif not folder.is_dir():
        why = f"{source} is not a local folder"
    elif (cfg.device or "").startswith("cuda") or (cfg.device is None and _cuda()):
        why = "a GPU is in use"
    if why is None:
        try:
            return OnnxEmbedder(folder, identity=embedder_identity(cfg), cache_dir=cache_dir or default_cache_dir(),
                                batch_size=cfg.batch_size, query_instruction=cfg.query_instruction,
                                int8=runtime == "onnx-int8")
        except Exception as exc:  # noqa: BLE001 - any export or load failure falls back to torch under auto
            if runtime != "auto":
                raise
            why = f"the ONNX export failed ({type(exc).__name__}: {exc})"
    if runtime != "auto":
        raise RuntimeError(f"the ONNX query encoder ({runtime}) was asked for, but {why}")
    log.info("query encoder: eager torch, not ONNX Runtime: %s", why)
    return None


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
