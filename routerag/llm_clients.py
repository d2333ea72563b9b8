"""The one place that builds clients for OpenAI-compatible servers (the policy backend, the OpenAI-compatible
embedder, the LLM OpenIE extractor, the fact filter), so they share the conventions for keys and for upstream
failures instead of each re-deciding them.

* Keys: an explicit key wins; else the environment variable a setting names (an index's embedder records the
  variable's name in its manifest, never the key); else, without a base URL (OpenAI itself), the ``openai`` client
  reads ``OPENAI_API_KEY``; a local server gets the placeholder ``EMPTY`` (vLLM, ``transformers serve`` and
  Ollama accept any key unless started with one).
* Failures: :class:`UpstreamError` is what a remote model server that answered something unusable (no choices, not
  a completion, refused the key) becomes, so callers can tell "the server upstream failed" (HTTP 502 from our
  server) from a bug of ours (500).
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import SecretStr

LOCAL_PLACEHOLDER_KEY = "EMPTY"


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


def openai_client(base_url: str | None, api_key: str | None, *, timeout_s: float, max_retries: int,
                  asynchronous: bool = False) -> Any:
    """An ``openai.OpenAI`` (or ``AsyncOpenAI``) client. Without a key: OpenAI itself (no ``base_url``) reads
    ``OPENAI_API_KEY`` as the client always does; any other server gets :data:`LOCAL_PLACEHOLDER_KEY`."""
    import openai

    key = api_key or (None if base_url is None else LOCAL_PLACEHOLDER_KEY)
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries)


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
