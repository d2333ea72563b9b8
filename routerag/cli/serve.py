"""``routerag serve``: the REST server (``/ask``, ``/retrieve``, ``/health``, ``/ready``, ``/metrics``, ``/docs``) over
one index, in one process: the index and the policy are loaded once and shared by all requests, which the backends
micro-batch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import (AdapterOpt, ApiOpt, BackendOpt, BaseUrlOpt, ConfigOpt, PolicyOpt, TemperatureOpt,
                     policy_overrides, err_console, handle_errors, load_engine, setup_logging)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)


@handle_errors
def serve_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    policy: PolicyOpt = None,
    backend: BackendOpt = None,
    base_url: BaseUrlOpt = None,
    api: ApiOpt = None,
    adapter: AdapterOpt = None,
    temperature: TemperatureOpt = None,
    host: Annotated[Optional[str], typer.Option(help="Interface to listen on (127.0.0.1).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (8000).")] = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", help="Require 'Authorization: Bearer <key>' on every route but /health and the docs. Prefer "
                          "the environment variable ROUTERAG_SERVER__API_KEY: a flag is visible to other users "
                          "in the process list.")] = None,
    config: ConfigOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every request.")] = False,
) -> None:
    """Serve an index over HTTP: the routing policy at POST /ask (JSON or Server-Sent Events) and plain retrieval at
    POST /retrieve (Search-R1's protocol plus a mode)."""
    setup_logging(verbose)
    import uvicorn

    from server.app import create_app

    engine = load_engine(index, config, policy_overrides(policy, backend, base_url, adapter, temperature, api),
                         warm=True, server={"host": host, "port": port, "api_key": api_key})
    settings = engine.settings
    app = create_app(engine, settings)
    srv = settings.server
    err_console.print(f"serving {index} on http://{srv.host}:{srv.port} (policy {engine.generator.name}, "
                      f"auth {'on' if srv.api_key and srv.api_key.get_secret_value() else 'off'}; docs at /docs)",
                      highlight=False)
    uvicorn.run(app, host=srv.host, port=srv.port, log_level="info" if verbose else "warning",
                access_log=verbose, timeout_graceful_shutdown=5)
