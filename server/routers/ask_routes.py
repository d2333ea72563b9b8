"""The routes that run the policy: ``POST /ask`` (JSON, or Server-Sent Events with ``stream: true``) and the
OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models`` (:mod:`server.chat` translates). Each picks
the index, then leaves admission, the deadline, cancellation and the run to :class:`server.service.Service`."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from routerag.engine import Engine
from routerag.policy.types import Summary

from ..cancellation import client_left
from ..chat import CHAT_PATH, STARTED, ask_of, chunks, completion_body, unsupported
from ..errors import stream_error
from ..metrics import DISCONNECTED_STATE
from ..protocol import (STREAM_EVENTS, AskRequest, AskResponse, ChatCompletion, ChatCompletionRequest, ModelCard,
                        ModelList)
from ..service import ASK, Service, service_of
from .common import Responses, json_response, only, with_body

log = logging.getLogger(__name__)


async def ask(req: AskRequest, request: Request) -> Any:
    """Answer a question with the routing policy: it reasons, searches (passage, graph or both) and answers."""
    t0 = time.perf_counter()
    service = service_of(request)
    target = service.pick(request, req.index, route=ASK)
    if req.stream:
        return await _streamed(service, request, req, target, t0)
    summary = await service.answer(request, req, target, ASK)
    if isinstance(summary, Response):
        return summary
    return json_response(AskResponse.from_summary(summary, (time.perf_counter() - t0) * 1000))


async def _streamed(service: Service, request: Request, req: AskRequest, target: tuple[str, Engine],
                    t0: float) -> Response:
    deadline = service.deadline()
    slot = await service.admit(request, ASK, deadline)
    if slot is None:
        return client_left(request, ASK)
    ended = {"yes": False}
    return EventSourceResponse(_ask_events(service.events(req, target, slot, deadline), t0, ended),
                               client_close_handler_callable=_on_close(request, ended),
                               background=BackgroundTask(slot.release))


async def _ask_events(events: AsyncGenerator[dict[str, Any] | Summary, None], t0: float,
                      ended: dict[str, bool]) -> AsyncIterator[ServerSentEvent]:
    """One SSE per loop event (think, search, information, draft, answer), then ``done`` with the full
    AskResponse, or ``error`` with an error body. ``ended["yes"]`` is set once the last event was sent: a disconnect
    after it is the normal end of a stream."""
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Summary):
                    payload = AskResponse.from_summary(event, (time.perf_counter() - t0) * 1000)
                    yield ServerSentEvent(data=payload.model_dump_json(), event="done")
                elif event.get("type") != "done":  # replaced by the full payload
                    yield ServerSentEvent(data=json.dumps(event, ensure_ascii=False), event=str(event.get("type")))
    except Exception as exc:
        yield ServerSentEvent(data=json.dumps(stream_error(exc, "a streamed /ask")), event="error")
    ended["yes"] = True


def _on_close(request: Request, ended: dict[str, bool]) -> Any:
    """Called by the SSE response when its client leaves: before the last event, that is a client disconnect
    (499), not the 200 the stream's headers carried. (The server also reports a disconnect once a complete
    response has been sent, racing the stream's own end: that one is ignored.)"""
    async def on_close(_: Any) -> None:
        if ended["yes"]:
            return
        setattr(request.state, DISCONNECTED_STATE, True)
        service_of(request).metrics.errors.labels(ASK, "client_disconnected").inc()
        log.info("a streamed /ask lost its client before the end of the stream")

    return on_close


async def models(request: Request) -> ModelList:
    """The indexes this key may use, as OpenAI models: pass one as `model` to `/v1/chat/completions`."""
    return ModelList(data=[ModelCard(id=name, created=STARTED) for name in service_of(request).readable(request)])


async def chat(body: ChatCompletionRequest, request: Request) -> Any:
    """OpenAI's chat completion over the routing policy: `model` is the index, the last user message the
    question. Sampling fields are accepted and ignored (the server's policy settings apply); `n > 1`, `tools`,
    `response_format` other than text and `logprobs` are a 400 naming the parameter. A refusal (the documents
    do not answer) comes as `message.refusal` with a null `content`."""
    t0 = time.perf_counter()
    service = service_of(request)
    target = service.pick(request, body.model, route=CHAT_PATH)
    refused = unsupported(body)
    if refused is not None:
        raise refused
    req = ask_of(body, service.ask_model, target[0])
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    if body.stream:
        deadline = service.deadline()
        slot = await service.admit(request, ASK, deadline)
        if slot is None:
            return client_left(request, CHAT_PATH)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventSourceResponse(chunks(service.events(req, target, slot, deadline), body.model, cid, t0, usage))
    summary = await service.answer(request, req, target, CHAT_PATH)
    if isinstance(summary, Response):
        return summary
    return json_response(completion_body(summary, body.model, cid, (time.perf_counter() - t0) * 1000))


def stream_item_schema() -> dict[str, Any]:
    """The OpenAPI ``itemSchema`` (3.2's form for event streams, which FastAPI also emits) of a streamed ``/ask``: one
    alternative per event name, its ``data`` the JSON of that event's model."""
    return {"oneOf": [
        {"type": "object", "required": ["event", "data"],
         "properties": {"event": {"const": name},
                        "data": {"type": "string", "contentMediaType": "application/json",
                                 "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
        for name, model in STREAM_EVENTS.items()]}


def ask_routes(service: Service, errors: Responses) -> APIRouter:
    """``/ask``, ``/v1/models`` and ``/v1/chat/completions``, ``/ask`` with this app's request model."""
    router = APIRouter()
    router.add_api_route(ASK, with_body(ask, service.ask_model), methods=["POST"], response_model=AskResponse,
                         responses={**errors, 200: {
                             "description": "The answer and its trace; with `stream: true`, Server-Sent Events "
                                            "(think, search, information, `draft`: the policy's own answer, "
                                            "`answer`: the final one, then `done` carrying this same object, or "
                                            "`error` carrying an error object): the `itemSchema` names each event "
                                            "and the model of its JSON data.",
                             "content": {"text/event-stream": {"schema": {"type": "string"},
                                                               "itemSchema": stream_item_schema()}}}})
    router.add_api_route("/v1/models", models, methods=["GET"], response_model=ModelList, responses=only(errors, 401))
    router.add_api_route(CHAT_PATH, chat, methods=["POST"], response_model=ChatCompletion, responses={
        **errors, 200: {"description": "A chat completion with the extension field `routerag` (the `/ask` answer); "
                                       "with `stream: true`, Server-Sent Events of chat completion chunks, then "
                                       "`[DONE]`.",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
    return router
