"""``routerag ask``: run the policy loop once, without a server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .common import (AdapterOpt, ApiOpt, BackendOpt, BaseUrlOpt, ConfigOpt, PolicyOpt, TemperatureOpt,
                     policy_overrides, console, handle_errors, load_engine, setup_logging)


def register(app: typer.Typer) -> None:
    app.command("ask")(ask_cmd)


@handle_errors
def ask_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    question: Annotated[str, typer.Argument(help="The question.")],
    mode: Annotated[str, typer.Option(help="learned (the policy routes), or force passage, graph or hybrid.")] = "learned",
    budget: Annotated[Optional[int], typer.Option(
        help="Searches before an answer is forced (default: the policy's card, else 4).")] = None,
    k: Annotated[Optional[int], typer.Option("-k", help="Documents per search (default: the policy's card, else "
                                                        "3).")] = None,
    policy: PolicyOpt = None,
    backend: BackendOpt = None,
    base_url: BaseUrlOpt = None,
    api: ApiOpt = None,
    adapter: AdapterOpt = None,
    temperature: TemperatureOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the answer and the full trace as JSON.")] = False,
    config: ConfigOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Answer one question with the routing policy: it reasons, searches (passage, graph or both) and answers."""
    setup_logging(verbose)
    engine = load_engine(index, config, policy_overrides(policy, backend, base_url, adapter, temperature, api))
    traj = asyncio.run(engine.ask(question, mode=mode, budget=budget, k=k))  # type: ignore[arg-type]
    if json_out:
        sys.stdout.write(json.dumps({"question": traj.question, **traj.summary().to_json(), "text": traj.text},
                                    ensure_ascii=False, indent=2) + "\n")
        return
    t = Table(title=question, title_justify="left")
    for col in ("#", "action", "mode", "query / draft answer", "docs", "retrieval ms", "generation ms"):
        t.add_column(col)
    for s in traj.steps:
        t.add_row(str(s.index), s.action, s.mode or "", s.query or s.answer or "", ", ".join(s.doc_titles),
                  f"{s.retrieval_ms:.1f}", f"{s.generation_ms:.0f}")
    console.print(t)
    if traj.refused:  # the policy said the documents do not answer: no answer, no citations
        console.print(f"[bold yellow]refused:[/] {traj.answer}   ({traj.searches} searches)", highlight=False)
        return
    # the final answer, labelled with its writer: the table's draft is the policy's, which a reader may replace
    console.print(f"[bold]answer:[/] {traj.answer if traj.answer is not None else '(none)'}"
                  f"   ({traj.searches} searches, {traj.finish}, by the {traj.answered_by})")
    cited = traj.summary().citations()
    for n, c in enumerate(cited, 1):
        console.print(f"  [{n}] {c.title}: {c.sentence}", highlight=False)
    if traj.answer and traj.searches and not cited:
        console.print("  (no retrieved passage states this answer)")

