"""Swappable text embedders: the embedded MiniLM default, any sentence-transformers model, or an
OpenAI-compatible endpoint. :func:`make_embedder` turns an :class:`~graph_index.config.EmbedderConfig` into one."""

from __future__ import annotations

import hashlib

from ..config import EMBEDDED_EMBEDDER, EmbedderConfig
from .base import Embedder, normalize_rows
from .cached import CachedEmbedder

__all__ = ["Embedder", "CachedEmbedder", "make_embedder", "normalize_rows", "embedder_identity"]

_LOADED: dict[str, Embedder] = {}


def embedder_identity(cfg: EmbedderConfig) -> str:
    """The identity :func:`make_embedder` would give, without loading the model."""
    if cfg.name == EMBEDDED_EMBEDDER:
        return "st:all-MiniLM-L6-v2"
    if cfg.name.startswith("openai:"):
        return f"openai:{cfg.endpoint.host}:{cfg.name.split(':', 1)[1]}"
    from pathlib import Path

    p = Path(cfg.name).expanduser()
    return f"st:{p.resolve().name}" if p.exists() else f"st:{cfg.name}"


def make_embedder(cfg: EmbedderConfig, *, reuse: bool = True) -> Embedder:
    """Build (or reuse, per process) the embedder ``cfg`` names."""
    api_key = cfg.endpoint.key() if cfg.name.startswith("openai:") else None
    # the dump masks secrets: the key's fingerprint tells apart embedders that differ only in their key
    key = cfg.model_dump_json() + (hashlib.sha256(api_key.encode()).hexdigest() if api_key else "")
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
        emb = SentenceTransformerEmbedder(source, identity=embedder_identity(cfg), batch_size=cfg.batch_size,
                                          device=cfg.device, query_instruction=cfg.query_instruction)
    if reuse:
        _LOADED[key] = emb
    return emb
