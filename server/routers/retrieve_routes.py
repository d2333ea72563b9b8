"""``POST /retrieve``: retrieval without the policy, Search-R1's retriever protocol plus ``mode``, admitted, timed and
cancelled with its client by :class:`server.service.Service` like every route that runs the retriever."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from routerag.retrieval.types import RetrievalResult

from ..protocol import (Document, ErrorResponse, RetrieveRequest, RetrieveResponse, ScoredDocument, ShardStageRequest,
                        ShardStageResponse, ShardStatus)
from ..service import RETRIEVE, Service, service_of
from .common import Responses, json_response, with_body


def retrieve_response(results: list[RetrievalResult], mode: str, with_scores: bool) -> RetrieveResponse:
    """Search-R1's ``result`` (documents with its ``contents`` field) plus per-query compute time."""
    rows: list[list[Any]] = []
    for res in results:
        docs = [Document(id=d.id, title=d.title, text=d.text, contents=f'"{d.title}"\n{d.text}') for d in res.docs]
        rows.append([ScoredDocument(document=doc, score=round(d.score, 6)) for doc, d in zip(docs, res.docs)]
                    if with_scores else docs)
    shards = [ShardStatus(**r.to_json()) for r in results[0].shards] if results and results[0].shards else None
    return RetrieveResponse(result=rows, ms=[r.ms for r in results], mode=mode, shards=shards)  # type: ignore[arg-type]


async def retrieve(req: RetrieveRequest, request: Request) -> Response:
    """Retrieve documents for a batch of queries without the policy (Search-R1's protocol plus `mode`)."""
    service = service_of(request)
    target = service.pick(request, req.index, route=RETRIEVE)
    mode = req.mode or service.settings.server.retrieve_mode or service.settings.retrieval.mode
    results = await service.retrieve(request, list(req.queries), mode, service.default_k(req.topk), target)
    if isinstance(results, Response):
        return results
    return json_response(retrieve_response(results, mode, req.return_scores))


SHARD_STAGE = RETRIEVE + "/shard"


async def shard_stage(req: ShardStageRequest, request: Request) -> Response:
    """One stage of a graph search over shards, asked by a sharded front server of this one (see
    ``routerag/retrieval/shard_seeds.py``): this shard's seeding candidates, or its passages ranked from the global
    seeding."""
    service = service_of(request)
    _, engine = service.pick(request, req.index, route=SHARD_STAGE)
    queries = [" ".join(q.split()) for q in req.queries]
    out = await service.call(request, RETRIEVE, SHARD_STAGE,
                             lambda: engine.shard_stage(queries, req.stage, req.seeds, req.topk), interruptible=False)
    if isinstance(out, Response):
        return out
    if req.stage == "seeds":
        return json_response(ShardStageResponse(seeds=out))
    rows = retrieve_response(out, "graph", True).result
    return json_response(ShardStageResponse(result=rows))  # type: ignore[arg-type]


def retrieve_routes(service: Service, errors: Responses) -> APIRouter:
    """``/retrieve`` with this app's request model."""
    router = APIRouter()
    retrieve_errors = {**errors, 400: {"model": ErrorResponse, "description": "A query the retriever refuses beyond "
                                                                              "what the schema states."}}
    router.add_api_route(RETRIEVE, with_body(retrieve, service.retrieve_model), methods=["POST"],
                         response_model=RetrieveResponse, responses=retrieve_errors)
    router.add_api_route(SHARD_STAGE, with_body(shard_stage, service.shard_stage_model), methods=["POST"],
                         response_model=ShardStageResponse,
                         responses=retrieve_errors)
    return router
