"""``routerag mcp``: the index and the routing policy as an MCP server (tools ``search`` and ``ask``), over stdio or
streamable HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import (AdapterOpt, ApiOpt, BackendOpt, BaseUrlOpt, ConfigOpt, PolicyOpt, TemperatureOpt,
                     UsageError, err_console, handle_errors, load_engine, policy_overrides, setup_logging)


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp_cmd)


@handle_errors
def mcp_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    transport: Annotated[str, typer.Option(help="stdio (what desktop MCP clients launch) or streamable-http.")]
    = "stdio",
    host: Annotated[str, typer.Option(help="streamable-http: interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="streamable-http: port (the endpoint is /mcp).")] = 8001,
    policy: PolicyOpt = None,
    backend: BackendOpt = None,
    base_url: BaseUrlOpt = None,
    api: ApiOpt = None,
    adapter: AdapterOpt = None,
    temperature: TemperatureOpt = None,
    config: ConfigOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve an index to MCP clients: `search(query, mode, k)` (retrieval without the policy) and `ask(question)`
    (the routing policy's answer and trace). Logs go to stderr; stdout is the protocol's. Over streamable-http the
    server's keys (server.api_key, admin_key, index_keys) and Host/Origin allow-lists apply as for `routerag serve`."""
    if transport not in ("stdio", "streamable-http"):
        raise UsageError(f"--transport must be stdio or streamable-http, not {transport!r}")
    setup_logging(verbose)
    from server.app import served_name
    from server.mcp_tools import create_mcp, mcp_http_app, tool_names

    engine = load_engine(index, config, policy_overrides(policy, backend, base_url, adapter, temperature, api),
                         warm=True, server={"host": host, "port": port})
    settings = engine.settings
    srv = create_mcp(engine, settings)
    if transport == "stdio":
        err_console.print(f"MCP server for {index} on stdio (tools: {', '.join(tool_names(srv))}; policy "
                          f"{engine.generator.name})", highlight=False)
        srv.run("stdio")
        return
    import uvicorn

    app = mcp_http_app(srv, settings, [served_name(engine)])  # the REST server's guards and keys
    cfg = settings.server
    keyed = any(k is not None for k in (cfg.api_key, cfg.admin_key)) or bool(cfg.index_keys)
    err_console.print(f"MCP server for {index} on http://{host}:{port}/mcp (tools: {', '.join(tool_names(srv))}; "
                      f"policy {engine.generator.name}; auth {'on' if keyed else 'off'})", highlight=False)
    uvicorn.run(app, host=host, port=port, log_level="info" if verbose else "warning", access_log=verbose,
                lifespan="on", timeout_graceful_shutdown=5)
