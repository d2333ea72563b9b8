"""Sharded retrieval: one query batch fanned out over the ``/retrieve`` of several shard servers, merged into one
ranking per query.

Each shard is a ``routerag serve`` over one part of the corpus (any server that speaks the ``/retrieve`` protocol
works). The merge follows what the scores mean:

* ``passage``: every shard scores with the same embedder and the same inner product, so the scores are comparable:
  the shards' lists are merged by score, and the top k of the union is exactly the unsharded top k (each shard
  returns its own top k, which contains every document of the global top k that it holds).
* ``graph`` and ``hybrid``: a Personalized PageRank score is a probability mass within one shard's graph, seeded
  from that shard's own best facts and passages, so it does not compare across shards. Shards that serve
  ``/retrieve/shard`` (RouteRAG servers) are searched in two stages with one global seeding
  (:mod:`~routerag.retrieval.shard_seeds`): every shard reports its seeding candidates, the seeding one index would
  make is sent to every shard, and their PageRank masses, scaled by the seed mass each holds, are merged by score;
  ``hybrid`` then fuses the merged passage and graph lists as one index does. Other ``/retrieve`` servers get the
  rank-only merge: their rankings fused by Reciprocal Rank Fusion
  (:func:`~routerag.retrieval.fusion.reciprocal_rank_fusion`). A fact that links passages on two shards is seen by
  neither unless a shard holds both: split the corpus along the graph (``routerag build-graph --shards N``), whose
  shards also hold a halo of their neighbours' linked passages (a passage several shards return is kept once, at
  its highest score), and ``benchmarks/shards.py`` measures what remains.

A shard that fails or does not answer within the timeout degrades the result, it does not fail it: the result says
which shards answered. Only when none answers is the search an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ..config import RRF_K, RetrievalConfig
from ..vocabulary import Mode
from .fusion import reciprocal_rank_fusion
from .shard_seeds import global_seeds
from .types import QueryError, RetrievalResult, RetrievedDoc

log = logging.getLogger(__name__)

SEEDED_CHUNK = 16
"""Queries per two-stage request (about 1 KB of seeds each, well inside a shard's 64 KiB body limit)."""


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


def merge_by_score(per_shard: list[list[RetrievedDoc]], k: int) -> list[RetrievedDoc]:
    """The top ``k`` of every shard's documents by score (scores that compare across shards)."""
    seen: dict[str, RetrievedDoc] = {}
    for docs in per_shard:
        for d in docs:
            key = d.id or f"{d.title}\n{d.text}"
            if key not in seen or d.score > seen[key].score:
                seen[key] = d
    return sorted(seen.values(), key=lambda d: -d.score)[:k]


def merge(per_shard: list[list[RetrievedDoc]], mode: Mode, k: int, rrf_k: int = RRF_K) -> list[RetrievedDoc]:
    """One query's documents from every shard that answered, as one ranking of ``k``: by score for ``passage``,
    by rank (RRF) otherwise (see the module's notes)."""
    if mode == "passage":
        return merge_by_score(per_shard, k)
    return fuse([[d for d in docs] for docs in per_shard], k, rrf_k)


def fuse(lists: list[list[RetrievedDoc]], k: int, rrf_k: int = RRF_K) -> list[RetrievedDoc]:
    """Rankings fused by Reciprocal Rank Fusion into one of ``k``, each document scored by its RRF score."""
    by_key: dict[str, RetrievedDoc] = {}
    rankings = []
    for docs in lists:
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
                 rrf_k: int | None = None, cfg: RetrievalConfig | None = None) -> None:
        if not urls:
            raise ValueError("sharded retrieval needs at least one shard URL")
        self.urls = [retrieve_url(u) for u in urls]
        self.timeout_s = timeout_s
        self.cfg = cfg or RetrievalConfig()
        self.rrf_k = rrf_k if rrf_k is not None else self.cfg.rrf_k
        self.seeded: bool | None = None
        """Whether the shards serve ``/retrieve/shard`` (None until a graph search finds out)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(timeout=timeout_s, headers=headers,
                                        limits=httpx.Limits(max_connections=16 * len(urls)))

    async def _call(self, url: str, body: dict[str, Any], n: int, key: str) -> tuple[list[Any] | None, ShardReport]:
        """One POST to one shard: the ``key`` list of its JSON answer (``n`` rows), or None and why it failed."""
        t0 = time.perf_counter()
        try:
            resp = await asyncio.wait_for(self.client.post(url, json=body), self.timeout_s)
            refused = refusal(resp)
            if refused is not None:
                raise refused
            resp.raise_for_status()
            rows = resp.json()[key]
            if len(rows) != n:
                raise ValueError(f"{len(rows)} results for {n} queries")
            return rows, ShardReport(url, True, round((time.perf_counter() - t0) * 1000, 3))
        except QueryError:
            raise
        except (httpx.HTTPError, asyncio.TimeoutError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            what = "timed out" if isinstance(exc, (asyncio.TimeoutError, TimeoutError, httpx.TimeoutException)) \
                else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 404:
                what = "not found (404)"
            return None, ShardReport(url, False, round((time.perf_counter() - t0) * 1000, 3), what)

    async def _one(self, url: str, queries: list[str], mode: Mode, k: int) -> tuple[list[list[RetrievedDoc]] | None,
                                                                                  ShardReport]:
        body = {"queries": queries, "topk": k, "mode": mode, "return_scores": True}
        rows, report = await self._call(url, body, len(queries), "result")
        return (None if rows is None else [[parse_document(item) for item in row] for row in rows]), report

    async def _fan_out(self, queries: list[str], mode: Mode, k: int) -> tuple[list[list[list[RetrievedDoc]]],
                                                                             list[ShardReport]]:
        """Every shard's ``/retrieve`` answer (those that answered) and how each shard answered."""
        answers = await asyncio.gather(*(self._one(u, queries, mode, k) for u in self.urls))
        reports = [r for _, r in answers]
        ok = [docs for docs, _ in answers if docs is not None]
        if not ok:
            raise ShardsUnavailable("no shard answered: " + "; ".join(f"{r.url} {r.error}" for r in reports))
        return ok, reports

    async def search(self, queries: list[str], mode: Mode, k: int) -> tuple[list[RetrievalResult],
                                                                            list[ShardReport]]:
        """Every query's merged top ``k``, and how each shard answered. Raises :class:`ShardsUnavailable` when no
        shard answered, :class:`QueryError` when the shards refuse the query."""
        t0 = time.perf_counter()
        merged = None
        if mode != "passage" and self.seeded is not False:
            merged = await self._seeded_in_chunks(queries, mode, k)
        if merged is None:
            ok, reports = await self._fan_out(queries, mode, k)
            merged = [merge([docs[i] for docs in ok], mode, k, self.rrf_k) for i in range(len(queries))], reports
        lists, reports = merged
        ms = round((time.perf_counter() - t0) * 1000, 3)
        results = [RetrievalResult(q, mode, lists[i], {"shards": round(ms / len(queries), 3)}, shards=reports)
                   for i, q in enumerate(queries)]
        return results, reports

    async def _seeded_in_chunks(self, queries: list[str], mode: Mode, k: int
                                ) -> tuple[list[list[RetrievedDoc]], list[ShardReport]] | None:
        """:meth:`_seeded_search` over chunks of :data:`SEEDED_CHUNK` queries, concurrently: a stage's body grows
        with its seeds, and a shard refuses bodies over its ``server.max_body_bytes`` (64 KiB by default)."""
        if len(queries) <= SEEDED_CHUNK:
            return await self._seeded_search(queries, mode, k)
        parts = await asyncio.gather(*(self._seeded_search(queries[i:i + SEEDED_CHUNK], mode, k)
                                       for i in range(0, len(queries), SEEDED_CHUNK)))
        if any(p is None for p in parts):
            return None
        done = [p for p in parts if p is not None]
        lists = [row for p in done for row in p[0]]
        reports = [ShardReport(r.url, all(p[1][i].ok for p in done), max(p[1][i].ms for p in done),
                               next((p[1][i].error for p in done if not p[1][i].ok), None))
                   for i, r in enumerate(done[0][1])]
        return lists, reports

    async def _seeded_search(self, queries: list[str], mode: Mode, k: int
                             ) -> tuple[list[list[RetrievedDoc]], list[ShardReport]] | None:
        """A graph (or hybrid) search in two stages with one global seeding (see the module's notes); None when the
        shards do not serve ``/retrieve/shard``, so the caller falls back to the rank-only merge."""
        depth = k * self.cfg.rrf_depth if mode == "hybrid" else k
        stage = [u + "/shard" for u in self.urls]
        first = asyncio.ensure_future(self._fan_out(queries, "passage", depth)) if mode == "hybrid" else None
        try:
            cands = await asyncio.gather(*(self._call(u, {"queries": queries, "stage": "seeds"}, len(queries),
                                                      "seeds") for u in stage))
            if self.seeded is None and any(r.error == "not found (404)" for _, r in cands):
                self.seeded = False
                log.warning("a shard does not serve /retrieve/shard; graph results are merged by rank (RRF)")
                return None
            self.seeded = True
            reports = [ShardReport(u, r.ok, r.ms, r.error) for u, (_, r) in zip(self.urls, cands)]
            ok = [i for i, (rows, _) in enumerate(cands) if rows is not None]
            if not ok:
                raise ShardsUnavailable("no shard answered: " + "; ".join(f"{r.url} {r.error}" for r in reports))
            seeds = [s.to_json() for s in global_seeds([cands[i][0] for i in ok], self.cfg)]  # type: ignore[misc]
            body = {"queries": queries, "stage": "rank", "seeds": seeds, "topk": depth}
            ranked = await asyncio.gather(*(self._call(stage[i], body, len(queries), "result") for i in ok))
            for i, (_, r) in zip(ok, ranked):
                reports[i] = ShardReport(self.urls[i], r.ok, round(reports[i].ms + r.ms, 3), r.error)
            answered = [rows for rows, _ in ranked if rows is not None]
            if not answered:
                raise ShardsUnavailable("no shard answered: " + "; ".join(f"{r.url} {r.error}" for r in reports))
            graph = [merge_by_score([[parse_document(d) for d in rows[q]] for rows in answered], depth)
                     for q in range(len(queries))]
            if first is None:
                return graph, reports
            passages, passage_reports = await first
            first = None
        finally:
            if first is not None:
                first.cancel()
        reports = [r if p.ok else p for r, p in zip(reports, passage_reports)]
        return [fuse([merge_by_score([docs[q] for docs in passages], depth), graph[q]], k, self.rrf_k)
                for q in range(len(queries))], reports

    async def aclose(self) -> None:
        await self.client.aclose()
