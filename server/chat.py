"""OpenAI-compatible chat: ``POST /v1/chat/completions`` and ``GET /v1/models``, so the OpenAI SDK, chat UIs and agent
frameworks use the routing policy unchanged.

The policy answers the last user message; ``model`` names the index (``GET /v1/models`` lists those the key may use);
the API key is the usual Bearer token. The reply is an ordinary chat completion whose extension field ``routerag``
carries the whole ``/ask`` answer: trace, searches, citations, timings. Streamed, the policy's thoughts and searches
arrive as ``reasoning_content`` deltas while it works (the field reasoning models use), then the answer as
``content`` (or, for a refusal, ``refusal``), then a chunk with ``finish_reason`` and ``routerag``, with
``stream_options.include_usage`` one more with ``usage`` and no choices, then ``data: [DONE]``. Parameters the policy
cannot honour (``n > 1``, ``tools``, ``response_format``, ``logprobs``) are a 400 in OpenAI's error shape, naming the
``param``.

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

from .errors import APIError, error_body
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


def unsupported(req: ChatCompletionRequest) -> APIError | None:
    """The first parameter the policy cannot honour, as the 400 OpenAI's API answers one a model does not support
    (a client that asked for two choices, a tool call or JSON must not get one plain answer it did not ask for)."""
    def refuse(param: str, message: str, code: str = "unsupported_parameter") -> APIError:
        return APIError(400, "invalid_request_error", f"{message} (the routing policy gives one plain-text answer)",
                        param=param, code=code)

    if req.n is not None and req.n != 1:
        return refuse("n", f"n={req.n}: only one choice per request is supported", "unsupported_value")
    if req.tools:
        return refuse("tools", "'tools' is not supported: the policy calls no tools")
    if req.tool_choice not in (None, "none"):
        return refuse("tool_choice", "'tool_choice' is not supported: the policy calls no tools")
    for name in ("functions", "function_call", "audio", "prediction"):
        if (req.model_extra or {}).get(name) is not None:
            return refuse(name, f"'{name}' is not supported")
    modalities = (req.model_extra or {}).get("modalities")
    if modalities not in (None, ["text"]):
        return refuse("modalities", f"modalities={modalities!r}: only ['text'] is supported", "unsupported_value")
    if req.response_format and req.response_format.get("type", "text") != "text":
        return refuse("response_format", f"response_format type {req.response_format.get('type')!r}: only "
                                         "'text' is supported", "unsupported_value")
    if req.logprobs:
        return refuse("logprobs", "'logprobs' is not supported: the answer is read from documents, not sampled")
    if req.top_logprobs is not None:
        return refuse("top_logprobs", "'top_logprobs' is not supported")
    if req.stream_options is not None and not req.stream:
        return refuse("stream_options", "'stream_options' is only allowed when 'stream' is true", "invalid_value")
    return None


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
    if kind == "draft" and event.get("text"):  # labelled: the final answer, which a reader may have rewritten
        return f"[draft answer] {event['text']}\n"  # (none when the reader writes it: the draft stops at its start)
    return None


def chat_routes(*, pick: Callable[..., tuple[str, Any]], readable: Callable[[Request], list[str]],
                admit: Callable[..., Any], run_ask: Callable[..., Any], answer: Callable[..., Any], ask_model: type,
                errors: dict[int | str, dict[str, Any]], timeout_s: float) -> APIRouter:
    router = APIRouter()

    def completion_body(summary: Summary, model: str, cid: str, total_ms: float) -> ChatCompletion:
        ask = AskResponse.from_summary(summary, total_ms)
        usage = ChatUsage(prompt_tokens=ask.tokens.prompt, completion_tokens=ask.tokens.completion,
                          total_tokens=ask.tokens.prompt + ask.tokens.completion)
        # a refusal is OpenAI's: `refusal` says why and `content` is null
        message = (ChatCompletionMessage(content=None, refusal=ask.answer) if ask.refused
                   else ChatCompletionMessage(content=ask.answer))
        return ChatCompletion(id=cid, created=int(time.time()), model=model, usage=usage, routerag=ask,
                              choices=[ChatChoice(message=message)])

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
        question. Sampling fields are accepted and ignored (the server's policy settings apply); `n > 1`, `tools`,
        `response_format` other than text and `logprobs` are a 400 naming the parameter. A refusal (the documents
        do not answer) comes as `message.refusal` with a null `content`."""
        t0 = time.perf_counter()
        target = pick(request, body.model, route=CHAT_PATH)
        refused = unsupported(body)
        if refused is not None:
            raise refused
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
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventSourceResponse(stream(ask, slot, deadline, target, body.model, cid, t0, usage))

    async def stream(ask: Any, slot: Any, deadline: float, target: tuple[str, Any], model: str, cid: str,
                     t0: float, with_usage: bool) -> AsyncIterator[ServerSentEvent]:
        def chunk(delta: ChatDelta | None, finish: str | None = None, extra: AskResponse | None = None,
                  usage: ChatUsage | None = None) -> ServerSentEvent:
            choices = ([] if delta is None  # the usage chunk has none
                       else [ChatChunkChoice(delta=delta, finish_reason=finish)])  # type: ignore[arg-type]
            c = ChatCompletionChunk(id=cid, created=int(time.time()), model=model, routerag=extra, usage=usage,
                                    choices=choices)
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
                yield ServerSentEvent(data=json.dumps(error_body("internal_error", f"internal server error "
                                                                                  f"({type(exc).__name__})")))
                return
            done = completion_body(summary, model, cid, (time.perf_counter() - t0) * 1000)
            message = done.choices[0].message
            if message.refusal:
                yield chunk(ChatDelta(refusal=message.refusal))
            elif message.content:
                yield chunk(ChatDelta(content=message.content))
            yield chunk(ChatDelta(), finish="stop", extra=done.routerag)
            if with_usage:  # OpenAI's form: a chunk of its own, with no choices
                yield chunk(None, usage=done.usage)
            yield ServerSentEvent(data="[DONE]")
        finally:
            if not task.done():
                task.cancel()
            slot.release()

    return router
