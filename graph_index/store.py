"""The index directory: its files, its manifest, atomic writes and loading.

Layout (all written into a temporary sibling directory, then renamed into place, so a failed or killed build
never leaves a half-written index)::

    manifest.json            versions, embedder, extractor, config, counts, timings
    passages.jsonl           {"id", "title", "text"} per passage; row i is graph vertex i
    openie.jsonl             per passage: extracted entities and triples (surface forms) and their source
    entities.jsonl           {"name", "passages"} per entity; row j is graph vertex P + j
    facts.jsonl              [subject, relation, object] per unique normalised fact
    synonyms.jsonl           {"entity", "keeps": [[entity, cosine], ...]} synonym lists
    passage_embeddings.npy   float32, unit rows (also entity_/fact_embeddings.npy)
    passages.faiss           the dense index (CPU form)
    graph.graphml            the knowledge graph, written by python-igraph
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

import faiss
import igraph as ig
import numpy as np

from routerag.corpus import Passage, read_jsonl, write_jsonl

from .openie.base import OpenIEResult, Triple
from .synonymy import Selections

FORMAT = "routerag-index"
FORMAT_VERSION = 1

MANIFEST = "manifest.json"
PASSAGES = "passages.jsonl"
OPENIE = "openie.jsonl"
ENTITIES = "entities.jsonl"
FACTS = "facts.jsonl"
SYNONYMS = "synonyms.jsonl"
PASSAGE_EMB = "passage_embeddings.npy"
ENTITY_EMB = "entity_embeddings.npy"
FACT_EMB = "fact_embeddings.npy"
DENSE = "passages.faiss"
GRAPH = "graph.graphml"
ALL_FILES = (MANIFEST, PASSAGES, OPENIE, ENTITIES, FACTS, SYNONYMS, PASSAGE_EMB, ENTITY_EMB, FACT_EMB, DENSE, GRAPH)


class IndexFormatError(RuntimeError):
    """The directory is not a (complete, compatible) RouteRAG index."""


@contextmanager
def atomic_directory(out: Path, *, force: bool) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``out``; on success it replaces ``out`` in one rename.

    An existing ``out`` is replaced only with ``force`` (or when it is itself a RouteRAG index being updated,
    which callers signal with ``force=True``). On any exception the temporary directory is removed and ``out``
    is untouched.
    """
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise FileExistsError(f"{out} is a non-empty directory that is not a RouteRAG index; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_index_files(
    d: Path,
    *,
    manifest: dict[str, Any],
    passages: list[Passage],
    openie: list[OpenIEResult],
    entities: list[str],
    entity_passages: list[int],
    facts: list[Triple],
    synonyms: Selections,
    passage_emb: np.ndarray,
    entity_emb: np.ndarray,
    fact_emb: np.ndarray,
    dense: faiss.Index,
    graph: ig.Graph,
) -> None:
    write_jsonl(d / PASSAGES, (p.to_json() for p in passages))
    write_jsonl(d / OPENIE, ({"id": p.id, **r.to_json()} for p, r in zip(passages, openie)))
    write_jsonl(d / ENTITIES, ({"name": e, "passages": n} for e, n in zip(entities, entity_passages)))
    write_jsonl(d / FACTS, (list(f) for f in facts))
    write_jsonl(d / SYNONYMS, ({"entity": e, "keeps": [[k, s] for k, s in kept]} for e, kept in sorted(synonyms.items())))
    np.save(d / PASSAGE_EMB, np.ascontiguousarray(passage_emb, dtype=np.float32))
    np.save(d / ENTITY_EMB, np.ascontiguousarray(entity_emb, dtype=np.float32))
    np.save(d / FACT_EMB, np.ascontiguousarray(fact_emb, dtype=np.float32))
    faiss.write_index(dense, str(d / DENSE))
    graph.write_graphml(str(d / GRAPH))
    # the manifest goes last: its presence marks a complete directory
    (d / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def update_manifest(path: Path, changes: dict[str, Any]) -> None:
    """Merge ``changes`` into an index's manifest, atomically (write a sibling file, then rename)."""
    mf = Path(path) / MANIFEST
    manifest = json.loads(mf.read_text(encoding="utf-8"))
    manifest.update(changes)
    tmp = mf.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, mf)


def read_manifest(path: Path) -> dict[str, Any]:
    path = Path(path)
    mf = path / MANIFEST
    if not path.is_dir():
        raise IndexFormatError(f"{path}: no such index directory")
    if not mf.is_file():
        raise IndexFormatError(f"{path}: not a RouteRAG index (no {MANIFEST}); build one with `routerag build-graph`")
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{mf}: unreadable manifest ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise IndexFormatError(f"{mf}: not a RouteRAG index manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format {manifest.get('format_version')} is not supported by this version "
            f"(expects {FORMAT_VERSION}); rebuild it with `routerag build-graph`")
    missing = [f for f in ALL_FILES if not (path / f).is_file()]
    if missing:
        raise IndexFormatError(f"{path}: incomplete index, missing {', '.join(missing)}")
    return manifest


class IndexData:
    """A built index on disk; every part is read on first use (embeddings memory-mapped)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)

    @cached_property
    def passages(self) -> list[Passage]:
        return [Passage(id=r["id"], title=r["title"], text=r["text"]) for r in read_jsonl(self.path / PASSAGES)]

    @cached_property
    def openie(self) -> list[OpenIEResult]:
        return [OpenIEResult.from_json(r) for r in read_jsonl(self.path / OPENIE)]

    @cached_property
    def entities(self) -> list[str]:
        return [r["name"] for r in read_jsonl(self.path / ENTITIES)]

    @cached_property
    def entity_passage_counts(self) -> np.ndarray:
        return np.array([r["passages"] for r in read_jsonl(self.path / ENTITIES)], dtype=np.int64)

    @cached_property
    def facts(self) -> list[Triple]:
        return [tuple(r) for r in read_jsonl(self.path / FACTS)]  # type: ignore[misc]

    @cached_property
    def synonyms(self) -> Selections:
        return {r["entity"]: [(k, float(s)) for k, s in r["keeps"]] for r in read_jsonl(self.path / SYNONYMS)}

    @cached_property
    def passage_emb(self) -> np.ndarray:
        return np.load(self.path / PASSAGE_EMB, mmap_mode="r")

    @cached_property
    def entity_emb(self) -> np.ndarray:
        return np.load(self.path / ENTITY_EMB, mmap_mode="r")

    @cached_property
    def fact_emb(self) -> np.ndarray:
        return np.load(self.path / FACT_EMB, mmap_mode="r")

    @cached_property
    def dense(self) -> faiss.Index:
        return faiss.read_index(str(self.path / DENSE))

    @cached_property
    def graph(self) -> ig.Graph:
        g = ig.Graph.Read_GraphML(str(self.path / GRAPH))
        # GraphML stores numbers as doubles; the bitmask is an integer
        if g.ecount():
            g.es["kinds"] = [int(k) for k in g.es["kinds"]]
        return g

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.manifest.get("counts", {}))
