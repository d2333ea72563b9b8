"""Any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM ``--task embed``, TEI, Infinity...)."""

from __future__ import annotations

import numpy as np

from .base import Embedder


class OpenAIEmbedder(Embedder):
    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 batch_size: int = 64, timeout_s: float = 60.0, query_instruction: str = "") -> None:
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=3)
        self.model = model
        self.identity = f"openai:{base_url or 'api.openai.com'}:{model}"
        self.batch_size = batch_size
        self.query_instruction = query_instruction
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._request(["dimension probe"]).shape[1])
        return self._dim

    def _request(self, texts: list[str]) -> np.ndarray:
        resp = self.client.embeddings.create(model=self.model, input=texts)
        rows = sorted(resp.data, key=lambda d: d.index)
        return np.asarray([r.embedding for r in rows], dtype=np.float32)

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        return self._request(texts)
