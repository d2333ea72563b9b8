"""The error route code raises; one handler in :mod:`server.app` renders every one as ``{"error": {"type",
"message"}}``."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error with its HTTP status and error type, raised by route code and rendered by one handler."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message}}
