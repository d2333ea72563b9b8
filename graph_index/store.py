"""The index directory: its files, its manifest, locked versioned writes, and checked loading.

One version of an index holds (written into a temporary sibling directory, then published as a new version by
:mod:`graph_index.versions`, so a failed or killed write never leaves a half-written index at the path)::

    manifest.json            versions, embedder, extractor, config, counts, timings, and per data file its
                             size, sha256 and rows (graph_index.integrity)
    passages.jsonl           {"id", "title", "text"} per passage; row i is graph vertex i
    openie.jsonl             per passage: extracted entities and triples (surface forms) and their source
    entities.jsonl           {"name", "passages"} per entity; row j is graph vertex P + j
    facts.jsonl              [subject, relation, object] per unique normalised fact
    synonyms.jsonl           {"entity", "keeps": [[entity, cosine], ...]} synonym lists
    passage_embeddings.npy   float32, unit rows (also entity_/fact_embeddings.npy)
    fact_embeddings.f16.npy  float16 copy of the fact rows (exact fact matching screens with it); optional, derived
    passages.faiss           the dense index (CPU form)
    graph.graphml            the knowledge graph, written by python-igraph

Writers (build, ``index add``, ``index delete``) hold the index's lock (:func:`write_lock`); readers never do,
except to add the float16 fact copy to an index written before it existed (once, without waiting).

Loading maps the big matrices instead of copying them: the ``.npy`` files with ``np.load(mmap_mode="r")``, a flat
FAISS index with ``IO_FLAG_MMAP_IFC``, the float16 fact copy from its own file. Their pages are then the page
cache's, shared by every process serving the index, and a server's anonymous memory does not grow with them.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import faiss
import igraph as ig
import numpy as np

from . import ann, integrity, versions
from .atomic import atomic_path
from .config import AnnConfig, DenseIndexConfig, IndexConfig
from .corpus import Passage, append_jsonl, write_jsonl
from .dense import maybe_to_gpu
from .graph import entity_vertices
from .layout import (ALL_FILES, ANN_FILES, DENSE, ENTITIES, ENTITY_EMB, FACT_EMB, FACT_EMB_F16, FACTS, FORMAT, FORMAT_VERSION,
                     GRAPH, MANIFEST, OPENIE, PASSAGE_EMB, PASSAGES, REBUILD_HINT, SYNONYMS, IndexFormatError,
                     IndexNotFoundError)
from .lock import DEFAULT_LOCK_TIMEOUT_S, IndexBusyError, index_lock
from .normalize import normalize_phrase
from .openie.base import OpenIEResult, Triple
from .synonymy import Selections

__all__ = ["ALL_FILES", "DEFAULT_LOCK_TIMEOUT_S", "FORMAT", "FORMAT_VERSION", "MANIFEST", "IndexBusyError",
           "IndexData", "IndexFormatError", "PassageFiles", "atomic_directory", "read_manifest", "release_freed_memory",
           "write_f16", "write_index_files", "write_npy_header",
           "write_lock", "write_manifest"]

T = TypeVar("T")
log = logging.getLogger(__name__)


@contextmanager
def write_lock(root: Path, *, timeout: float = DEFAULT_LOCK_TIMEOUT_S, op: str = "write",
               create: bool = False) -> Iterator[None]:
    """Be the only writer of the index at ``root`` for the ``with`` body (waiting at most ``timeout`` seconds),
    after repairing what a killed writer left: a missing link, temporary directories, incomplete versions.

    ``create``: the index may not exist yet (a build), so its parent folder is created.
    """
    root = Path(root)
    owner = versions.owner_of(root)
    if owner is not None:
        raise ValueError(f"{root} is a version of {owner}, never changed in place; write to {owner} instead")
    if create:
        root.parent.mkdir(parents=True, exist_ok=True)
    elif not root.parent.is_dir():
        raise IndexNotFoundError(f"{root}: no such index directory", root)
    with index_lock(root, timeout=timeout, op=op):
        versions.recover(root)
        versions.clean_stale(root)
        yield


@contextmanager
def atomic_directory(out: Path, *, force: bool) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``out``; on success it becomes the next version of ``out``.

    Call it under :func:`write_lock`. An existing ``out`` is replaced only with ``force`` (updates pass it too),
    and never when it is a non-index directory. On any exception the temporary directory is removed and ``out``
    is untouched. The previous version is kept (a reader may have it open); older ones go unless a reader pins them.
    """
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise FileExistsError(f"{out} is a non-empty directory that is not a RouteRAG index; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = versions.temp_dir(out)
    try:
        yield tmp
        new, previous = versions.publish(out, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    versions.prune(out, keep={new} if previous is None else {new, previous})


def write_npy_header(f: BinaryIO, dtype: Any, shape: tuple[int, ...]) -> None:
    """numpy's ``.npy`` header for a C-ordered ``dtype`` array of ``shape``, so that the rows written after it, a
    chunk at a time and without holding the matrix, make the file ``np.save`` would write."""
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})


class PassageFiles:
    """The per-passage files of a version being written (``passages.jsonl``, ``openie.jsonl``,
    ``passage_embeddings.npy``), appended a batch at a time, so a build never holds every passage's text, OpenIE or
    vector. The matrix is written as numpy's ``.npy`` (the header for ``rows`` rows, counted beforehand, then each
    batch's rows), byte for byte what ``np.save`` of the whole matrix writes; the rows go through the file, not a
    writable mapping, so they sit in the page cache and not in the process's resident set."""

    def __init__(self, d: Path, rows: int, dim: int) -> None:
        self.rows, self.dim, self.written = rows, dim, 0
        self._passages = open(d / PASSAGES, "w", encoding="utf-8")
        self._openie = open(d / OPENIE, "w", encoding="utf-8")
        self._emb = open(d / PASSAGE_EMB, "wb")
        write_npy_header(self._emb, np.float32, (rows, dim))

    def append(self, passages: Sequence[Passage], openie: Sequence[OpenIEResult], vectors: np.ndarray) -> None:
        """Write the next passages (in index order), their OpenIE and their vectors."""
        if self.written + len(passages) > self.rows:
            raise RuntimeError(f"more than the {self.rows:,} passages counted before the build: did the corpus change "
                               "while it was being built?")
        if vectors.shape != (len(passages), self.dim) or len(openie) != len(passages):
            raise ValueError(f"{len(passages)} passages with {len(openie)} OpenIE results and vectors of shape "
                             f"{vectors.shape}")
        append_jsonl(self._passages, (p.to_json() for p in passages))
        append_jsonl(self._openie, ({"id": p.id, **r.to_json()} for p, r in zip(passages, openie)))
        self._emb.write(np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
        self.written += len(passages)

    def close(self) -> None:
        """Close the files (the caller's directory is published or removed whole, so no fsync here)."""
        for f in (self._passages, self._openie, self._emb):
            f.close()

    def __enter__(self) -> PassageFiles:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close()
        if exc_type is None and self.written != self.rows:
            raise RuntimeError(f"{self.written:,} passages written, {self.rows:,} counted before the build: did the "
                               "corpus change while it was being built?")


def write_index_files(
    d: Path,
    *,
    manifest: dict[str, Any],
    passages: int,
    entities: list[str],
    entity_passages: list[int],
    facts: list[Triple],
    synonyms: Selections,
    entity_emb: np.ndarray,
    fact_emb: np.ndarray,
    dense: faiss.Index,
    graph: ig.Graph,
) -> None:
    """Write every data file but the per-passage ones (``passages`` rows of those are already in ``d``:
    :class:`PassageFiles`) into ``d`` and record each file's size, checksum and rows in ``manifest["files"]`` (the
    manifest itself is written by :func:`write_manifest`, last)."""
    write_jsonl(d / ENTITIES, ({"name": e, "passages": n} for e, n in zip(entities, entity_passages)))
    write_jsonl(d / FACTS, (list(f) for f in facts))
    write_jsonl(d / SYNONYMS, ({"entity": e, "keeps": [[k, s] for k, s in kept]} for e, kept in sorted(synonyms.items())))
    np.save(d / ENTITY_EMB, np.ascontiguousarray(entity_emb, dtype=np.float32))
    np.save(d / FACT_EMB, np.ascontiguousarray(fact_emb, dtype=np.float32))
    write_f16(d / FACT_EMB, d / FACT_EMB_F16)
    faiss.write_index(dense, str(d / DENSE))
    graph.write_graphml(str(d / GRAPH))
    rows = {PASSAGES: passages, OPENIE: passages, ENTITIES: len(entities), FACTS: len(facts), SYNONYMS: len(synonyms)}
    manifest["files"] = {name: integrity.file_record(d / name, rows.get(name))
                         for name in (*ALL_FILES[1:], FACT_EMB_F16)}


ANN_SOURCES = {"passages": PASSAGE_EMB, "facts": FACT_EMB}
"""The rows each approximate index (``ANN_FILES``) is built from."""


def write_ann(d: Path, which: str) -> Path:
    """Build the approximate index of ``which`` (``passages`` or ``facts``) from the version ``d``'s mapped rows
    and write it atomically beside them; returns its path."""
    rows = np.load(d / ANN_SOURCES[which], mmap_mode="r")
    index = ann.build(rows, name=f"{d.name}/{which}")
    with atomic_path(d / ANN_FILES[which]) as tmp:
        ann.write(index, tmp)
    return d / ANN_FILES[which]


def write_ann_files(d: Path, manifest: dict[str, Any], cfg: AnnConfig) -> None:
    """Write both approximate indexes into the version ``d`` when ``cfg`` wants them for its size, and record their
    checksums in ``manifest["files"]`` (which :func:`write_index_files` filled)."""
    if not cfg.wanted(int(manifest["counts"]["passages"])):
        return
    for which in ANN_FILES:
        path = write_ann(d, which)
        manifest["files"][path.name] = integrity.file_record(path, None)


F16_CHUNK_ROWS = 65_536
"""Rows converted per step when writing the float16 copy, so the conversion never holds the whole matrix."""


def write_f16(src: Path, dst: Path) -> None:
    """Write the float16 copy of the float32 ``.npy`` at ``src`` to ``dst`` atomically (a temporary sibling, fsync,
    rename), reading ``src`` through a mapping, a chunk at a time."""
    f32 = np.load(src, mmap_mode="r")
    with atomic_path(dst) as tmp, open(tmp, "wb") as f:
        write_npy_header(f, np.float16, tuple(f32.shape))
        for lo in range(0, f32.shape[0], F16_CHUNK_ROWS):
            f.write(np.asarray(f32[lo:lo + F16_CHUNK_ROWS], dtype=np.float16).tobytes())
        f.flush()
        os.fsync(f.fileno())


def write_manifest(d: Path, manifest: dict[str, Any]) -> None:
    """Write (and flush to disk) the manifest: its presence marks a complete directory."""
    with open(d / MANIFEST, "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the index at ``path`` (a link is followed), checked for format and completeness."""
    path = versions.resolve(Path(path))
    mf = path / MANIFEST
    if not path.is_dir():
        raise IndexNotFoundError(f"{path}: no such index directory", path)
    if not mf.is_file():
        raise IndexNotFoundError(f"{path}: not a RouteRAG index (no {MANIFEST}); build one with `routerag build-graph`",
                               path)
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{mf}: unreadable manifest ({exc}); {REBUILD_HINT}", mf) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise IndexFormatError(f"{mf}: not a RouteRAG index manifest", mf)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format {manifest.get('format_version')} is not supported by this version "
            f"(expects {FORMAT_VERSION}); rebuild it with `routerag build-graph`", path)
    try:
        int(manifest["embedder"]["dim"]), int(manifest["counts"]["passages"]), dict(manifest["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexFormatError(f"{mf}: manifest lacks {exc} (damaged); {REBUILD_HINT}", mf) from None
    missing = [f for f in ALL_FILES if not (path / f).is_file()]
    if missing:
        raise IndexFormatError(f"{path}: incomplete index, missing {', '.join(missing)}", path)
    return manifest


class IndexData:
    """One version of a built index. The path is resolved (and that version pinned against removal) once, here,
    so every part read later comes from the same version even while a writer publishes the next one.

    Opening checks every file's size and the embeddings' shapes against the manifest (cheap); each part is read on
    first use (embeddings memory-mapped) and checked against it too. Every failure is an
    :class:`IndexFormatError` naming the file.
    """

    def __init__(self, path: Path) -> None:
        self.root = Path(path)
        self.path, fd = versions.open_version(self.root)
        self._unpin = weakref.finalize(self, os.close, fd) if fd is not None else None
        try:
            self.manifest = read_manifest(self.path)
            self.dim = int(self.manifest["embedder"]["dim"])
            integrity.check_sizes(self.path, self.manifest)
            for name in (PASSAGE_EMB, ENTITY_EMB, FACT_EMB):
                integrity.check_npy(self.path / name, integrity.expected_rows(self.manifest, name), self.dim)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unpin the version (writers may then remove it once it is no longer current or previous)."""
        if self._unpin is not None:
            self._unpin()

    def __enter__(self) -> IndexData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @cached_property
    def config(self) -> IndexConfig:
        """The models and graph settings the index was built with (its manifest's record)."""
        return IndexConfig.from_manifest(self.manifest["config"])

    @property
    def version(self) -> str:
        """The version directory's name (the directory's own name for an index written before versions)."""
        return self.path.name

    def _rows(self, name: str, convert: Callable[[Any], T]) -> list[T]:
        """Parse a JSONL part, naming ``file:line`` on a bad row and checking the row count."""
        path = self.path / name
        out: list[T] = []
        try:
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        out.append(convert(json.loads(line)))
                    except (ValueError, KeyError, TypeError, IndexError) as exc:
                        raise IndexFormatError(f"{path}:{lineno}: corrupt row ({type(exc).__name__}: {exc}); "
                                               f"{REBUILD_HINT}", path) from None
        except UnicodeDecodeError as exc:
            raise IndexFormatError(f"{path}: not valid UTF-8 ({exc.reason}); {REBUILD_HINT}", path) from None
        want = integrity.expected_rows(self.manifest, name)
        if want is not None and len(out) != want:
            raise IndexFormatError(f"{path}: {len(out):,} rows, the manifest says {want:,}; {REBUILD_HINT}", path)
        return out

    @cached_property
    def passages(self) -> list[Passage]:
        return self._rows(PASSAGES, lambda r: Passage(id=str(r["id"]), title=r["title"], text=r["text"]))

    @cached_property
    def openie(self) -> list[OpenIEResult]:
        return self._rows(OPENIE, OpenIEResult.from_json)

    @cached_property
    def entities(self) -> list[str]:
        return self._rows(ENTITIES, lambda r: str(r["name"]))

    @cached_property
    def entity_passage_counts(self) -> np.ndarray:
        # a pass of its own: a search needs the counts, not a second list of every entity's name
        return np.array(self._rows(ENTITIES, lambda r: (str(r["name"]), int(r["passages"]))[1]), dtype=np.int64)

    @cached_property
    def facts(self) -> list[Triple]:
        # the same entity (and relation) recurs in many facts: one string object each, not one per occurrence
        def triple(r: Any) -> Triple:
            s, rel, o = r
            return (sys.intern(s), sys.intern(rel), sys.intern(o))

        return self._rows(FACTS, triple)

    @cached_property
    def synonyms(self) -> Selections:
        rows = self._rows(SYNONYMS, lambda r: (r["entity"], [(k, float(s)) for k, s in r["keeps"]]))
        return dict(rows)

    def _npy(self, name: str) -> np.ndarray:
        return np.load(self.path / name, mmap_mode="r")  # header and size were checked at open

    @cached_property
    def passage_emb(self) -> np.ndarray:
        return self._npy(PASSAGE_EMB)

    @cached_property
    def entity_emb(self) -> np.ndarray:
        return self._npy(ENTITY_EMB)

    @cached_property
    def fact_emb(self) -> np.ndarray:
        return self._npy(FACT_EMB)

    @cached_property
    def fact_emb_f16(self) -> np.ndarray:
        """The float16 fact rows, mapped from their file. An index written before that file existed gets it now,
        written atomically into its version under the index's lock, taken without waiting; when the lock is busy or
        the directory is read-only, the copy is made in memory instead (as before the file existed)."""
        path = self.path / FACT_EMB_F16
        if not path.is_file():
            try:
                owner = versions.owner_of(self.path) or self.root  # the lock writers of this version take
                with index_lock(owner, timeout=0, op="derive fact_embeddings.f16.npy"):
                    if not path.is_file():
                        write_f16(self.path / FACT_EMB, path)
            except (IndexBusyError, OSError) as exc:
                log.info("%s: float16 fact copy kept in memory (%s)", self.path, exc)
                return np.asarray(self.fact_emb, dtype=np.float16)
        shape, dtype, _ = integrity.npy_header(path)
        if shape != self.fact_emb.shape or dtype != np.float16:
            raise IndexFormatError(f"{path}: array of shape {shape} {dtype}, expected {self.fact_emb.shape} float16; "
                                   f"{REBUILD_HINT}", path)
        return np.load(path, mmap_mode="r")

    def ann(self, which: str) -> faiss.Index:
        """The scale profile's approximate index of ``which`` (``passages`` or ``facts``), read from its file. An index without the file (below ``ann.from_passages`` at build time, or older) gets it now,
        written atomically into its version under the index's lock, taken without waiting; when the lock is busy or
        the directory is read-only, it is built in memory instead."""
        cached = self.__dict__.setdefault("_ann", {})
        if which in cached:
            return cached[which]
        path = self.path / ANN_FILES[which]
        if not path.is_file():
            try:
                owner = versions.owner_of(self.path) or self.root
                with index_lock(owner, timeout=0, op=f"derive {path.name}"):
                    if not path.is_file():
                        log.warning("%s: building %s for the scale profile (once)", self.path, path.name)
                        write_ann(self.path, which)
            except (IndexBusyError, OSError) as exc:
                log.warning("%s: %s built in memory (%s)", self.path, path.name, exc)
                cached[which] = ann.build(np.load(self.path / ANN_SOURCES[which], mmap_mode="r"), name=which)
                return cached[which]
        try:
            index = ann.read(path)
        except RuntimeError as exc:
            raise IndexFormatError(f"{path}: unreadable FAISS index ({str(exc).strip().splitlines()[-1][:300]}); "
                                   f"delete it to have it rebuilt", path) from None
        rows = int(self.manifest["counts"][which])
        integrity.check_dense_counts(path, index.d, index.ntotal, rows, self.dim)
        cached[which] = index
        return index

    @property
    def dense_mapped(self) -> bool:
        """Whether the dense index's vectors are mapped from its file rather than read into memory."""
        return self.__dict__.get("_dense_mapped", False)

    @cached_property
    def dense(self) -> faiss.Index:
        path = self.path / DENSE
        try:
            index = _read_faiss_mapped(path)
            self.__dict__["_dense_mapped"] = index is not None
            if index is None:
                index = faiss.read_index(str(path))
        except RuntimeError as exc:
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            reason = lines[-1].rsplit("Error: ", 1)[-1][:300]  # faiss prefixes its C++ source location
            raise IndexFormatError(f"{path}: unreadable FAISS index ({reason}); {REBUILD_HINT}", path) from None
        integrity.check_dense_counts(path, index.d, index.ntotal, int(self.manifest["counts"]["passages"]), self.dim)
        return index

    @cached_property
    def graph(self) -> ig.Graph:
        path = self.path / GRAPH
        try:
            g = ig.Graph.Read_GraphML(str(path))
            # GraphML stores numbers as doubles; the bitmask is an integer
            if g.ecount():
                g.es["kinds"] = [int(k) for k in g.es["kinds"]]
            if g.vcount():  # two values, not one string object per vertex
                g.vs["kind"] = [sys.intern(k) for k in g.vs["kind"]]
            release_freed_memory()
        except Exception as exc:  # igraph reports XML damage as InternalError, missing attributes as KeyError
            reason = " ".join(str(exc).split())[:200]
            raise IndexFormatError(f"{path}: unreadable graph ({type(exc).__name__}: {reason}); {REBUILD_HINT}",
                                   path) from None
        counts = self.manifest["counts"]
        nodes = int(counts["passages"]) + int(counts.get("entities", 0))
        edges = counts.get("edges")
        if g.vcount() != nodes or (edges is not None and g.ecount() != int(edges)):
            raise IndexFormatError(f"{path}: graph of {g.vcount():,} nodes and {g.ecount():,} edges, the manifest "
                                   f"says {nodes:,} and {edges if edges is not None else '?'}; {REBUILD_HINT}", path)
        return g

    # -- the graph's vertices, by what they stand for: passages first (vertex i is passage i), then entities ------

    @property
    def passage_vertices(self) -> np.ndarray:
        """The vertices of the passages, in passage order (the rows PageRank scores are read from)."""
        return np.arange(int(self.manifest["counts"]["passages"]))

    @cached_property
    def entity_vertices(self) -> dict[str, int]:
        """Normalised entity name → its graph vertex."""
        return entity_vertices(self.graph)

    @cached_property
    def fact_ends(self) -> np.ndarray:
        """``(facts, 2)`` int64: the vertices of each fact's subject and object (-1 where an end is no node)."""
        vertex = self.entity_vertices
        ends = np.full((len(self.facts), 2), -1, dtype=np.int64)
        for j, (s, _, o) in enumerate(self.facts):
            ends[j, 0] = vertex.get(s, -1)
            ends[j, 1] = vertex.get(o, -1)
        return ends

    @cached_property
    def vertex_passage_counts(self) -> np.ndarray:
        """Per graph vertex, how many passages link to it (entities; 0 for passage vertices): what HippoRAG 2
        divides an entity seed's weight by."""
        counts = np.zeros(self.graph.vcount(), dtype=np.float64)
        counts[len(self.passage_vertices):] = self.entity_passage_counts
        return counts

    @cached_property
    def _longest_entity(self) -> int:
        return min(max((len(e.split()) for e in self.entity_vertices), default=1), 8)

    def entities_in(self, text: str) -> list[int]:
        """Entity vertices ``text`` names verbatim: its longest normalised n-grams that are entity nodes, not
        overlapping (so "new york city" does not also give "york"), longest first."""
        words = normalize_phrase(text).split()
        taken = [False] * len(words)
        found: list[int] = []
        for n in range(min(self._longest_entity, len(words)), 0, -1):
            for i in range(len(words) - n + 1):
                if any(taken[i : i + n]):
                    continue
                v = self.entity_vertices.get(" ".join(words[i : i + n]))
                if v is not None:
                    found.append(v)
                    taken[i : i + n] = [True] * n
        return found

    def search_index(self, device: str = "auto") -> faiss.Index:
        """The dense index where searches run: copied to GPU 0 when the index's ``dense.use_gpu`` allows it and a
        GPU is there, unless ``device`` is ``cpu``."""
        cfg: DenseIndexConfig = self.config.dense
        if device == "cpu":
            cfg = cfg.model_copy(update={"use_gpu": "never"})
        return maybe_to_gpu(self.dense, cfg)

    def check(self) -> None:
        """Read every part once and hold it to the manifest (what ``routerag info`` runs; no checksums).

        The dense index is read only when the manifest records no file sizes: otherwise its size (checked at
        open) and header suffice, and a large index is not loaded just to be counted.
        """
        for part in ("passages", "openie", "entities", "entity_passage_counts", "facts", "synonyms", "graph"):
            getattr(self, part)
        if "files" in self.manifest:
            path = self.path / DENSE
            integrity.check_dense_counts(path, *integrity.faiss_header(path), int(self.manifest["counts"]["passages"]),
                                         self.dim)
        else:
            self.dense  # noqa: B018 - reading it is the check

    def verify(self) -> int:
        """Recompute every file's sha256 and compare it with the manifest; returns the number of files verified.

        Raises :class:`IndexFormatError` listing every mismatch (the index path first, then one file per line).
        """
        problems = integrity.verify_checksums(self.path, self.manifest)
        if problems:
            raise IndexFormatError(f"{self.root}: failed verification:\n  " + "\n  ".join(problems), self.root)
        return len(self.manifest["files"])

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.manifest.get("counts", {}))


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps what a large parse freed, such as GraphML's
    temporary strings, in the process); a no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _read_faiss_mapped(path: Path) -> faiss.Index | None:
    """The FAISS index at ``path`` with its vectors mapped from the file: a flat index's codes
    (``IO_FLAG_MMAP_IFC``), an IVF index's inverted lists (``IO_FLAG_MMAP``); None for a kind faiss reads only into
    memory (HNSW), which the caller then reads."""
    with open(path, "rb") as f:
        fourcc = f.read(4)
    if fourcc in (b"IxFI", b"IxF2", b"IxFl"):  # IndexFlatIP, IndexFlatL2, IndexFlat
        flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    elif fourcc.startswith(b"Iw"):  # the IndexIVF family
        flag = getattr(faiss, "IO_FLAG_MMAP", None)
    else:
        return None
    if flag is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return faiss.read_index(str(path), flag | faiss.IO_FLAG_READ_ONLY)
