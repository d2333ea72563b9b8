"""``routerag serve``: the REST server (``/ask``, ``/retrieve``, ``/documents``, ``/jobs``, ``/v1/chat/completions``,
``/health``, ``/ready``, ``/metrics``, ``/docs``) over one index or several, in one process: the indexes and the policy
are loaded once and shared by all requests, which the backends micro-batch. Several indexes share one policy model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from graph_index.status import STATUS

from .common import (AdapterOpt, LogFormat, ApiOpt, BackendOpt, BaseUrlOpt, ConfigOpt, PolicyOpt, TemperatureOpt,
                     UsageError, policy_overrides, handle_errors, load_engine, setup_logging)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)


def parse_indexes(specs: list[str]) -> dict[str, Path]:
    """``DIR`` or ``NAME=DIR`` arguments → name → directory; a repeated name is an error (a missing directory is the
    engine's to report, after the settings: a typo in them is reported first)."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        folder = Path(path if sep else spec).expanduser()
        # the link's own name (an index path is a link to its current version), not its target's
        name = name if sep else (folder.absolute().name or folder.resolve().name)
        if not name or "/" in name:
            raise UsageError(f"{spec!r}: an index is DIR or NAME=DIR, with a NAME without '/'")
        if name in out:
            raise UsageError(f"index name {name!r} given twice ({out[name]} and {folder}); name them: NAME=DIR")
        out[name] = folder
    return out


@handle_errors
def serve_cmd(
    indexes: Annotated[Optional[list[str]], typer.Argument(
        help="Index directories, each as DIR (served under its directory's name) or NAME=DIR.",
        metavar="[NAME=]DIR...", show_default=False)] = None,
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
    shards: Annotated[Optional[str], typer.Option(
        help="Serve one index split over shard servers instead of local directories: their base URLs, comma "
             "separated. Each query fans out to all of them (retrieval.shard_timeout_s each); a shard that fails "
             "degrades the answer, and /retrieve says which answered.")] = None,
    shards_name: Annotated[str, typer.Option(help="The name the sharded index is served under.")] = "shards",
    config: ConfigOpt = None,
    log_format: Annotated[LogFormat, typer.Option(
        "--log-format",
        help="text: readable lines (Rich on a terminal); json: one JSON object per line (time, level, logger, "
             "message; an access line also client, method, path, status), for a log collector.")] = "text",
    access_log: Annotated[bool, typer.Option(help="Log one line per request, on stderr with the other logs.")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log the libraries' info lines too.")] = False,
) -> None:
    """Serve indexes over HTTP: the routing policy at POST /ask (JSON or Server-Sent Events) and at the
    OpenAI-compatible POST /v1/chat/completions (model = index name), plain retrieval at POST /retrieve (Search-R1's
    protocol plus a mode), and documents added and deleted while serving (POST /documents, DELETE
    /documents/{id}, GET /jobs/{id})."""
    setup_logging(verbose, log_format)
    from server.app import create_app
    from server.operations import run

    from ..engine import Engine

    if bool(indexes) == bool(shards):
        raise UsageError("give index directories, or --shards URL,URL, not both" if indexes else
                         "nothing to serve: give index directories ([NAME=]DIR ...) or --shards URL,URL")
    named: dict[str, Path | None] = dict(parse_indexes(indexes)) if indexes else {shards_name: None}
    first, *rest = named.items()
    engine = load_engine(first[1], config, policy_overrides(policy, backend, base_url, adapter, temperature, api),
                         warm=True, server={"host": host, "port": port, "api_key": api_key},
                         shards=[u.strip() for u in shards.split(",") if u.strip()] if shards else None)
    settings = engine.settings
    engines = {first[0]: engine}
    for name, path in rest:  # the other indexes share the first one's policy model and settings
        engines[name] = Engine(path, settings, generator=engine.generator)
        engines[name].warm_up()
    from graph_index.builder import Components, config_for_update

    # each index's updates use its own build settings (models, graph) and the query encoder already loaded
    components = {name: Components(config_for_update(e.retriever.data, settings), embedder=e.retriever.embedder)
                  for name, e in engines.items() if e.retriever is not None}
    app = create_app(engines, settings, components=components)
    srv = settings.server
    keyed = any(k and k.get_secret_value() for k in (srv.api_key, srv.admin_key)) or bool(srv.index_keys)
    base = f"http://{srv.host}:{srv.port}"
    logging.getLogger("routerag.serve").info(
        "serving %s on %s (policy %s, auth %s): the page at %s/ui, the API docs at %s/docs",
        ", ".join(f"{n} ({p or shards})" for n, p in named.items()), base, engine.generator.name,
        "on" if keyed else "off", base, base, extra=STATUS)
    run(app, host=srv.host, port=srv.port, drain_timeout_s=srv.drain_timeout_s, access_log=access_log)
