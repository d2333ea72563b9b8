"""The one place that makes clients for language and embedding models: OpenAI-compatible servers (the policy
backend, the OpenAI-compatible embedder, the LLM OpenIE extractor, the fact filter) and vLLM engines in this process
(the OpenIE extractor offline, the policy backend), so they share the conventions for keys, errors and installation
instead of each re-deciding them.

* :class:`Endpoint` is the one description of an OpenAI-compatible server: where it is, its key (or the environment
  variable that holds it) and how long to wait. Settings sections keep their own key names (``base_url``,
  ``llm_base_url``, ``fact_filter_base_url``: existing config files keep working) and turn them into one of these.
* Keys: an explicit key wins; else the environment variable the endpoint names (an index's embedder records the
  variable's name in its manifest, never the key); else, without a base URL (OpenAI itself), the ``openai`` client
  reads ``OPENAI_API_KEY``; a local server gets the placeholder ``EMPTY`` (vLLM, ``transformers serve`` and
  Ollama accept any key unless started with one).
* Failures: :class:`UpstreamError` is what a remote model server that answered something unusable (no choices, not
  a completion, refused the key) becomes, so callers can tell "the server upstream failed" (HTTP 502 from our
  server) from a bug of ours (500).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

LOCAL_PLACEHOLDER_KEY = "EMPTY"
OPENAI_HOST = "api.openai.com"


class UpstreamError(RuntimeError):
    """A remote model server (OpenAI-compatible) failed or answered something unusable: not our bug, not the
    caller's request, so the REST server answers 502."""


def resolve_api_key(key: SecretStr | str | None, env: str | None = None) -> str | None:
    """The key to send: ``key`` when set, else the value of the environment variable ``env`` names, else None."""
    if isinstance(key, SecretStr):
        key = key.get_secret_value()
    if key:
        return key
    return (os.environ.get(env) or None) if env else None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible server: its base URL (None: OpenAI itself), its key or the environment variable that
    holds it, and the client's timeout."""

    base_url: str | None = None
    api_key: SecretStr | str | None = None
    api_key_env: str | None = None
    timeout_s: float = 60.0

    @property
    def host(self) -> str:
        """The server as people name it in messages and identities (OpenAI's host when no URL is set)."""
        return self.base_url or OPENAI_HOST

    def key(self) -> str | None:
        return resolve_api_key(self.api_key, self.api_key_env)


def openai_client(endpoint: Endpoint, *, max_retries: int, asynchronous: bool = False) -> Any:
    """An ``openai.OpenAI`` (or ``AsyncOpenAI``) client for ``endpoint``. Without a key: OpenAI itself (no
    ``base_url``) reads ``OPENAI_API_KEY`` as the client always does; any other server gets
    :data:`LOCAL_PLACEHOLDER_KEY`."""
    import openai

    key = endpoint.key() or (None if endpoint.base_url is None else LOCAL_PLACEHOLDER_KEY)
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(base_url=endpoint.base_url, api_key=key, timeout=endpoint.timeout_s, max_retries=max_retries)


def import_vllm(user: str, alternative: str = "") -> Any:
    """The ``vllm`` module, or a RuntimeError saying that ``user`` needs the ``gpu`` extra (and what to use
    instead)."""
    try:
        import vllm
    except ImportError as exc:
        raise RuntimeError(f"{user} needs vLLM in this environment: install the gpu extra (pip install "
                           f"'routerag[gpu]'){alternative}") from exc
    return vllm


def vllm_engine(model: str, *, asynchronous: bool, user: str, alternative: str = "",
                tensor_parallel_size: int | None = None, gpu_memory_utilization: float | None = None,
                dtype: str = "auto", **engine_args: Any) -> Any:
    """A vLLM engine in this process: ``vllm.LLM`` for offline batches (the OpenIE extractor) or ``AsyncLLMEngine``
    for concurrent requests with continuous batching (the policy backend). Unset arguments keep vLLM's defaults."""
    vllm = import_vllm(user, alternative)
    args = {"tensor_parallel_size": tensor_parallel_size, "gpu_memory_utilization": gpu_memory_utilization,
            "dtype": None if dtype == "auto" else dtype, **engine_args}
    args = {k: v for k, v in args.items() if v is not None}
    if asynchronous:
        return vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(model=model, **args))
    return vllm.LLM(model=model, **args)


def error_detail(exc: Any) -> str:
    """The server's own error message when the body has one (OpenAI and vLLM put it in ``error.message``, FastAPI
    servers such as ``transformers serve`` in ``detail``)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body["error"] if isinstance(body.get("error"), dict) else body
        if err.get("message"):
            return str(err["message"])
        if err.get("detail"):
            return str(err["detail"])
    return str(getattr(exc, "message", None) or exc)
