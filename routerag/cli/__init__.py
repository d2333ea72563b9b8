"""The ``routerag`` command: one Typer app, one module per group of subcommands."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from . import ask, build, evaluate, mcp, reader, reference, search, serve, train
from .common import configure_output

app = typer.Typer(
    name="routerag",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"routerag {__version__}")
        raise typer.Exit()


@app.callback()
def _conventions(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Graph-text hybrid RAG with a learned router: build indexes, search, ask, serve, evaluate, train.

    Exit codes: 0 done, 1 a runtime error (a corrupt index, a bad corpus line, an unreachable server), 2 a usage
    error (an unknown flag, a bad value or setting, a path that does not exist)."""
    configure_output()

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
