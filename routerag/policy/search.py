"""Search backends for the policy loop: the in-process retriever behind a micro-batcher, or a remote retrieval
server that speaks the Search-R1 / RouteRAG ``/retrieve`` protocol (plus our ``mode`` field)."""

from __future__ import annotations

import threading

import httpx

from ..batching import MicroBatcher
from ..retrieval import Retriever
from ..retrieval.types import QueryError, RetrievalResult
from ..retrieval.shards import ShardedRetriever, parse_document, refusal, retrieve_url
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


class ShardSearch:
    """The policy loop's searches over shard servers (:class:`~routerag.retrieval.shards.ShardedRetriever`): one
    fan-out per search, on the event loop (the shards batch on their side)."""

    def __init__(self, shards: ShardedRetriever) -> None:
        self.shards = shards

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        results, _ = await self.shards.search([query], mode, k)
        return results[0]


class HTTPSearch:
    """A remote ``POST /retrieve`` (our server, Search-R1's or RouteRAG's format of documents)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = retrieve_url(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(timeout=timeout_s, headers=headers)

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        """One search; a request the server refuses (a bad query, a ``k`` above its ``max_k``) raises
        :class:`QueryError` as the local retriever would, so the loop reports it to the policy; any other failure
        (auth, server error, network) raises as an HTTP error."""
        resp = await self.client.post(self.url, json={"queries": [query], "topk": k, "return_scores": True,
                                                      "mode": mode})
        refused = refusal(resp)
        if refused is not None:
            raise refused
        resp.raise_for_status()
        body = resp.json()
        docs = [parse_document(item) for item in body["result"][0]]
        ms = body.get("ms", [None])[0] if isinstance(body.get("ms"), list) else None
        return RetrievalResult(query, mode, docs, {"server": float(ms)} if ms is not None else {})

    async def aclose(self) -> None:
        await self.client.aclose()
