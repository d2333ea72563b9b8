"""The LLM extractor: HippoRAG's two-step OpenIE (named entities, then triples conditioned on them) against an
OpenAI-compatible chat endpoint (``vllm serve``, SGLang, OpenAI) or vLLM offline batch inference.

Two kinds of trouble are kept apart on purpose:

* A reply we cannot use (no JSON, wrong shape) is the model's fault and concerns one passage: it is asked again
  (slightly hotter each time, so a greedy server does not repeat itself) up to ``max_attempts`` times, then the
  passage gets ``OpenIEResult(ok=False)`` and the build goes on.
* A transport failure (connection refused, timeout, 5xx or 429 after the client's own retries) or a 4xx that will
  hit every request (404 unknown model, 401 bad key) means the endpoint is down or misconfigured: carrying on would
  mark the whole corpus as failed, so :class:`LLMEndpointError` (a ``RuntimeError``) aborts the build instead.
  A 400/422 is the exception: it is usually one passage that is too long for the context, so it fails that passage
  only, unless it keeps happening to every passage in a row.

Replies are read leniently: the JSON object is found inside prose or code fences, cut back to its last complete
element when ``max_tokens`` truncated it, and repaired (single quotes, trailing commas, missing brackets) with
``json_repair``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import json_repair

from ..corpus import Passage
from ..llm_clients import Endpoint, error_detail, import_vllm, openai_client, vllm_engine

from . import prompts
from .base import Extractor, OpenIEResult, Triple, clean_entities, clean_triples

if TYPE_CHECKING:
    from ..config import ExtractorConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_TEMPERATURE = 2.0
"""OpenAI rejects hotter requests; retries never go above it."""
SYSTEMATIC_BAD_REQUESTS = 8
"""This many passages in a row rejected with HTTP 400/422 (and none accepted) is a misconfiguration, not bad luck."""
VLLM_WINDOW = 256
"""Passages per ``LLM.chat`` batch in offline mode (bigger batches keep the GPU busy)."""


class LLMEndpointError(RuntimeError):
    """The endpoint is down or refuses every request; the build must stop rather than fail every passage."""


class ReplyError(ValueError):
    """A reply that does not hold the JSON we asked for."""


class _RequestRejected(Exception):
    """HTTP 400/422 for one request (typically a passage longer than the model's context)."""


class _WindowAborted(Exception):
    def __init__(self, done: list[OpenIEResult], error: BaseException) -> None:
        super().__init__(str(error))
        self.done = done
        self.error = error


# ---------------------------------------------------------------------------------------------------------------
# Reading replies


def parse_entities(text: str, *, truncated: bool = False) -> list[str]:
    """The entity list of a NER reply. Raises :class:`ReplyError` when the reply is unusable."""
    raw = extract_json_value(text, "named_entities", truncated=truncated)
    if not isinstance(raw, list):
        raise ReplyError(f"'named_entities' is a {type(raw).__name__}, not a list")
    entities = clean_entities(raw)
    if raw and not entities:
        raise ReplyError("'named_entities' holds no strings")
    if truncated and not entities:
        raise ReplyError("reply cut off by max_tokens before the first entity")
    return entities


def parse_triples(text: str, *, truncated: bool = False) -> list[Triple]:
    """The triples of a triple-extraction reply (malformed ones dropped). Raises :class:`ReplyError` when the reply
    is unusable or none of its triples is well formed."""
    raw = extract_json_value(text, "triples", truncated=truncated)
    if not isinstance(raw, list):
        raise ReplyError(f"'triples' is a {type(raw).__name__}, not a list")
    triples = list(dict.fromkeys(clean_triples(raw)))
    if raw and not triples:
        raise ReplyError("'triples' holds no [subject, relation, object] of three strings")
    if truncated and not triples:
        raise ReplyError("reply cut off by max_tokens before the first complete triple")
    return triples


def extract_json_value(text: str, key: str, *, truncated: bool = False) -> Any:
    """The value of ``key`` in the JSON object a reply contains, or the reply itself when it is a bare JSON list.

    Tolerates prose, ``<think>`` blocks and ```json fences around the object, single quotes and trailing commas,
    and (with ``truncated``) a reply cut off mid-way: it is cut back to its last complete list element and closed.
    """
    text = _strip_thinking(text or "")
    if not text.strip():
        raise ReplyError("empty reply")
    m = None
    for m in re.finditer(rf"""["']?{re.escape(key)}["']?\s*:""", text):
        pass  # the last mention: a model that restates or corrects itself means its final version
    if m is not None:
        start = text.rfind("{", 0, m.start())
        body = text[start:] if start >= 0 else "{" + text[m.start():]
    else:
        stripped = re.sub(r"^\s*```[A-Za-z]*\s*", "", text)
        if not stripped.startswith("["):
            raise ReplyError(f"no JSON object with {key!r} in the reply")
        body = stripped
    end, last_element = _scan(body)
    if end is not None:
        body = body[:end]
    elif truncated:
        body = body[:last_element]
    try:
        obj = json_repair.loads(body)
    except Exception as exc:  # json_repair is lenient, but do not trust it never to raise
        raise ReplyError(f"unrepairable JSON: {exc}") from exc
    if isinstance(obj, dict):
        if key not in obj:
            raise ReplyError(f"JSON object without {key!r}")
        return obj[key]
    if isinstance(obj, list) and m is None:
        return obj
    raise ReplyError(f"no JSON object with {key!r} in the reply")


def _strip_thinking(text: str) -> str:
    """Drop a reasoning model's thoughts (it may draft JSON there); some templates omit the opening tag."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:  # cut off while still thinking
        return text.split("<think>", 1)[0]
    return text


def _scan(body: str) -> tuple[int | None, int]:
    """Walk the JSON-ish text from its opening bracket: where it closes (``None`` if it never does), and the end of
    the last complete element of a list (a string or bracketed value directly inside ``[...]``)."""
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    last_element = 0
    for i, ch in enumerate(body):
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
                if stack and stack[-1] == "[":
                    last_element = i + 1
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}":
            if stack:
                stack.pop()
            if not stack:
                return i + 1, last_element
            if stack[-1] == "[":
                last_element = i + 1
    return None, last_element




# ---------------------------------------------------------------------------------------------------------------
# The extractor


class LLMExtractor(Extractor):
    """Two-step LLM OpenIE. Build it with :meth:`from_config`; call :meth:`close` when done.

    Counters (``requests``, ``retries``, ``failures``, ``prompt_tokens``, ``completion_tokens``) accumulate over the
    extractor's life; tokens are counted only when the server reports usage.
    """

    chunk_size = 64

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        backend: Literal["openai", "vllm"] = "openai",
        concurrency: int = 16,
        max_attempts: int = 3,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        retry_temperature_step: float = 0.2,
        window: int | None = None,
        vllm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not model:
            raise ValueError("the LLM extractor needs a model name (extractor.llm_model)")
        if backend not in ("openai", "vllm"):
            raise ValueError(f"unknown LLM backend {backend!r}; use 'openai' or 'vllm'")
        self.model = model
        self.backend = backend
        self.base_url = base_url
        self.concurrency = max(1, concurrency)
        self.max_attempts = max(1, max_attempts)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.retry_temperature_step = retry_temperature_step
        self.window = window or (max(VLLM_WINDOW, 4 * self.concurrency) if backend == "vllm" else 4 * self.concurrency)
        self.vllm_kwargs = dict(vllm_kwargs or {})
        # The URL is left out on purpose: the same model behind another URL gives the same output and shares the cache.
        self.identity = f"llm:{model}:{prompts.PROMPT_VERSION}"
        self.requests = 0
        self.retries = 0
        self.failures = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._bad_request_streak = 0
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._vllm: Any = None
        self._sampling_params: Any = None
        if backend == "openai":
            self._client = openai_client(Endpoint(base_url, api_key, timeout_s=timeout_s), max_retries=max_retries,
                                         asynchronous=True)
            self.base_url = str(self._client.base_url)

    @classmethod
    def from_config(cls, cfg: ExtractorConfig) -> LLMExtractor:
        """The extractor ``[extractor]`` describes (``kind = "llm"``)."""
        if not cfg.llm_model:
            raise ValueError("extractor.llm_model must be set to use the LLM extractor")
        return cls(
            cfg.llm_model,
            base_url=cfg.llm_base_url,
            api_key=cfg.llm_api_key.get_secret_value() if cfg.llm_api_key is not None else None,
            backend=cfg.llm_backend,
            concurrency=cfg.concurrency,
            max_attempts=cfg.max_attempts,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            timeout_s=cfg.timeout_s,
        )

    # -- public interface -----------------------------------------------------------------------------------------

    def extract(self, passages: Sequence[Passage]) -> Iterator[OpenIEResult]:
        """Results in passage order, one window (``window`` passages) at a time. Raises :class:`LLMEndpointError`
        when the endpoint is unusable, after yielding the in-order prefix of the window that did finish."""
        for start in range(0, len(passages), self.window):
            window = passages[start:start + self.window]
            aborted: _WindowAborted | None = None
            if self.backend == "vllm":
                results = self._vllm_window(window)
            else:
                try:
                    results = self._run(self._openai_window(window))
                except _WindowAborted as exc:
                    aborted, results = exc, exc.done
            for r in results:
                r.source = r.source or self.identity
                yield r
            if aborted is not None:
                raise aborted.error

    def close(self) -> None:
        """Close the HTTP client and stop the private event loop (or drop the vLLM engine)."""
        if self._client is not None and self._loop is not None and self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(timeout=10)
            except Exception:  # closing must not mask what happened before
                log.debug("closing the LLM client failed", exc_info=True)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)
            if not self._loop.is_running():
                self._loop.close()
        self._loop = self._thread = None
        self._vllm = None

    def stats(self) -> dict[str, int]:
        return {"requests": self.requests, "retries": self.retries, "failures": self.failures,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}

    # -- shared -----------------------------------------------------------------------------------------------------

    def _failed(self, passage: Passage, error: str, entities: list[str]) -> OpenIEResult:
        self.failures += 1
        log.warning("LLM OpenIE gave up on passage %s (%r): %s", passage.id, passage.title, error)
        return OpenIEResult(entities=entities, triples=[], ok=False, error=error)

    def _attempt_temperature(self, attempt: int) -> float:
        return min(MAX_TEMPERATURE, self.temperature + self.retry_temperature_step * attempt)

    def _read(self, parse: Callable[..., T], text: str, finish_reason: str | None) -> tuple[T | None, str]:
        """Parse one reply: (value, "") or (None, why it is unusable)."""
        try:
            return parse(text, truncated=finish_reason == "length"), ""
        except ReplyError as exc:
            why = str(exc)
        except Exception as exc:  # a parser bug must cost one passage, not the build
            log.debug("parsing an LLM reply raised", exc_info=True)
            why = f"{type(exc).__name__}: {exc}"
        snippet = text if len(text) <= 200 else text[:200] + "..."
        return None, f"{why} (finish_reason={finish_reason}, reply {snippet!r})"

    # -- openai backend ---------------------------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the private loop. The loop lives in its own thread so that ``extract`` works from
        plain code and from inside someone else's running event loop alike, and the HTTP client's connections
        stay bound to one loop for the extractor's whole life."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="llm-openie-loop", daemon=True)
            self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # Ctrl-C in the caller: stop the in-flight requests too
            raise

    async def _openai_window(self, window: Sequence[Passage]) -> list[OpenIEResult]:
        sem = asyncio.Semaphore(self.concurrency)
        tasks = [asyncio.ensure_future(self._openai_passage(p, sem)) for p in window]
        try:
            await asyncio.gather(*tasks)
        except BaseException as exc:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            done: list[OpenIEResult] = []
            for t in tasks:
                if t.cancelled() or t.exception() is not None:
                    break
                done.append(t.result())
            raise _WindowAborted(done, exc) from exc
        return [t.result() for t in tasks]

    async def _openai_passage(self, passage: Passage, sem: asyncio.Semaphore) -> OpenIEResult:
        text = passage.content
        try:
            entities, why = await self._openai_step(prompts.ner_messages(text), parse_entities, sem)
            if entities is None:
                return self._failed(passage, f"NER: {why}", [])
            if not entities:
                # Every triple must contain a listed entity, so there is nothing to ask for.
                return OpenIEResult(entities=[], triples=[])
            triples, why = await self._openai_step(prompts.triple_messages(text, entities), parse_triples, sem)
            if triples is None:
                return self._failed(passage, f"triples: {why}", entities)
            return OpenIEResult(entities=entities, triples=triples)
        except _RequestRejected as exc:
            self._bad_request_streak += 1
            if self._bad_request_streak >= SYSTEMATIC_BAD_REQUESTS:
                raise LLMEndpointError(
                    f"LLM endpoint {self.base_url} rejected {self._bad_request_streak} passages in a row; "
                    f"check the model and server settings. Last error: {exc}") from exc
            return self._failed(passage, f"request rejected: {exc}", [])

    async def _openai_step(self, messages: list[dict[str, str]], parse: Callable[..., T],
                           sem: asyncio.Semaphore) -> tuple[T | None, str]:
        why = ""
        for attempt in range(self.max_attempts):
            if attempt:
                self.retries += 1
            text, finish = await self._chat(messages, self._attempt_temperature(attempt), sem)
            value, why = self._read(parse, text, finish)
            if value is not None:
                return value, ""
            log.debug("unusable LLM reply (attempt %d/%d): %s", attempt + 1, self.max_attempts, why)
        return None, f"no usable reply in {self.max_attempts} attempts; last: {why}"

    async def _chat(self, messages: list[dict[str, str]], temperature: float,
                    sem: asyncio.Semaphore) -> tuple[str, str | None]:
        """One chat completion: (text, finish_reason). Endpoint failures become :class:`LLMEndpointError`."""
        import openai

        async with sem:
            self.requests += 1
            try:
                resp = await self._client.chat.completions.create(
                    model=self.model, messages=messages, temperature=temperature, max_tokens=self.max_tokens)
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                raise LLMEndpointError(f"LLM endpoint {self.base_url} unreachable: {exc}") from exc
            except openai.APIStatusError as exc:
                raise self._status_error(exc) from exc
            except openai.APIResponseValidationError as exc:
                return "", f"invalid response: {exc}"
        self._bad_request_streak = 0
        usage = getattr(resp, "usage", None)
        if usage is not None:
            self.prompt_tokens += usage.prompt_tokens or 0
            self.completion_tokens += usage.completion_tokens or 0
        if not resp.choices:
            return "", "no choices"
        choice = resp.choices[0]
        return choice.message.content or "", choice.finish_reason

    def _status_error(self, exc: Any) -> Exception:
        status = exc.status_code
        detail = error_detail(exc)
        where = f"LLM endpoint {self.base_url}"
        if status in (400, 422):
            return _RequestRejected(f"HTTP {status}: {detail}")
        if status >= 500 or status in (408, 429):
            return LLMEndpointError(f"{where} unreachable: HTTP {status} after the client's retries: {detail}")
        if status == 404:
            return LLMEndpointError(f"{where} answered 404 Not Found: is the model name {self.model!r} served there, "
                                    f"and does the URL end in /v1? ({detail})")
        if status in (401, 403):
            return LLMEndpointError(f"{where} refused the API key (HTTP {status}): {detail}")
        return LLMEndpointError(f"{where} rejected the request (HTTP {status}): {detail}")

    # -- vllm backend -----------------------------------------------------------------------------------------------

    def _engine(self) -> tuple[Any, Any]:
        """The in-process vLLM engine, loaded on first use (a build whose passages are all cached never loads it)."""
        if self._vllm is None:
            user = "llm_backend = 'vllm'"
            instead = ", or serve the model with `vllm serve` and use llm_backend = 'openai' with llm_base_url"
            self._vllm = vllm_engine(self.model, asynchronous=False, user=user, alternative=instead, **self.vllm_kwargs)
            self._sampling_params = import_vllm(user, instead).SamplingParams
        return self._vllm, self._sampling_params

    def _vllm_window(self, window: Sequence[Passage]) -> list[OpenIEResult]:
        """NER for the whole window in one batch, then triples for the whole window in one batch."""
        texts = [p.content for p in window]
        ner = self._vllm_step([prompts.ner_messages(t) for t in texts], parse_entities)
        results: list[OpenIEResult | None] = [None] * len(window)
        todo: list[int] = []
        for i, (entities, why) in enumerate(ner):
            if entities is None:
                results[i] = self._failed(window[i], f"NER: {why}", [])
            elif not entities:
                results[i] = OpenIEResult(entities=[], triples=[])
            else:
                todo.append(i)
        if todo:
            found = self._vllm_step([prompts.triple_messages(texts[i], ner[i][0] or []) for i in todo], parse_triples)
            for i, (triples, why) in zip(todo, found):
                entities = ner[i][0] or []
                if triples is None:
                    results[i] = self._failed(window[i], f"triples: {why}", entities)
                else:
                    results[i] = OpenIEResult(entities=entities, triples=triples)
        return [r for r in results if r is not None]

    def _vllm_step(self, conversations: list[list[dict[str, str]]],
                   parse: Callable[..., T]) -> list[tuple[T | None, str]]:
        """One ``LLM.chat`` call for all conversations, then one more per attempt for those still unusable."""
        llm, sampling_params = self._engine()
        out: list[tuple[T | None, str]] = [(None, "not run")] * len(conversations)
        pending = list(range(len(conversations)))
        for attempt in range(self.max_attempts):
            if not pending:
                break
            if attempt:
                self.retries += len(pending)
            params = sampling_params(temperature=self._attempt_temperature(attempt), max_tokens=self.max_tokens)
            outputs = llm.chat([conversations[i] for i in pending], params, use_tqdm=False)
            self.requests += len(pending)
            still: list[int] = []
            for i, ro in zip(pending, outputs):
                comp = ro.outputs[0] if getattr(ro, "outputs", None) else None
                text = (getattr(comp, "text", None) or "") if comp is not None else ""
                finish = getattr(comp, "finish_reason", None) if comp is not None else None
                self.prompt_tokens += len(getattr(ro, "prompt_token_ids", None) or ())
                self.completion_tokens += len(getattr(comp, "token_ids", None) or ())
                value, why = self._read(parse, text, finish)
                if value is None:
                    out[i] = (None, f"no usable reply in {attempt + 1} attempts; last: {why}")
                    still.append(i)
                else:
                    out[i] = (value, "")
            pending = still
        return out
