"""An embedder that remembers: vectors are looked up by text hash before the model runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..cache import DiskCache
from ..corpus import text_hash
from .base import Embedder

_FLUSH_EVERY = 2048  # texts per model call, so a killed build loses at most this much work


class CachedEmbedder(Embedder):
    def __init__(self, inner: Embedder, cache: DiskCache | None) -> None:
        self.inner = inner
        self.cache = cache
        self.identity = inner.identity
        self.batch_size = inner.batch_size
        self.query_instruction = inner.query_instruction
        self.hits = 0
        self.misses = 0

    @property
    def dim(self) -> int:
        return self.inner.dim

    def _encode_batch(self, texts: list[str]) -> np.ndarray:  # pragma: no cover - encode() is overridden
        return self.inner._encode_batch(texts)

    def encode(self, texts: Sequence[str], *, desc: str | None = None, progress: bool = True) -> np.ndarray:
        if self.cache is None:
            self.misses += len(texts)
            return self.inner.encode(texts, desc=desc, progress=progress)
        ns = f"emb:{self.identity}"
        keys = [text_hash(t) for t in texts]
        found = self.cache.get_many(ns, keys)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        todo: dict[str, int] = {}
        for i, k in enumerate(keys):
            blob = found.get(k)
            if blob is not None and len(blob) == 4 * self.dim:
                out[i] = np.frombuffer(blob, dtype=np.float32)
            else:
                todo.setdefault(k, i)
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        pending = list(todo.items())
        for start in range(0, len(pending), _FLUSH_EVERY):
            part = pending[start : start + _FLUSH_EVERY]
            vecs = self.inner.encode([texts[i] for _, i in part], desc=desc, progress=progress)
            self.cache.put_many(ns, ((k, v.tobytes()) for (k, _), v in zip(part, vecs)))
            for (_, i), v in zip(part, vecs):
                out[i] = v
        if todo:
            # Duplicate texts share a key: fill every position from the first computed copy.
            for i, k in enumerate(keys):
                j = todo.get(k)
                if j is not None and j != i:
                    out[i] = out[j]
        return out

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.inner.encode_queries(queries)
