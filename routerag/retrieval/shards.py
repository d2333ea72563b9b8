"""Sharded retrieval: one query batch fanned out over the ``/retrieve`` of several shard servers, merged into one
ranking per query.

Each shard is a ``routerag serve`` over one part of the corpus (any server that speaks the ``/retrieve`` protocol
works). The merge follows what the scores mean:

* ``passage``: every shard scores with the same embedder and the same inner product, so the scores are comparable:
  the shards' lists are merged by score, and the top k of the union is exactly the unsharded top k (each shard
  returns its own top k, which contains every document of the global top k that it holds).
* ``graph`` and ``hybrid``: a Personalized PageRank score is a probability mass within one shard's graph, and an RRF
  score a function of ranks within one shard; neither compares across shards. The shards' rankings are fused by
  Reciprocal Rank Fusion (:func:`~routerag.retrieval.fusion.reciprocal_rank_fusion`), which needs only ranks. This
  is an approximation of searching one graph (a fact that links passages on two shards is seen by neither), and
  ``benchmarks/shards.py`` measures what it costs in recall.

A shard that fails or does not answer within the timeout degrades the result, it does not fail it: the result says
which shards answered. Only when none answers is the search an error.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ..config import RRF_K
from ..vocabulary import Mode
from .fusion import reciprocal_rank_fusion
from .types import QueryError, RetrievalResult, RetrievedDoc


class ShardsUnavailable(RuntimeError):
    """No shard answered: nothing to merge."""


def refusal(resp: httpx.Response) -> QueryError | None:
    """A ``/retrieve`` server's refusal of the request itself, as the :class:`QueryError` a local retriever would
    raise: 400 (the query: empty, too long) or 422 (a field out of range, e.g. ``topk`` above the server's
    ``max_k``), with the server's message. Any other server would refuse it too, so it is not a shard failure."""
    if resp.status_code not in (400, 422):
        return None
    try:
        message = resp.json().get("error", {}).get("message") or resp.text
    except (ValueError, AttributeError):
        message = resp.text
    return QueryError(f"the retrieval server refused the request ({resp.status_code}): {message}")


@dataclass(frozen=True, slots=True)
class ShardReport:
    """How one shard answered one fan-out."""

    url: str
    ok: bool
    ms: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "ok": self.ok, "ms": self.ms, "error": self.error}


def retrieve_url(url: str) -> str:
    """A server's base URL or its ``/retrieve`` URL, as the ``/retrieve`` URL."""
    url = url.rstrip("/")
    return url if url.endswith("/retrieve") else url + "/retrieve"


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


def merge(per_shard: list[list[RetrievedDoc]], mode: Mode, k: int, rrf_k: int = RRF_K) -> list[RetrievedDoc]:
    """One query's documents from every shard that answered, as one ranking of ``k`` (see the module's notes)."""
    if mode == "passage":
        seen: dict[str, RetrievedDoc] = {}
        for docs in per_shard:
            for d in docs:
                key = d.id or f"{d.title}\n{d.text}"
                if key not in seen or d.score > seen[key].score:
                    seen[key] = d
        return sorted(seen.values(), key=lambda d: -d.score)[:k]
    by_key: dict[str, RetrievedDoc] = {}
    rankings = []
    for docs in per_shard:
        keys = []
        for d in docs:
            key = d.id or f"{d.title}\n{d.text}"
            by_key.setdefault(key, d)
            keys.append(key)
        rankings.append(keys)
    fused = reciprocal_rank_fusion(rankings, rrf_k=rrf_k)[:k]
    return [RetrievedDoc(by_key[key].id, by_key[key].title, by_key[key].text, score)  # type: ignore[index]
            for key, score in fused]


class ShardedRetriever:
    """Concurrent ``/retrieve`` calls to every shard, with a timeout each, merged per query."""

    def __init__(self, urls: list[str], *, api_key: str | None = None, timeout_s: float = 5.0,
                 rrf_k: int = RRF_K) -> None:
        if not urls:
            raise ValueError("sharded retrieval needs at least one shard URL")
        self.urls = [retrieve_url(u) for u in urls]
        self.timeout_s = timeout_s
        self.rrf_k = rrf_k
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(timeout=timeout_s, headers=headers,
                                        limits=httpx.Limits(max_connections=16 * len(urls)))

    async def _one(self, url: str, queries: list[str], mode: Mode, k: int) -> tuple[list[list[RetrievedDoc]] | None,
                                                                                  ShardReport]:
        t0 = time.perf_counter()
        try:
            resp = await asyncio.wait_for(
                self.client.post(url, json={"queries": queries, "topk": k, "mode": mode, "return_scores": True}),
                self.timeout_s)
            refused = refusal(resp)
            if refused is not None:
                raise refused
            resp.raise_for_status()
            rows = resp.json()["result"]
            if len(rows) != len(queries):
                raise ValueError(f"{len(rows)} results for {len(queries)} queries")
            docs = [[parse_document(item) for item in row] for row in rows]
            return docs, ShardReport(url, True, round((time.perf_counter() - t0) * 1000, 3))
        except QueryError:
            raise
        except (httpx.HTTPError, asyncio.TimeoutError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            what = "timed out" if isinstance(exc, (asyncio.TimeoutError, TimeoutError, httpx.TimeoutException)) \
                else f"{type(exc).__name__}: {exc}"
            return None, ShardReport(url, False, round((time.perf_counter() - t0) * 1000, 3), what)

    async def search(self, queries: list[str], mode: Mode, k: int) -> tuple[list[RetrievalResult],
                                                                            list[ShardReport]]:
        """Every query's merged top ``k``, and how each shard answered. Raises :class:`ShardsUnavailable` when no
        shard answered, :class:`QueryError` when the shards refuse the query."""
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(self._one(u, queries, mode, k) for u in self.urls))
        reports = [r for _, r in answers]
        ok = [docs for docs, _ in answers if docs is not None]
        if not ok:
            raise ShardsUnavailable("no shard answered: " + "; ".join(f"{r.url} {r.error}" for r in reports))
        ms = round((time.perf_counter() - t0) * 1000, 3)
        results = [RetrievalResult(q, mode, merge([docs[i] for docs in ok], mode, k, self.rrf_k),
                                   {"shards": round(ms / len(queries), 3)}, shards=reports)
                   for i, q in enumerate(queries)]
        return results, reports

    async def aclose(self) -> None:
        await self.client.aclose()
