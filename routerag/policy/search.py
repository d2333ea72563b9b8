"""Search backends for the policy loop: the in-process retriever behind a micro-batcher, or a remote retrieval
server that speaks the Search-R1 / RouteRAG ``/retrieve`` protocol (plus our ``mode`` field)."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from ..batching import MicroBatcher
from ..retrieval import QueryError, RetrievalResult, RetrievedDoc, Retriever
from ..vocabulary import Mode


class LocalSearch:
    """Concurrent searches share one batched retrieval call per (mode, k)."""

    def __init__(self, retriever: Retriever, *, max_batch: int = 64, max_wait_ms: float = 2.0,
                 exclusive: threading.Lock | None = None) -> None:
        self.retriever = retriever
        self.batcher: MicroBatcher[tuple[str, Mode, int], RetrievalResult] = MicroBatcher(
            self._run, max_batch=max_batch, max_wait_ms=max_wait_ms, name="retrieval", exclusive=exclusive)

    def _run(self, items: list[tuple[str, Mode, int]]) -> list[RetrievalResult | QueryError]:
        """One batched search per (mode, k); a refused query (or mode, or k) fails its own searches only, since the
        batch mixes the searches of unrelated trajectories."""
        out: list[RetrievalResult | QueryError | None] = [None] * len(items)
        groups: dict[tuple[Mode, int], list[int]] = {}
        for i, (_, mode, k) in enumerate(items):
            groups.setdefault((mode, k), []).append(i)
        for (mode, k), idx in groups.items():
            try:
                results = self.retriever.search_each([items[i][0] for i in idx], mode=mode, k=k)
            except QueryError as exc:
                results = [exc] * len(idx)
            for i, res in zip(idx, results):
                out[i] = res
        return out  # type: ignore[return-value]

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        return await self.batcher.submit((query, mode, k))


class HTTPSearch:
    """A remote ``POST /retrieve`` (our server, Search-R1's or RouteRAG's format of documents)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        if not self.url.endswith("/retrieve"):
            self.url += "/retrieve"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(timeout=timeout_s, headers=headers)

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        resp = await self.client.post(self.url, json={"queries": [query], "topk": k, "return_scores": True,
                                                      "mode": mode})
        resp.raise_for_status()
        body = resp.json()
        docs = [parse_document(item) for item in body["result"][0]]
        ms = body.get("ms", [None])[0] if isinstance(body.get("ms"), list) else None
        return RetrievalResult(query, mode, docs, {"server": float(ms)} if ms is not None else {})

    async def aclose(self) -> None:
        await self.client.aclose()


def parse_document(item: Any) -> RetrievedDoc:
    """A ``/retrieve`` result entry: ``{"document": {...}, "score"}`` or a bare document; the document a dict
    (``id``/``title``/``text``, or Search-R1's ``contents`` = title line + text) or RouteRAG's ``"title\\ntext"``."""
    score = 0.0
    if isinstance(item, dict) and "document" in item:
        score = float(item.get("score", 0.0))
        item = item["document"]
    if isinstance(item, str):
        title, _, text = item.partition("\n")
        return RetrievedDoc("", title.strip().strip('"'), text.strip(), score)
    title = item.get("title")
    text = item.get("text")
    if title is None or text is None:
        head, _, rest = str(item.get("contents", "")).partition("\n")
        title, text = title or head.strip().strip('"'), text or rest.strip()
    return RetrievedDoc(str(item.get("id", "")), str(title), str(text), score)
