"""What the routers share: the error responses they document, the JSON answer, and this app's request models as a
route's body."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import Response
from pydantic import BaseModel

from routerag.config import ServerConfig

from ..protocol import ErrorResponse

Responses = dict[int | str, dict[str, Any]]
Endpoint = Callable[..., Awaitable[Any]]


def error_responses(cfg: ServerConfig, keyed: bool) -> Responses:
    """The errors a route may answer, for the OpenAPI schema (each route documents those that apply to it)."""
    errors: Responses = {
        413: {"model": ErrorResponse, "description": f"Body over {cfg.max_body_bytes} bytes."},
        415: {"model": ErrorResponse,
              "description": "The body is not sent as JSON (`Content-Type: application/json`)."},
        422: {"model": ErrorResponse,
              "description": "Malformed JSON, wrong types, unknown fields or a limit exceeded."},
        502: {"model": ErrorResponse, "description": "A remote backend (policy or retrieval server) failed."},
        503: {"model": ErrorResponse,
              "description": "`overloaded`: too many requests in flight and queued, or the queue would not let this "
                             "one finish in time; retry after `Retry-After` seconds.",
              "headers": {"Retry-After": {"description": "Seconds until a slot is expected to be free.",
                                          "schema": {"type": "integer", "minimum": 1}}}},
        504: {"model": ErrorResponse, "description": f"Not finished within {cfg.request_timeout_s:g} s of its "
                                                     "arrival."},
    }
    if keyed:
        errors[401] = {"model": ErrorResponse, "description": "Missing or wrong API key."}
    errors[403] = {"model": ErrorResponse, "description": "A browser origin not in server.allowed_origins, or a key "
                                                          "that may read this index but not change it."}
    errors[404] = {"model": ErrorResponse, "description": "No such index, or none this key may use (or no such job, "
                                                          "or document)."}
    errors[421] = {"model": ErrorResponse, "description": "A Host header not in server.allowed_hosts."}
    return errors


def only(errors: Responses, *codes: int) -> Responses:
    """The documented errors among ``codes`` (401 is documented only on a server with keys)."""
    return {code: errors[code] for code in codes if code in errors}


def without(errors: Responses, *codes: int) -> Responses:
    return {code: e for code, e in errors.items() if code not in codes}


def json_response(body: BaseModel, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` serialised once (FastAPI would validate it again against the route's response model first)."""
    return Response(body.model_dump_json(), status_code=status_code, media_type="application/json", headers=headers)


def with_body(endpoint: Endpoint, model: type[BaseModel], param: str = "req") -> Endpoint:
    """``endpoint`` taking this app's request model as its body: the model is built per app (its fields carry the
    ``server.*`` limits, enforced with a 422 and shown in the schema), so the endpoint is written against the base
    class and FastAPI reads the subclass from the signature given here."""
    @functools.wraps(endpoint)
    async def bound(*args: Any, **kwargs: Any) -> Any:
        return await endpoint(*args, **kwargs)

    signature = inspect.signature(endpoint, eval_str=True)
    setattr(bound, "__signature__", signature.replace(parameters=[
        p.replace(annotation=model) if p.name == param else p for p in signature.parameters.values()]))
    return bound
