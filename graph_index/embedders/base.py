"""The embedder interface: texts in, L2-normalised float32 rows out, in batches, with a progress bar."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm


class Embedder(ABC):
    """Turns texts into unit-length float32 vectors so inner product is cosine similarity."""

    #: Stable identity used in manifests and cache keys: two embedders with the same identity give the same
    #: vectors for the same text.
    identity: str
    batch_size: int = 64
    query_instruction: str = ""

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @abstractmethod
    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        """Embed one batch (any dtype, not necessarily normalised)."""

    def encode(self, texts: Sequence[str], *, desc: str | None = None, progress: bool = True) -> np.ndarray:
        """Embed ``texts`` (order kept). Texts are sorted by length first (:meth:`_lengths`) so batches pad
        little."""
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        lengths = self._lengths(texts)
        order = sorted(range(n), key=lambda i: lengths[i])
        chunk = max(self.batch_size, 1)
        with tqdm(total=n, desc=desc or "embedding", unit="text", disable=not progress or n <= chunk,
                  leave=False) as bar:
            for idx in self._batches(order, lengths, chunk):
                vecs = np.asarray(self._encode_batch([texts[i] for i in idx]), dtype=np.float32)
                if vecs.shape != (len(idx), self.dim):
                    raise RuntimeError(
                        f"embedder {self.identity} returned shape {vecs.shape}, expected {(len(idx), self.dim)}")
                out[idx] = vecs
                bar.update(len(idx))
        return normalize_rows(out)

    def _batches(self, order: list[int], lengths: Sequence[int], size: int) -> list[list[int]]:
        """The sorted texts cut into batches of ``size``."""
        return [order[start : start + size] for start in range(0, len(order), size)]

    def _lengths(self, texts: Sequence[str]) -> Sequence[int]:
        """What texts are sorted by before batching, so each batch pads little: characters, unless an embedder can
        count its own tokens cheaply."""
        return [len(t) for t in texts]

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Embed search queries (with the query instruction, if the model wants one)."""
        if self.query_instruction:
            queries = [self.query_instruction + q for q in queries]
        return self.encode(queries, progress=False)


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Scale rows to unit length in place (zero rows stay zero) and return ``x``."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.divide(x, norms, out=x, where=norms > 0)
    return x
