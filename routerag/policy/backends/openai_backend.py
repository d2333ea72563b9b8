"""Any OpenAI-compatible server (``vllm serve``, SGLang, Ollama, OpenAI, ``transformers serve``) through the
``openai`` client, on the chat or the completions endpoint (``GeneratorConfig.api``).

* ``chat`` (default): the user message, then, from the second turn on, one assistant message holding the response
  so far (the policy's turns and the ``<information>`` the loop appended). The server is asked to continue that
  message (``continue_final_message``, ``add_generation_prompt=False``: vLLM, SGLang), so the model sees what a
  completions prompt would show it. Servers that reject those fields (OpenAI, ``transformers serve``: HTTP 400/422)
  get, with ``chat_continuation = "auto"``, the response as a finished assistant message and the model writes its
  next turn after it; servers that ignore unknown fields (Ollama) do the same silently.
* ``completions``: the whole running text as one prompt, rendered with the chat template here (``tokenizer``, else
  ChatML), exactly what RouteRAG's loop does in-process.

Either way the turn comes back as text the loop reads the same: stop strings are cut off by OpenAI and vLLM but
kept by ``transformers serve``; the text is cut right after the first stop string when one is there, and the loop
restores a cut one. Turns are streamed by default (``stream``) and assembled here. An empty ``choices`` list or a
reply that is not a completion is an :class:`~graph_index.llm_clients.UpstreamError` (the REST server's 502), like
the client's own errors for 5xx after its retries. Requests run concurrently up to ``max_concurrency``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from ...config import GeneratorConfig
from graph_index.llm_clients import UpstreamError, error_detail, openai_client
from ...prompts import chatml
from ..types import Generation, GenerationRequest

log = logging.getLogger(__name__)

_OPEN_TAGS = ("<search>", "<answer>")
CONTINUE_FIELDS = {"continue_final_message": True, "add_generation_prompt": False}
"""vLLM's (and SGLang's) extra chat fields: render the final assistant message open, with no new turn after it."""


@dataclass(slots=True)
class _Reply:
    """One turn as the server sent it, before the loop's conventions are applied."""

    text: str
    finish_reason: str | None
    stop_reason: Any = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class OpenAIGenerator:
    tracks_tokens = False

    def __init__(self, cfg: GeneratorConfig) -> None:
        if not cfg.base_url and cfg.model.startswith(("smollm2",)):
            raise ValueError("the openai backend needs base_url and the served model's name")
        self.cfg = cfg
        self.name = f"openai:{cfg.endpoint.host}:{cfg.model}"
        self.where = f"policy server {cfg.endpoint.host}"
        self.client = openai_client(cfg.endpoint, max_retries=2, asynchronous=True)
        self.tokenizer = _load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        self.continues: bool | None = {"on": True, "off": False}.get(cfg.chat_continuation)
        """Whether the server continues a final assistant message (None: not known yet, ``auto`` finds out)."""
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None

    def render_prompt(self, user_message: str) -> tuple[str, list[int] | None]:
        """The prompt as text: what a completions request sends; with ``api = "chat"`` the server renders its own
        template from the user message, and this text is only the trajectory's record of the prompt."""
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": user_message}], add_generation_prompt=True,
                                           tokenize=False)
            return text, None
        return chatml(user_message), None

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.cfg.max_concurrency), loop
        return self._sem

    async def generate(self, request: GenerationRequest) -> Generation:
        temp = self.cfg.temperature if request.temperature is None else request.temperature
        params: dict[str, Any] = {"model": self.cfg.model, "max_tokens": request.max_tokens, "temperature": temp,
                                  "top_p": self.cfg.top_p if temp > 0 else 1.0, "stop": list(request.stop) or None}
        async with self._semaphore():
            if self.cfg.api == "chat":
                reply = await self._chat(request, params)
            else:
                reply = await self._request(self.client.completions.create, prompt=request.prompt_text, **params)
        return _generation(reply, request)

    # -- chat ---------------------------------------------------------------------------------------------------------

    async def _chat(self, request: GenerationRequest, params: dict[str, Any]) -> _Reply:
        if request.user_message is None:
            raise ValueError("api = 'chat' needs the user message, and this request carries only a rendered prompt; "
                             "use api = 'completions' for callers that render their own prompts")
        messages = [{"role": "user", "content": request.user_message}]
        if not request.response_text:
            return await self._request(self.client.chat.completions.create, messages=messages, **params)
        messages.append({"role": "assistant", "content": request.response_text})
        if self.continues is False:
            return await self._request(self.client.chat.completions.create, messages=messages, **params)
        import openai

        try:
            reply = await self._request(self.client.chat.completions.create, messages=messages,
                                        extra_body=CONTINUE_FIELDS, **params)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            if self.continues is not None:  # "on", or a server known to continue: the error is about something else
                raise
            reply = await self._request(self.client.chat.completions.create, messages=messages, **params)
            if self.continues is None:
                log.warning("%s rejected continue_final_message (HTTP %s: %s); each turn now follows the response "
                            "so far as a new assistant message (chat_continuation = 'auto')", self.where,
                            exc.status_code, error_detail(exc))
            self.continues = False
            return reply
        self.continues = True
        return reply

    # -- one request, streamed or not -----------------------------------------------------------------------------

    async def _request(self, create: Any, **kwargs: Any) -> _Reply:
        chat = "messages" in kwargs
        if not self.cfg.stream:
            try:
                resp = await create(**kwargs)
            except json.JSONDecodeError as exc:  # the client parses the body itself, and lets this through
                raise UpstreamError(f"{self.where} answered something that is not JSON: {exc}") from exc
            return _read_response(resp, chat=chat, where=self.where)
        stream = await create(stream=True, stream_options={"include_usage": True}, **kwargs)
        try:
            return await _read_stream(stream, chat=chat, where=self.where)
        finally:
            await stream.close()

    async def aclose(self) -> None:
        await self.client.close()


def _read_response(resp: Any, *, chat: bool, where: str) -> _Reply:
    """The first choice of a whole response; anything that is not a completion is an UpstreamError."""
    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise UpstreamError(f"{where} answered without a completion (no choices): {_snippet(resp)}")
    choice = choices[0]
    text = _choice_text(choice, chat=chat, delta=False)
    if text is None:
        raise UpstreamError(f"{where} answered a choice without text: {_snippet(resp)}")
    usage = getattr(resp, "usage", None)
    return _Reply(text, getattr(choice, "finish_reason", None), getattr(choice, "stop_reason", None),
                  getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)


async def _read_stream(stream: Any, *, chat: bool, where: str) -> _Reply:
    """The first choice of a streamed response, assembled; a stream with no choice at all is an UpstreamError."""
    parts: list[str] = []
    reply = _Reply("", None)
    seen = False
    try:
        async for chunk in stream:
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                reply.prompt_tokens = getattr(usage, "prompt_tokens", 0) or 0
                reply.completion_tokens = getattr(usage, "completion_tokens", 0) or 0
            for choice in getattr(chunk, "choices", None) or ():
                if getattr(choice, "index", 0) != 0:
                    continue
                seen = True
                parts.append(_choice_text(choice, chat=chat, delta=True) or "")
                if getattr(choice, "finish_reason", None):
                    reply.finish_reason = choice.finish_reason
                    reply.stop_reason = getattr(choice, "stop_reason", None)
    except json.JSONDecodeError as exc:  # an event whose data is not JSON: not an OpenAI-compatible stream
        raise UpstreamError(f"{where} sent a stream event that is not JSON: {exc}") from exc
    if not seen:
        raise UpstreamError(f"{where} streamed no completion (no choices)")
    reply.text = "".join(parts)
    return reply


def _choice_text(choice: Any, *, chat: bool, delta: bool) -> str | None:
    if not chat:
        text = getattr(choice, "text", None)
    else:
        message = getattr(choice, "delta" if delta else "message", None)
        text = getattr(message, "content", None)
        if text is None and message is not None:
            text = ""  # a chat message may carry no content (only reasoning or tool calls): an empty turn
    return text if isinstance(text, str) else None


def _generation(reply: _Reply, request: GenerationRequest) -> Generation:
    """The loop's view of a turn: text up to and including the first stop string when the server kept it (as
    ``transformers serve`` does), and ``stop`` only when a stop string fired (OpenAI reports ``stop`` for the end of
    sequence too)."""
    text, kept = _cut_after_stop(reply.text, request.stop)
    finish = "length" if reply.finish_reason == "length" and not kept else "stop"
    if finish == "stop" and not kept:
        # vLLM says which stop string fired (stop_reason); plain OpenAI does not: a stop string fired when the
        # text leaves a search/answer tag open (the server cut off its closing tag)
        matched = reply.stop_reason
        if not (isinstance(matched, str) and matched in request.stop) and not _leaves_tag_open(text, request):
            finish = "eos"
    return Generation(text=text, finish_reason=finish, prompt_tokens=reply.prompt_tokens,
                      completion_tokens=reply.completion_tokens)


def _cut_after_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    hits = [(pos, s) for s in stop if (pos := text.find(s)) >= 0]
    if not hits:
        return text, False
    pos, s = min(hits)
    return text[: pos + len(s)], True


def _leaves_tag_open(text: str, request: GenerationRequest) -> bool:
    low = text.lower()
    if request.stop == ("</answer>",):  # a forced answer: its <answer> was in the prompt
        return "</answer>" not in low
    last = max(low.rfind(t) for t in _OPEN_TAGS)
    if last < 0:
        return False
    tag = low[last + 1 : low.index(">", last)]
    return f"</{tag}>" not in low[last:]


def _snippet(obj: Any) -> str:
    text = obj if isinstance(obj, str) else repr(obj)
    return text if len(text) <= 200 else text[:200] + "..."


def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
