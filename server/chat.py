"""OpenAI-compatible chat: ``POST /v1/chat/completions`` and ``GET /v1/models``, so the OpenAI SDK, chat UIs and agent
frameworks use the routing policy unchanged.

The policy answers the last user message; ``model`` names the index (``GET /v1/models`` lists those the key may use);
the API key is the usual Bearer token. The reply is an ordinary chat completion whose extension field ``routerag``
carries the whole ``/ask`` answer: trace, searches, citations, timings. Streamed, the policy's thoughts and searches
arrive as ``reasoning_content`` deltas while it works (the field reasoning models use), then the answer as
``content``, then a last chunk with ``finish_reason`` and ``routerag``, then ``data: [DONE]``.

The request goes through the same index check, admission gate, deadline and policy run as ``/ask`` (the callables
``create_app`` passes in): this module only translates between the two wire formats.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent

from routerag.policy.types import Summary

from .errors import APIError
from .protocol import (AskResponse, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                       ChatCompletionMessage, ChatCompletionRequest, ChatDelta, ChatUsage, ModelCard, ModelList)

log = logging.getLogger(__name__)
CHAT_PATH = "/v1/chat/completions"
STARTED = int(time.time())


def question_of(req: ChatCompletionRequest) -> str:
    """The last user message's text: what the policy answers (earlier turns are the client's history)."""
    for message in reversed(req.messages):
        if message.role == "user" and message.text().strip():
            return message.text()
    raise APIError(422, "validation_error", "messages: no user message with text to answer")


def reasoning_line(event: dict[str, Any]) -> str | None:
    """A loop event as a line of the streamed reasoning, or None for events that have none."""
    kind = event.get("type")
    if kind == "think" and event.get("text"):
        return f"{event['text']}\n"
    if kind == "search":
        return f"[search {event['mode']}] {event['query']}\n"
    if kind == "information":
        titles = "; ".join(d["title"] for d in event.get("docs", []))
        return f"({len(event.get('docs', []))} documents: {titles})\n"
    return None


def chat_routes(*, pick: Callable[..., tuple[str, Any]], readable: Callable[[Request], list[str]],
                admit: Callable[..., Any], run_ask: Callable[..., Any], answer: Callable[..., Any], ask_model: type,
                errors: dict[int | str, dict[str, Any]], timeout_s: float) -> APIRouter:
    router = APIRouter()

    def completion_body(summary: Summary, model: str, cid: str, total_ms: float) -> ChatCompletion:
        ask = AskResponse.from_summary(summary, total_ms)
        usage = ChatUsage(prompt_tokens=ask.tokens.prompt, completion_tokens=ask.tokens.completion,
                          total_tokens=ask.tokens.prompt + ask.tokens.completion)
        return ChatCompletion(id=cid, created=int(time.time()), model=model, usage=usage, routerag=ask,
                              choices=[ChatChoice(message=ChatCompletionMessage(content=ask.answer))])

    @router.get("/v1/models", response_model=ModelList, responses={k: v for k, v in errors.items() if k == 401})
    async def models(request: Request) -> ModelList:
        """The indexes this key may use, as OpenAI models: pass one as `model` to `/v1/chat/completions`."""
        return ModelList(data=[ModelCard(id=name, created=STARTED) for name in readable(request)])

    @router.post(CHAT_PATH, response_model=ChatCompletion, responses={
        **errors, 200: {"description": "A chat completion with the extension field `routerag` (the `/ask` answer); "
                                       "with `stream: true`, Server-Sent Events of chat completion chunks, then "
                                       "`[DONE]`.",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        """OpenAI's chat completion over the routing policy: `model` is the index, the last user message the
        question. Sampling fields are accepted and ignored (the server's policy settings apply)."""
        t0 = time.perf_counter()
        target = pick(request, body.model, route=CHAT_PATH)
        try:
            ask = ask_model(question=question_of(body), index=target[0])
        except ValidationError as exc:
            detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'question'}: {e['msg']}" for e in exc.errors())
            raise APIError(422, "validation_error", f"the last user message as a question: {detail}") from None
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if not body.stream:  # admitted, run and cancelled with its client as /ask is
            summary = await answer(request, ask, target, CHAT_PATH)
            if isinstance(summary, Response):
                return summary
            payload = completion_body(summary, body.model, cid, (time.perf_counter() - t0) * 1000)
            return Response(payload.model_dump_json(), media_type="application/json")
        deadline = asyncio.get_running_loop().time() + timeout_s
        slot = await admit("/ask", deadline)
        return EventSourceResponse(stream(ask, slot, deadline, target, body.model, cid, t0))

    async def stream(ask: Any, slot: Any, deadline: float, target: tuple[str, Any], model: str, cid: str,
                     t0: float) -> AsyncIterator[ServerSentEvent]:
        def chunk(delta: ChatDelta, finish: str | None = None, extra: AskResponse | None = None) -> ServerSentEvent:
            c = ChatCompletionChunk(id=cid, created=int(time.time()), model=model, routerag=extra,
                                    choices=[ChatChunkChoice(delta=delta, finish_reason=finish)])  # type: ignore[arg-type]
            return ServerSentEvent(data=c.model_dump_json(exclude_none=True))

        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        task = asyncio.ensure_future(run_ask(ask, slot, deadline, on_event=queue.put_nowait, target=target))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            yield chunk(ChatDelta(role="assistant", content=""))
            while (event := await queue.get()) is not None:
                line = reasoning_line(event)
                if line:
                    yield chunk(ChatDelta(reasoning_content=line))
            try:
                summary = task.result()
            except APIError as exc:
                yield ServerSentEvent(data=json.dumps(exc.body()))
                return
            except Exception as exc:
                log.error("internal error in a streamed chat completion", exc_info=exc)
                yield ServerSentEvent(data=json.dumps({"error": {"type": "internal_error",
                                                                 "message": f"internal server error "
                                                                            f"({type(exc).__name__})"}}))
                return
            done = completion_body(summary, model, cid, (time.perf_counter() - t0) * 1000)
            if done.routerag.answer:
                yield chunk(ChatDelta(content=done.routerag.answer))
            yield chunk(ChatDelta(), finish="stop", extra=done.routerag)
            yield ServerSentEvent(data="[DONE]")
        finally:
            if not task.done():
                task.cancel()
            slot.release()

    return router
