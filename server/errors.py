"""The error route code raises; one handler in :mod:`server.app` renders every one as ``{"error": {"type",
"message", "param", "code"}}`` (OpenAI's error object, so its clients read ours)."""

from __future__ import annotations

import logging
from typing import Any


class APIError(Exception):
    """An error with its HTTP status and error type, raised by route code and rendered by one handler; ``param``
    names the request field at fault and ``code`` a finer reason, where there are ones."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None, *,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers
        self.param, self.code = param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.kind, self.message, param=self.param, code=self.code)


def error_body(kind: str, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The one error shape of the API (:class:`~server.protocol.ErrorResponse`)."""
    return {"error": {"type": kind, "message": message, "param": param, "code": code}}


def stream_error(exc: Exception, where: str) -> dict[str, Any]:
    """The error event that ends a stream whose work failed: an :class:`APIError`'s own body; anything else is ours,
    logged with its traceback, and sent as an ``internal_error`` (the stream's 200 is already on its way)."""
    if isinstance(exc, APIError):
        return exc.body()
    logging.getLogger(__name__).error("internal error in %s", where, exc_info=exc)
    return error_body("internal_error", f"internal server error ({type(exc).__name__})")
