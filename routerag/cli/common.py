"""Shared CLI plumbing: consoles, logging, and turning known errors into one clear line and an exit code."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.logging import RichHandler

console = Console()
err_console = Console(stderr=True)

#: The width of output that is not a terminal (a pipe, a log file): wide enough that no table or line is wrapped at
#: Rich's default of 80 columns ("GenAc / c"); tables are not expanded, so they stay as wide as their content.
PIPED_WIDTH = 10_000

F = TypeVar("F", bound=Callable[..., Any])


class UsageError(ValueError):
    """The command line is wrong (a flag combination, a flag's value): exit code 2, like Click's own usage errors."""


#: Exit code 2: the invocation is wrong: the settings or flags (``SettingsError``, pydantic's validation), a query the
#: retriever cannot take, a path argument that does not exist or would be overwritten, ids that name nothing.
#: Everything else (a corrupt index, a bad corpus line, an unreachable server, ...) is a runtime error: exit code 1.
USAGE_ERRORS: tuple[type[BaseException], ...] = (UsageError, FileNotFoundError, FileExistsError, KeyError,
                                                 IsADirectoryError, NotADirectoryError)

#: Runtime errors whose message is the whole story (a file and line, an index file at fault): no type name shown.
DATA_ERRORS: tuple[type[BaseException], ...] = (ValueError, PermissionError)


def configure_output() -> None:
    """Process-wide output conventions, applied before any command runs: full-width output when not on a terminal
    (unless ``COLUMNS`` says otherwise), and the libraries' per-load progress bars off ("Loading weights")."""
    import os

    for c in (console, err_console):
        if not c.is_terminal and "COLUMNS" not in os.environ:
            c.width = PIPED_WIDTH
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def silence_library_warnings() -> None:
    """Deprecation notices are about a library's future, not the user's run (transformers warns on every model
    load): hidden unless ``-v``, ``PYTHONWARNINGS`` or ``ROUTERAG_DEBUG`` asks for them."""
    import os
    import warnings

    if os.environ.get("PYTHONWARNINGS") or os.environ.get("ROUTERAG_DEBUG"):
        return
    for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


ACCESS_LOGGER = "uvicorn.access"
"""uvicorn's access lines: ``args`` are (client, method, path, HTTP version, status)."""
LogFormat = Literal["text", "json"]


class _StatusOrWarning(logging.Filter):
    """Without ``-v``: warnings, the one-time-work lines (records logged with ``extra={"status": True}``: an ONNX
    export, a model conversion, a model load), so a command is not silent while it spends seconds on them, and the
    server's access lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        from graph_index.status import STATUS_ATTR

        return (record.levelno >= logging.WARNING or bool(getattr(record, STATUS_ATTR, False))
                or record.name == ACCESS_LOGGER)


def _json_formatter() -> logging.Formatter:
    """One JSON object per line (python-json-logger), an access line's parts as fields of their own."""
    from pythonjsonlogger.json import JsonFormatter

    class Formatter(JsonFormatter):
        def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message: dict[str, Any]) -> None:
            super().add_fields(log_data, record, message)
            if record.name == ACCESS_LOGGER and isinstance(record.args, tuple) and len(record.args) == 5:
                client, method, path, version, status = record.args
                log_data.update(client=client, method=method, path=path, http_version=version, status=status)

    return Formatter("{asctime}{levelname}{name}{message}", style="{", rename_fields={"asctime": "time",
                                                                                     "levelname": "level",
                                                                                     "name": "logger"})


def setup_logging(verbose: bool, log_format: LogFormat = "text") -> None:
    """Every record on stderr, one format: Rich on a terminal, plain lines on a pipe, or JSON lines."""
    handler: logging.Handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False)
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_json_formatter())
    elif not err_console.is_terminal:  # a pipe or a log file: plain lines (Rich would pad each to the full width)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    if not verbose:
        handler.addFilter(_StatusOrWarning())
        silence_library_warnings()
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler], force=True)
    for noisy in ("httpx", "sentence_transformers", "transformers", "faiss", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(message: str, code: int = 2) -> None:
    # escaped: messages name settings sections as "[server]", which Rich would otherwise take for markup and drop
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def exit_code(exc: BaseException) -> int:
    """2 for a usage error (see :data:`USAGE_ERRORS`), 1 for a runtime error."""
    from pydantic import ValidationError

    from graph_index.config import SettingsError
    from graph_index.layout import IndexNotFoundError

    from ..retrieval.types import QueryError

    usage = (*USAGE_ERRORS, SettingsError, ValidationError, IndexNotFoundError, QueryError)
    return 2 if isinstance(exc, usage) else 1


def handle_errors(fn: F) -> F:
    """Report errors as ``error: <message>`` without a traceback (``ROUTERAG_DEBUG=1`` shows it): usage errors exit
    2, runtime errors 1 (an unexpected one also names its type)."""
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
            code = exit_code(exc)
            if code == 2 or isinstance(exc, (*DATA_ERRORS, IndexFormatError)):
                fail(str(msg), code)
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
                                   timeout_s=settings.retrieval.shard_timeout_s, cfg=settings.retrieval)
    engine = Engine(index, settings, shards=sharded)
    if warm:
        engine.warm_up()
    return engine


def policy_overrides(policy: str | None, backend: str | None, base_url: str | None, adapter: str | None,
                     temperature: float | None, api: str | None = None) -> dict:
    """The policy flags → the ``policy.generator`` section of :class:`~routerag.config.Settings`."""
    return {"generator": {"model": policy, "backend": backend, "base_url": base_url, "adapter": adapter,
                          "temperature": temperature, "api": api}}
