"""The ``routerag`` command: one Typer app, one module per group of subcommands."""

from __future__ import annotations

import typer

from .. import __version__
from . import ask, build, evaluate, mcp, reader, reference, search, serve, train

app = typer.Typer(
    name="routerag",
    help="Graph-text hybrid RAG with a learned router: build indexes, search, ask, serve, evaluate, train.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
build.register(app)
search.register(app)
ask.register(app)
serve.register(app)
mcp.register(app)
train.register(app)
reader.register(app)
evaluate.register(app)
reference.register(app)


@app.command("version")
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app()
