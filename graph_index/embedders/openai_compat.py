"""Any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM ``--task embed``, TEI, Infinity...).

The key is never stored with an index: the manifest names the environment variable that holds it
(``EmbedderConfig.api_key_env``), so a refused key is reported with that variable's name, the one thing a user
searching an index someone else built needs to know.
"""

from __future__ import annotations

import os

import numpy as np

from ..llm_clients import Endpoint, UpstreamError, error_detail, openai_client
from .base import Embedder


class OpenAIEmbedder(Embedder):
    def __init__(self, model: str, endpoint: Endpoint, *, batch_size: int = 64, query_instruction: str = "") -> None:
        self.client = openai_client(endpoint, max_retries=3)
        self.model = model
        self.endpoint = endpoint
        self.identity = f"openai:{endpoint.host}:{model}"
        self.batch_size = batch_size
        self.query_instruction = query_instruction
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._request(["dimension probe"]).shape[1])
        return self._dim

    def _request(self, texts: list[str]) -> np.ndarray:
        import openai

        try:
            resp = self.client.embeddings.create(model=self.model, input=texts)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise UpstreamError(self._key_advice(exc)) from exc
        rows = sorted(getattr(resp, "data", None) or [], key=lambda d: d.index)
        if len(rows) != len(texts):
            raise UpstreamError(f"embedding endpoint {self.endpoint.host} returned {len(rows)} vectors for "
                                f"{len(texts)} texts")
        return np.asarray([r.embedding for r in rows], dtype=np.float32)

    def _key_advice(self, exc: Exception) -> str:
        where = f"embedding endpoint {self.endpoint.host}"
        status = getattr(exc, "status_code", "")
        env = self.endpoint.api_key_env
        if not env:
            how = "this embedder names no variable for its key (embedder.api_key_env)"
        elif os.environ.get(env):
            how = f"the key comes from ${env} (embedder.api_key_env); check its value"
        else:
            how = f"set ${env}: this embedder reads its key from that variable (embedder.api_key_env), and it is unset"
        return f"{where} refused the API key (HTTP {status}): {error_detail(exc)}; {how}"

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        return self._request(texts)
