"""A real, local OpenAI-compatible HTTP server for tests, whose answers the test scripts.

Code under test talks to it exactly as to ``vllm serve`` or OpenAI (real sockets, real ``openai``/``httpx``
clients, real retries and timeouts), while a Python callable decides every reply, so tests can script good answers,
garbage, truncated JSON, slow answers and HTTP errors.

Usage::

    from tests.helpers.fake_openai import FakeOpenAIServer, Reply

    def handler(req: dict) -> Reply | str | tuple[str, str]:
        # ``req`` is the request JSON (chat: "messages"; completions: "prompt", always a single string here)
        if "boom" in last_user_message(req):
            return Reply(status=500, error="scripted failure")
        return Reply(text='{"answer": 42}', finish_reason="stop", delay_s=0.1)

    with FakeOpenAIServer(handler) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")
        ...
        assert server.requests[0].path == "/v1/chat/completions"

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``prompt`` may be a list: the handler is called
once per prompt), ``POST /v1/embeddings`` (deterministic bag-of-words vectors, :func:`fake_embedding`; no handler),
``GET /v1/models``. ``FakeOpenAIServer(api_key=...)`` answers 401 to requests without ``Authorization: Bearer
<key>``, as OpenAI and ``vllm serve --api-key`` do. ``Reply(raw=...)`` sends a body that is not a completion
(garbage, or ``{"choices": []}``) to test how callers survive it. Also supported: ``n`` (the handler is called ``n`` times), ``stop`` (the
scripted text is cut at the earliest stop string and finish_reason becomes "stop", as OpenAI and vLLM do; with
``keep_stop=True`` the stop string stays in the text, as ``transformers serve`` does), ``usage``
(whitespace-word counts unless the reply sets them), ``stream`` (server-sent events: one content chunk, one chunk
with the finish reason, a usage chunk when ``stream_options.include_usage``, then ``[DONE]``).

The handler runs in a worker thread, so a handler that ``time.sleep``s does not block other requests; prefer
``Reply(delay_s=...)``, which sleeps without holding a thread. A handler that raises produces an HTTP 500 whose
message is the exception. ``server.handler`` may be reassigned between requests; ``server.reset()`` also clears the
request log. :func:`fake_openai` is a pytest fixture (import it into a test module to use it).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

DEFAULT_MODEL = "fake-model"


@dataclass
class Reply:
    """One scripted answer. ``status`` other than 200 sends an OpenAI-style error body with ``error`` as message."""

    text: str = ""
    finish_reason: str = "stop"
    status: int = 200
    error: str | None = None
    delay_s: float = 0.0
    """Sleep this long (asynchronously) before answering: slow servers, timeouts, concurrency checks."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers, e.g. ``{"retry-after-ms": "1"}`` to make the client's retries of an error fast."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    choice_extra: dict[str, Any] = field(default_factory=dict)
    """Merged into the choice object (e.g. ``{"logprobs": {...}}`` or ``{"stop_reason": ...}``)."""
    raw: str | dict[str, Any] | None = None
    """Sent as the whole 200 response instead of a completion: a dict as JSON (e.g. ``{"choices": []}``), a string
    as is with a JSON content type (garbage), even when the request asked for a stream."""


HandlerResult = Union[Reply, str, "tuple[str, str]"]
Handler = Callable[[dict[str, Any]], HandlerResult]


@dataclass
class RecordedRequest:
    path: str
    body: dict[str, Any]


def last_user_message(req: dict[str, Any]) -> str:
    """The content of the last user message of a chat request (or the prompt of a completion request)."""
    if "messages" not in req:
        p = req.get("prompt", "")
        return p if isinstance(p, str) else json.dumps(p)
    for m in reversed(req["messages"]):
        if m.get("role") == "user":
            return _content_text(m.get("content"))
    return ""


def echo_handler(req: dict[str, Any]) -> Reply:
    """The default: answer with the last user message (or the prompt)."""
    return Reply(text=last_user_message(req))


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for "server down" tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _words(text: str) -> int:
    return len(text.split())


EMBEDDING_DIM = 32


def fake_embedding(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic vector: each lower-cased word adds 1 to a bucket chosen by its CRC32, so texts that share
    words are similar (enough for retrieval over a small corpus to rank sensibly)."""
    vec = [0.0] * dim
    for word in text.lower().split():
        vec[zlib.crc32(word.strip(".,;:!?\"'()").encode()) % dim] += 1.0
    if not any(vec):
        vec[0] = 1.0
    return vec


def _apply_stop(text: str, finish_reason: str, stop: Any, keep: bool = False) -> tuple[str, str]:
    stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str) and s]
    hits = [(i, s) for s in stops if s and (i := text.find(s)) >= 0]
    if hits:
        i, s = min(hits)
        return text[:i + len(s) if keep else i], "stop"
    return text, finish_reason


def _normalise(result: HandlerResult) -> Reply:
    if isinstance(result, Reply):
        return result
    if isinstance(result, str):
        return Reply(text=result)
    if isinstance(result, tuple) and len(result) == 2:
        return Reply(text=result[0], finish_reason=result[1])
    raise TypeError(f"handler returned {type(result).__name__}; expected Reply, str or (text, finish_reason)")


def _error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
            429: "RateLimitError"}.get(status, "InternalServerError" if status >= 500 else "APIError")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status, headers=headers or {})


class FakeOpenAIServer:
    """The server; a context manager (``with FakeOpenAIServer(handler) as s:``) or ``start()`` / ``stop()``.

    ``models``: the model ids served. ``None`` (default) accepts any model name and lists :data:`DEFAULT_MODEL`;
    a list makes requests for other models fail with 404 "model does not exist", like vLLM.
    """

    def __init__(self, handler: Handler | None = None, *, models: Sequence[str] | None = None,
                 host: str = "127.0.0.1", api_key: str | None = None, keep_stop: bool = False) -> None:
        self.handler: Handler = handler or echo_handler
        self.models = list(models) if models is not None else None
        self.api_key = api_key
        self.keep_stop = keep_stop
        """Keep the stop string that fired in the text, as ``transformers serve`` does (OpenAI and vLLM cut it)."""
        self.host = host
        self.port: int | None = None
        self.requests: list[RecordedRequest] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._build_app()

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """What to give an OpenAI client as ``base_url`` (ends in ``/v1``)."""
        if self.port is None:
            raise RuntimeError("the fake OpenAI server is not running")
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 10.0) -> FakeOpenAIServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"fake-openai-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None
        self.port = None

    def reset(self, handler: Handler | None = None) -> None:
        """Forget the recorded requests and install ``handler`` (the echo handler if ``None``)."""
        self.requests.clear()
        self.handler = handler or echo_handler

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the app ------------------------------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def require_key(request: Request, call_next: Any) -> Any:
            if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
                self.requests.append(RecordedRequest(request.url.path, {"refused": "api key"}))
                return _error_response(401, "Incorrect API key provided.")
            return await call_next(request)

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(RecordedRequest(request.url.path, body))
            texts = body.get("input")
            texts = [texts] if isinstance(texts, str) else list(texts or [])
            data = [{"object": "embedding", "index": i, "embedding": fake_embedding(t)} for i, t in enumerate(texts)]
            n = sum(_words(t) for t in texts)
            return JSONResponse({"object": "list", "data": data, "model": body.get("model", DEFAULT_MODEL),
                                 "usage": {"prompt_tokens": n, "total_tokens": n}})

        @app.get("/v1/models")
        async def list_models() -> JSONResponse:
            ids = self.models if self.models is not None else [DEFAULT_MODEL]
            return JSONResponse({"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake-openai"} for m in ids]})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await self._complete(request, chat=True)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await self._complete(request, chat=False)

        return app

    async def _complete(self, request: Request, *, chat: bool) -> Any:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error_response(400, "request body is not JSON")
        self.requests.append(RecordedRequest(request.url.path, body))
        model = body.get("model", DEFAULT_MODEL)
        if self.models is not None and model not in self.models:
            return _error_response(404, f"The model `{model}` does not exist.")
        if chat:
            if not isinstance(body.get("messages"), list):
                return _error_response(400, "'messages' must be a list")
            calls = [body]
        else:
            prompt = body.get("prompt")
            prompts = prompt if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) else [prompt]
            calls = [{**body, "prompt": p} for p in prompts]
        n = int(body.get("n") or 1)

        replies: list[Reply] = []
        for req in calls:
            for _ in range(n):
                try:
                    replies.append(_normalise(await run_in_threadpool(self.handler, req)))
                except Exception as exc:  # the test's handler failed: say so over HTTP
                    return _error_response(500, f"handler raised {type(exc).__name__}: {exc}")
        delay = max((r.delay_s for r in replies), default=0.0)
        if delay:
            await asyncio.sleep(delay)
        failed = next((r for r in replies if r.status != 200), None)
        if failed is not None:
            return _error_response(failed.status, failed.error or f"scripted HTTP {failed.status}", failed.headers)
        raw = next((r.raw for r in replies if r.raw is not None), None)
        if isinstance(raw, dict):
            return JSONResponse(raw)
        if raw is not None:
            return Response(raw, media_type="application/json")

        prompt_tokens = 0
        if chat:
            prompt_tokens = sum(_words(_content_text(m.get("content")))
                                for m in body["messages"] if isinstance(m, dict))
        else:
            prompt_tokens = sum(_words(str(c["prompt"] or "")) for c in calls)
        choices: list[dict[str, Any]] = []
        completion_tokens = 0
        headers: dict[str, str] = {}
        for i, r in enumerate(replies):
            text, finish = _apply_stop(r.text, r.finish_reason, body.get("stop"), self.keep_stop)
            completion_tokens += r.completion_tokens if r.completion_tokens is not None else _words(text)
            if r.prompt_tokens is not None:
                prompt_tokens = r.prompt_tokens
            headers.update(r.headers)
            choices.append({"index": i, "text": text, "finish_reason": finish, "extra": r.choice_extra})
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        created = int(time.time())
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._stream(rid, created, model, choices, usage if include_usage else None,
                                                  chat=chat), media_type="text/event-stream", headers=headers)
        if chat:
            out_choices = [{"index": c["index"], "message": {"role": "assistant", "content": c["text"]},
                            "finish_reason": c["finish_reason"], "logprobs": None, **c["extra"]} for c in choices]
            obj = "chat.completion"
        else:
            out_choices = [{"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"],
                            "logprobs": None, **c["extra"]} for c in choices]
            obj = "text_completion"
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": model, "choices": out_choices,
                             "usage": usage}, headers=headers)

    @staticmethod
    def _stream(rid: str, created: int, model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None,
                *, chat: bool) -> Iterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(chunk_choices: list[dict[str, Any]], **extra: Any) -> str:
            payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": chunk_choices, **extra}
            return f"data: {json.dumps(payload)}\n\n"

        for c in choices:
            if chat:
                yield event([{"index": c["index"], "delta": {"role": "assistant", "content": c["text"]},
                              "finish_reason": None}])
                yield event([{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"], **c["extra"]}])
            else:
                yield event([{"index": c["index"], "text": c["text"], "finish_reason": None}])
                yield event([{"index": c["index"], "text": "", "finish_reason": c["finish_reason"], **c["extra"]}])
        if usage is not None:
            yield event([], usage=usage)
        yield "data: [DONE]\n\n"


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """A running server with the echo handler; set ``fake_openai.handler`` in the test."""
    with FakeOpenAIServer() as server:
        yield server
