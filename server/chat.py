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

The request goes through the same index check, admission gate, deadline, disconnect cancellation and policy run as
``/ask`` (:class:`server.service.Service`, from the routes in :mod:`server.routers.ask_routes`): this module only
translates between the two wire formats.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic import ValidationError
from sse_starlette import ServerSentEvent

from routerag.policy.types import Summary

from .errors import APIError, stream_error
from .protocol import (AskRequest, AskResponse, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                       ChatCompletionMessage, ChatCompletionRequest, ChatDelta, ChatUsage)

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


def ask_of(req: ChatCompletionRequest, ask_model: type[AskRequest], index: str) -> AskRequest:
    """The chat request as the ``/ask`` request the policy runs, with ``/ask``'s limits (a 422 naming them)."""
    try:
        return ask_model(question=question_of(req), index=index)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'question'}: {e['msg']}" for e in exc.errors())
        raise APIError(422, "validation_error", f"the last user message as a question: {detail}") from None


def completion_body(summary: Summary, model: str, cid: str, total_ms: float) -> ChatCompletion:
    """A finished policy run as a chat completion; a refusal is OpenAI's: ``refusal`` says why, ``content`` is null."""
    ask = AskResponse.from_summary(summary, total_ms)
    usage = ChatUsage(prompt_tokens=ask.tokens.prompt, completion_tokens=ask.tokens.completion,
                      total_tokens=ask.tokens.prompt + ask.tokens.completion)
    message = (ChatCompletionMessage(content=None, refusal=ask.answer) if ask.refused
               else ChatCompletionMessage(content=ask.answer))
    return ChatCompletion(id=cid, created=int(time.time()), model=model, usage=usage, routerag=ask,
                          choices=[ChatChoice(message=message)])


def _chunk(cid: str, model: str, delta: ChatDelta | None, finish: str | None = None,
           extra: AskResponse | None = None, usage: ChatUsage | None = None) -> ServerSentEvent:
    choices = ([] if delta is None  # the usage chunk has none
               else [ChatChunkChoice(delta=delta, finish_reason=finish)])  # type: ignore[arg-type]
    c = ChatCompletionChunk(id=cid, created=int(time.time()), model=model, routerag=extra, usage=usage,
                            choices=choices)
    return ServerSentEvent(data=c.model_dump_json(exclude_none=True))


async def chunks(events: AsyncGenerator[dict[str, Any] | Summary, None], model: str, cid: str, t0: float,
                 with_usage: bool) -> AsyncIterator[ServerSentEvent]:
    """A streamed policy run (:meth:`server.service.Service.events`) as chat completion chunks: the role, the
    reasoning while it works, the answer (or refusal), the finish with ``routerag``, the usage if asked, ``[DONE]``;
    a failure as one error object instead of the rest."""
    yield _chunk(cid, model, ChatDelta(role="assistant", content=""))
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Summary):
                    done = completion_body(event, model, cid, (time.perf_counter() - t0) * 1000)
                elif line := reasoning_line(event):
                    yield _chunk(cid, model, ChatDelta(reasoning_content=line))
    except Exception as exc:
        yield ServerSentEvent(data=json.dumps(stream_error(exc, "a streamed chat completion")))
        return
    message = done.choices[0].message
    if message.refusal:
        yield _chunk(cid, model, ChatDelta(refusal=message.refusal))
    elif message.content:
        yield _chunk(cid, model, ChatDelta(content=message.content))
    yield _chunk(cid, model, ChatDelta(), finish="stop", extra=done.routerag)
    if with_usage:  # OpenAI's form: a chunk of its own, with no choices
        yield _chunk(cid, model, None, usage=done.usage)
    yield ServerSentEvent(data="[DONE]")
