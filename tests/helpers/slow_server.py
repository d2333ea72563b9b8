"""A real server process whose policy takes 5 s a turn, for the SIGTERM-with-requests-in-flight test:
``python -m tests.helpers.slow_server INDEX PORT``. Its shutdown grace is 1 s, so the requests are still running when
uvicorn cancels them."""

from __future__ import annotations

import logging
import sys

import uvicorn

from routerag.config import Settings
from routerag.engine import Engine
from server.app import create_app

from .server_helpers import RoutingPolicy


def main(index: str, port: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    settings = Settings()
    engine = Engine(index, settings, generator=RoutingPolicy(delay_s=5.0))
    app = create_app({"idx": engine}, settings)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="info", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
