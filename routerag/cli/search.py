"""``routerag search``: retrieval from the command line, one query or a file of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..config import Settings, load_settings
from .common import UsageError, console, handle_errors, setup_logging


def register(app: typer.Typer) -> None:
    app.command("search")(search_cmd)


@handle_errors
def search_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    query: Annotated[Optional[str], typer.Argument(help="The query (or use --queries).")] = None,
    queries: Annotated[Optional[Path], typer.Option(help="File with one query per line.")] = None,
    mode: Annotated[Optional[str], typer.Option(help="passage, graph or hybrid.")] = None,
    k: Annotated[Optional[int], typer.Option("-k", "--top-k",
                                             help="Passages per query (default: retrieval.k, 3).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per query per line.")] = False,
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML file with settings.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Retrieve passages: dense (passage), Personalized PageRank over the graph (graph), or both fused (hybrid)."""
    setup_logging(verbose)
    from ..retrieval import Retriever
    from ..runtime import configure_threads

    configure_threads()
    if (query is None) == (queries is None):
        raise UsageError("give exactly one of a QUERY argument or --queries FILE")
    if queries is not None:
        if not queries.is_file():
            raise FileNotFoundError(f"{queries}: no such file")
        batch = [line.strip() for line in queries.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not batch:
            raise ValueError(f"{queries}: no queries")
    else:
        batch = [query or ""]
    cfg = load_settings(Settings, config, retrieval={"mode": mode, "k": k}).retrieval
    retriever = Retriever(index, cfg)
    results = retriever.search(batch, mode=cfg.mode, k=cfg.k)
    if json_out:
        for r in results:
            sys.stdout.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
        return
    for r in results:
        t = Table(title=f"{r.mode}: {r.query}  ({r.ms:.1f} ms)", title_justify="left")
        t.add_column("#", justify="right")
        t.add_column("score", justify="right")
        t.add_column("title")
        t.add_column("text")
        for i, d in enumerate(r.docs, 1):
            t.add_row(str(i), f"{d.score:.4f}", d.title, d.text[:120] + ("…" if len(d.text) > 120 else ""))
        console.print(t)
        if r.fallback:
            console.print(f"[yellow]note:[/] {r.fallback}")
