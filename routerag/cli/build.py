"""``routerag build-graph``, ``routerag info`` and ``routerag index add|delete``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from graph_index.lock import DEFAULT_LOCK_TIMEOUT_S

from ..config import Settings, load_settings
from .common import (ConfigOpt, JsonOpt, UsageError, VerboseOpt, console, err_console, handle_errors, print_json,
                     setup_logging)

SkipBadOpt = Annotated[bool, typer.Option(
    "--skip-bad", help="Skip and count (per kind) malformed corpus records: invalid JSON or UTF-8, missing fields, "
                       "clashing ids, oversize passages.")]
OversizeOpt = Annotated[Optional[str], typer.Option(
    help="A passage over --max-passage-chars: error (file:line; --skip-bad skips it), skip, or split it.")]
MaxCharsOpt = Annotated[Optional[int], typer.Option(help="Longest passage in characters (100000).")]
LockTimeoutOpt = Annotated[float, typer.Option(
    help="Seconds to wait while another process writes the same index (0: fail at once).")]
CacheDirOpt = Annotated[Optional[Path], typer.Option(help="Cache of OpenIE and embeddings.")]


INDEX_HELP = """Change an existing index without a full rebuild, and copy it (snapshot, restore).

An index path is a link to a hidden version directory beside it (indexes/sample -> .sample.v0003): `cp -r` or `tar`
of the path copies only the link, which dangles in its new place. Copy an index with `index snapshot` (one
self-contained, verified file) and `index restore`."""


def register(app: typer.Typer) -> None:
    app.command("build-graph")(build_graph_cmd)
    app.command("info")(info_cmd)
    index_app = typer.Typer(help=INDEX_HELP, no_args_is_help=True)
    index_app.command("add")(index_add_cmd)
    index_app.command("delete")(index_delete_cmd)
    index_app.command("snapshot")(index_snapshot_cmd)
    index_app.command("restore")(index_restore_cmd)
    app.add_typer(index_app, name="index")


def _settings(config: Path | None, **overrides: Any) -> Settings:
    return load_settings(Settings, config, **overrides)


def _corpus(skip_bad: bool, oversize: str | None, max_passage_chars: int | None) -> dict[str, Any]:
    """The corpus flags as the ``[corpus]`` section's overrides (an unset flag leaves the file's or the default)."""
    return {"skip_bad": skip_bad or None, "oversize": oversize, "max_passage_chars": max_passage_chars}


@handle_errors
def build_graph_cmd(
    corpus: Annotated[list[Path], typer.Argument(help="Corpus files: .jsonl, or .json lists of {title, text}.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Index directory to create.")],
    extractor: Annotated[Optional[str], typer.Option(help="OpenIE extractor: cpu (spaCy) or llm.")] = None,
    embedder: Annotated[Optional[str], typer.Option(
        help="minilm (embedded), a local folder, a Hugging Face name, or openai:MODEL.")] = None,
    embed_base_url: Annotated[Optional[str], typer.Option(help="Base URL of an OpenAI-compatible embeddings API.")] = None,
    llm_base_url: Annotated[Optional[str], typer.Option(help="Base URL of the OpenIE LLM (OpenAI-compatible).")] = None,
    llm_model: Annotated[Optional[str], typer.Option(help="Model name of the OpenIE LLM.")] = None,
    llm_backend: Annotated[Optional[str], typer.Option(help="openai (any compatible server) or vllm (offline).")] = None,
    openie_results: Annotated[Optional[Path], typer.Option(
        help="Import precomputed OpenIE (HippoRAG's results JSON); passages not in it are extracted.")] = None,
    index_type: Annotated[Optional[str], typer.Option(help="Dense index: flat, ivf or hnsw.")] = None,
    synonymy_threshold: Annotated[Optional[float], typer.Option(help="Cosine for synonymy edges (0.8).")] = None,
    workers: Annotated[Optional[int], typer.Option(help="CPU extractor processes (default: one per core).")] = None,
    cache_dir: CacheDirOpt = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")] = False,
    skip_bad: SkipBadOpt = False,
    oversize: OversizeOpt = None,
    max_passage_chars: MaxCharsOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing index at --out.")] = False,
    lock_timeout: LockTimeoutOpt = DEFAULT_LOCK_TIMEOUT_S,
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Run extraction and embedding on Ray: auto (a running cluster), ray://HOST:PORT, or local (a "
                      "Ray started for this build). Batches finished by a killed run are not run again.")] = None,
    ray_batch_size: Annotated[int, typer.Option(help="Passages per Ray batch (one result file each).")] = 256,
    shards: Annotated[Optional[int], typer.Option(
        "--shards", min=1, help="Split the corpus into N shards along the graph's communities (shards.method) and "
                                "build one index each, OUT/shard-000 ..., each also holding a halo of the "
                                "others' passages linked to its own (shards.halo_*); serve each and put "
                                "`routerag serve --shards URL,...` before them.")] = None,
    config: ConfigOpt = None,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Build the dense passage index and the OpenIE knowledge graph over a corpus."""
    setup_logging(verbose)
    from graph_index.builder import build_index

    cfg = _settings(
        config,
        corpus=_corpus(skip_bad, oversize, max_passage_chars),
        embedder={"name": embedder, "base_url": embed_base_url},
        extractor={"kind": extractor, "llm_base_url": llm_base_url, "llm_model": llm_model,
                   "llm_backend": llm_backend, "n_process": workers},
        dense={"kind": index_type},
        graph={"synonymy_threshold": synonymy_threshold},
        cache_dir=cache_dir,
        use_cache=False if no_cache else None,
    )
    if cfg.extractor.kind == "llm" and not (cfg.extractor.llm_model and (cfg.extractor.llm_base_url
                                                                          or cfg.extractor.llm_backend == "vllm")):
        raise UsageError("--extractor llm needs --llm-model and --llm-base-url (or --llm-backend vllm)")
    if shards is not None:
        if ray is not None:
            raise UsageError("--shards builds each shard locally; it does not combine with --ray")
        from graph_index.partition import build_shards

        record = build_shards(corpus, out, cfg, shards, force=force, progress=not json_out,
                              openie_results=openie_results)
        if json_out:
            print_json(record)
        else:
            names = ", ".join(f"{s['name']} ({s['passages']:,} passages + {s.get('halo', 0):,} halo)"
                              for s in record["shards"])
            console.print(f"built {len(record['shards'])} shards in {out}: {names}; partition {record['partition']}")
        return
    if ray is not None:
        if openie_results is not None:
            raise UsageError("--openie-results imports extraction results; it does not combine with --ray")
        from graph_index.ray_build import build_index_ray

        manifest = build_index_ray(corpus, out, cfg, address=None if ray == "local" else ray, force=force,
                                   batch_size=ray_batch_size, progress=not json_out, lock_timeout=lock_timeout)
    else:
        manifest = build_index(corpus, out, cfg, openie_results=openie_results, force=force,
                               progress=not json_out, lock_timeout=lock_timeout)
    _report(manifest, out, "built", json_out)


@handle_errors
def index_add_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    corpus: Annotated[list[Path], typer.Argument(help="Corpus files with the passages to add.")],
    openie_results: Annotated[Optional[Path], typer.Option(help="Precomputed OpenIE for the new passages.")] = None,
    cache_dir: CacheDirOpt = None,
    skip_bad: SkipBadOpt = False,
    oversize: OversizeOpt = None,
    max_passage_chars: MaxCharsOpt = None,
    lock_timeout: LockTimeoutOpt = DEFAULT_LOCK_TIMEOUT_S,
    config: ConfigOpt = None,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Add passages to an index; the result equals a full rebuild of the combined corpus."""
    setup_logging(verbose)
    from graph_index.builder import add_to_index

    cfg = _settings(config, corpus=_corpus(skip_bad, oversize, max_passage_chars), cache_dir=cache_dir)
    manifest = add_to_index(index, corpus, cfg, openie_results=openie_results, progress=not json_out,
                            lock_timeout=lock_timeout)
    _report(manifest, index, "updated", json_out)


@handle_errors
def index_delete_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    ids: Annotated[Optional[list[str]], typer.Option("--ids", help="Passage ids (repeat, or comma-separate).")] = None,
    ids_file: Annotated[Optional[Path], typer.Option(help="File with one passage id per line.")] = None,
    cache_dir: CacheDirOpt = None,
    lock_timeout: LockTimeoutOpt = DEFAULT_LOCK_TIMEOUT_S,
    config: ConfigOpt = None,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Delete passages by id; the result equals a full rebuild without them."""
    setup_logging(verbose)
    from graph_index.builder import delete_from_index

    wanted = [i.strip() for chunk in (ids or []) for i in chunk.split(",") if i.strip()]
    if ids_file is not None:
        wanted += [line.strip() for line in ids_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not wanted:
        raise UsageError("give the passage ids to delete with --ids or --ids-file")
    cfg = _settings(config, cache_dir=cache_dir)
    manifest = delete_from_index(index, wanted, cfg, progress=not json_out, lock_timeout=lock_timeout)
    _report(manifest, index, "updated", json_out)


@handle_errors
def index_snapshot_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory (the link).")],
    dest: Annotated[Path, typer.Argument(help="A folder (the file is named INDEX.vNNNN.TIME.snapshot.tar) or a "
                                              "FILE.tar; created if missing.")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing snapshot file.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write the index's current version into one self-contained snapshot file (like Qdrant's snapshots): the way
    to back up or copy an index (`cp -r` copies only its link). Every file's sha256 is checked against the
    manifest while it is copied; the file appears complete or not at all, and writers may go on meanwhile."""
    from graph_index.snapshot import write_snapshot

    header = write_snapshot(index, dest, force=force)
    if json_out:
        print_json(header)
        return
    console.print(f"[bold green]snapshot[/] {header['path']}: {index} {header['version']}, {header['passages']:,} "
                  f"passages, {len(header['files'])} files, {header['bytes'] / 2**20:,.1f} MiB, sha256 verified",
                  highlight=False)


@handle_errors
def index_restore_cmd(
    snapshot: Annotated[Path, typer.Argument(help="A snapshot file (`routerag index snapshot`).")],
    index: Annotated[Path, typer.Argument(help="Index directory to restore into (created if absent).")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing index (as a new version of it).")] = False,
    lock_timeout: LockTimeoutOpt = DEFAULT_LOCK_TIMEOUT_S,
    json_out: JsonOpt = False,
) -> None:
    """Restore a snapshot as the index's next version, under its write lock: every file is checked against the
    snapshot's list and the manifest before the version is published, so a truncated or damaged snapshot is
    refused and the index is left as it was. A running server keeps its version until restarted."""
    from graph_index.snapshot import restore_snapshot

    manifest = restore_snapshot(snapshot, index, force=force, lock_timeout=lock_timeout)
    if json_out:
        print_json(manifest)
        return
    src = manifest["restored"]["source"]
    console.print(f"[bold green]restored[/] {index} ({manifest['restored']['version']}) from {snapshot}: "
                  f"{manifest['counts']['passages']:,} passages, snapshot of {src['index']} {src['version']} taken "
                  f"{src['created']}; verified", highlight=False)


@handle_errors
def info_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    top: Annotated[int, typer.Option(help="How many hub entities to list.")] = 10,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Also recompute every file's sha256 and compare it with the manifest (reads every byte).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Print an index's manifest and graph statistics, after checking every file against the manifest.

    Exits non-zero, naming the file, when a file is missing, truncated or unreadable, when counts disagree, or
    (with --verify) when a checksum does not match."""
    import time

    from graph_index.graph import graph_stats
    from graph_index.store import IndexData
    from graph_index.versions import shared_with

    if (other := shared_with(index)) is not None:
        err_console.print(f"[bold yellow]warning:[/] {index} links to {os.readlink(index)}, a version of {other}: it is "
                          f"the same files, not a copy (as `cp -r` makes); changing a file changes {other} too. Copy "
                          "an index with `routerag index snapshot` and `routerag index restore`.", highlight=False)
    with IndexData(index) as data:
        data.check()
        verified = None
        if verify:
            t0 = time.perf_counter()
            files = data.verify()
            verified = {"files": files, "seconds": round(time.perf_counter() - t0, 3)}
        g = data.graph
        stats = graph_stats(g)
        n_pass = stats["passage_nodes"]
        degree = g.degree()
        hubs = sorted(range(n_pass, g.vcount()), key=lambda v: -degree[v])[:top]
        hub_list = [{"entity": data.entities[v - n_pass], "degree": degree[v],
                     "passages": int(data.entity_passage_counts[v - n_pass])} for v in hubs]
        version = data.version
    if json_out:
        print_json({"path": str(index), "version": version, "manifest": data.manifest, "graph": stats,
                    "hubs": hub_list, "verified": verified})
        return
    m = data.manifest
    console.print(f"[bold]{index}[/]  created {m['created']}, updated {m['updated']}  ({version})")
    console.print(f"embedder  {m['embedder']['identity']} (dim {m['embedder']['dim']})")
    console.print(f"extractor {m['extractor']['identity']}")
    console.print(f"dense     {m['dense_index']}")
    if verified:
        console.print(f"verified  {verified['files']} files, sha256 as recorded ({verified['seconds']:.2f} s)")
    console.print(_counts_table(stats, "graph"))
    t = Table(title=f"top {len(hub_list)} entities by degree")
    for col in ("entity", "degree", "passages"):
        t.add_column(col, justify="left" if col == "entity" else "right")
    for h in hub_list:
        t.add_row(h["entity"], str(h["degree"]), str(h["passages"]))
    console.print(t)


def _counts_table(counts: dict[str, Any], title: str) -> Table:
    t = Table(title=title, show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    for k, v in counts.items():
        t.add_row(k.replace("_", " "), f"{v:,}" if isinstance(v, int) else str(v))
    return t


def _report(manifest: dict[str, Any], out: Path, verb: str, json_out: bool) -> None:
    if json_out:
        print_json(manifest)
        return
    c = manifest["counts"]
    corpus = manifest.get("corpus") or {}
    oie = manifest.get("openie") or {}
    last = (manifest.get("history") or [{}])[-1]
    published = last.get("published", True)
    console.print(f"[bold green]{verb}[/] {out}" if published else
                  f"[bold]unchanged[/] {out}: every passage is already indexed, no new version written")
    if last.get("op") == "add" and verb == "updated":
        console.print(f"{last.get('added', 0)} added, {corpus.get('duplicates', 0)} duplicates "
                      f"({corpus.get('already_indexed', 0)} already indexed); the index holds {c['passages']:,} "
                      "passages", highlight=False)
    if not published:
        return  # the manifest's timings and counts are the current version's, reported when it was written
    summary = {
        "passages": c["passages"],
        "entities": c["entities"],
        "facts": c["facts"],
        "synonymy edges": c["synonymy_edges"],
        "graph nodes / edges": f"{c['nodes']:,} / {c['edges']:,}",
    }
    if corpus:
        summary["duplicates dropped"] = corpus.get("duplicates", 0)
        kinds = corpus.get("skipped_by_kind") or {}
        detail = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in kinds.items())
        skipped = corpus.get("skipped", 0)
        summary["bad records skipped"] = f"{skipped} ({detail})" if detail else skipped
        if corpus.get("split"):
            summary["oversize passages split"] = corpus["split"]
    if oie:
        summary["openie extracted / cached / imported"] = (
            f"{oie.get('extracted', 0)} / {oie.get('cached', 0)} / {oie.get('imported', 0)}")
        summary["openie failures"] = oie.get("failed_total", 0)
    summary["peak RSS (MB)"] = manifest.get("peak_rss_mb", "")
    console.print(_counts_table(summary, "index"))
    t = Table(title="seconds per stage")
    t.add_column("stage")
    t.add_column("s", justify="right")
    total = 0.0
    for stage, s in manifest["timings_s"].items():
        t.add_row(stage, f"{s:.2f}")
        total += s
    t.add_row("[bold]total[/]", f"[bold]{total:.2f}[/]")
    console.print(t)
