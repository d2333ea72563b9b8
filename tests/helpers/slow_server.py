"""A real server process whose policy is slow, for the SIGTERM-with-requests-in-flight tests:
``python -m tests.helpers.slow_server INDEX PORT [TURN_S DRAIN_S]``. It runs as ``routerag serve --log-format json``
does (its logging setup and :func:`server.operations.run`); only the policy differs, whose every turn takes
``TURN_S`` (5) seconds: the embedded model would take a minute to load and answer too fast to be caught in flight.
With the default drain of 1 s the requests are still running when the server cancels them; with a longer one they
finish."""

from __future__ import annotations

import sys

from routerag.cli.common import setup_logging
from routerag.config import Settings
from routerag.engine import Engine
from server.app import create_app
from server.operations import run

from .server_helpers import RoutingPolicy


def main(index: str, port: int, turn_s: float = 5.0, drain_s: float = 1.0) -> None:
    setup_logging(False, "json")
    settings = Settings(server={"drain_timeout_s": drain_s})
    engine = Engine(index, settings, generator=RoutingPolicy(delay_s=turn_s))
    app = create_app({"idx": engine}, settings)
    run(app, host="127.0.0.1", port=port, drain_timeout_s=settings.server.drain_timeout_s, access_log=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:5]))
