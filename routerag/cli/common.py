"""Shared CLI plumbing: consoles, logging, and turning known errors into one clear line and an exit code."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.logging import RichHandler

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

#: Exceptions that mean "the user's input is wrong": reported in one line, exit code 2.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, FileExistsError, KeyError,
                                                PermissionError, IsADirectoryError, NotADirectoryError)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(console=err_console, show_path=False, rich_tracebacks=False)],
                        force=True)
    for noisy in ("httpx", "sentence_transformers", "transformers", "faiss", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(message: str, code: int = 2) -> None:
    # escaped: messages name settings sections as "[server]", which Rich would otherwise take for markup and drop
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Report user errors as ``error: <message>`` (exit 2) and runtime failures likewise (exit 1), without a
    traceback; ``ROUTERAG_DEBUG=1`` shows it."""
    from graph_index.store import IndexFormatError

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import os

        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            if os.environ.get("ROUTERAG_DEBUG"):
                raise
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            if isinstance(exc, (*USER_ERRORS, IndexFormatError)):
                fail(str(msg), 2)
            fail(f"{type(exc).__name__}: {msg}", 1)
        return None

    return wrapper  # type: ignore[return-value]


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


# Options several commands share, declared once.
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="TOML file with settings.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
PolicyOpt = Annotated[Optional[str], typer.Option(help="Policy model: smollm2-routerag (embedded, trained), smollm2 "
                                                       "(embedded base), a folder, a hub name, or the served model "
                                                       "name for --backend openai.")]
BackendOpt = Annotated[Optional[str], typer.Option(help="transformers, openai or vllm.")]
BaseUrlOpt = Annotated[Optional[str], typer.Option(help="OpenAI-compatible server of the policy.")]
AdapterOpt = Annotated[Optional[str], typer.Option(help="LoRA adapter folder for the policy.")]
TemperatureOpt = Annotated[Optional[float], typer.Option(help="Sampling temperature (0 = greedy).")]
ApiOpt = Annotated[Optional[str], typer.Option(help="With --backend openai: chat (/v1/chat/completions, the default; "
                                                    "every modern server) or completions (/v1/completions, legacy).")]


def load_engine(index: Path | None, config: Path | None, policy: dict, *, warm: bool = False,
                shards: list[str] | None = None, **sections: Any) -> Any:
    """What every command that runs the policy starts with: BLAS threads limited, the settings read (defaults, the
    ``--config`` file, ``ROUTERAG_*`` variables, then these flags: ``policy`` from :func:`policy_overrides` and any
    other ``sections``), and the :class:`~routerag.engine.Engine` built, over ``index`` or over shard servers;
    ``warm`` loads the graph and the query encoder now (servers, so their first request does not pay for it)."""
    from ..config import Settings, load_settings
    from ..engine import Engine
    from ..runtime import configure_threads

    configure_threads()
    settings = load_settings(Settings, config, policy=policy, **sections)
    sharded = None
    if shards:
        from ..retrieval.shards import ShardedRetriever

        key = settings.server.api_key
        sharded = ShardedRetriever(shards, api_key=key.get_secret_value() if key else None,
                                   timeout_s=settings.retrieval.shard_timeout_s, rrf_k=settings.retrieval.rrf_k)
    engine = Engine(index, settings, shards=sharded)
    if warm:
        engine.warm_up()
    return engine


def policy_overrides(policy: str | None, backend: str | None, base_url: str | None, adapter: str | None,
                     temperature: float | None, api: str | None = None) -> dict:
    """The policy flags → the ``policy.generator`` section of :class:`~routerag.config.Settings`."""
    return {"generator": {"model": policy, "backend": backend, "base_url": base_url, "adapter": adapter,
                          "temperature": temperature, "api": api}}
