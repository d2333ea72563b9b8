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
    graph.*.npy, vertex_names.*, vertex_passage_counts.npy, fact_ends.npy
                             the graph as searches use it: CSR arrays and a vertex-name table (graph_index.csr);
                             derived, written by the build, converted from GraphML on an older index's first load

Writers (build, ``index add``, ``index delete``) hold the index's lock (:func:`write_lock`); readers never do,
except to add the float16 fact copy or the compact graph to an index written before they existed (once, without
waiting).

Loading maps the big matrices instead of copying them: the ``.npy`` files with ``np.load(mmap_mode="r")``, a flat
FAISS index with ``IO_FLAG_MMAP_IFC``, the float16 fact copy and the compact graph from their own files; a search
reads passages and facts from their JSONL files' mappings, one row when it needs it (:class:`JsonlRows`). Their pages are then the page
cache's, shared by every process serving the index, and a server's anonymous memory does not grow with them.
"""

from __future__ import annotations

import ctypes
import json
import logging
import mmap
import os
import shutil
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import faiss
import igraph as ig
import numpy as np

from . import ann, csr, integrity, versions
from .atomic import atomic_path
from .config import AnnConfig, DenseIndexConfig, IndexConfig
from .corpus import Passage, append_jsonl, write_jsonl
from .dense import maybe_to_gpu, read_mapped
from .graph import ENTITY_PREFIX
from .layout import (ALL_FILES, ANN_FILES, CSR_FILES, DENSE, ENTITIES, ENTITY_EMB, FACT_EMB, FACT_EMB_F16, FACTS,
                     FORMAT, FORMAT_VERSION, GRAPH, MANIFEST, OPENIE, PASSAGE_EMB, PASSAGES, REBUILD_HINT, SYNONYMS,
                     IndexFormatError,
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
    csr.write_compact_graph(d, csr.arrays_from_igraph(graph, entity_passages, facts))
    rows = {PASSAGES: passages, OPENIE: passages, ENTITIES: len(entities), FACTS: len(facts), SYNONYMS: len(synonyms)}
    manifest["files"] = {name: integrity.file_record(d / name, rows.get(name))
                         for name in (*ALL_FILES[1:], FACT_EMB_F16, *CSR_FILES)}


ANN_SOURCES = {"passages": PASSAGE_EMB, "facts": FACT_EMB}
"""The rows each approximate index (``ANN_FILES``) is built from."""


def write_ann(d: Path, which: str, cfg: AnnConfig) -> Path:
    """Build the approximate index of ``which`` (``passages`` or ``facts``) from the version ``d``'s mapped rows
    and write it atomically beside them; returns its path."""
    rows = np.load(d / ANN_SOURCES[which], mmap_mode="r")
    index = ann.build(rows, name=f"{d.name}/{which}", ivf_from_rows=cfg.ivf_from_rows)
    with atomic_path(d / ANN_FILES[which]) as tmp:
        ann.write(index, tmp)
    return d / ANN_FILES[which]


def write_ann_files(d: Path, manifest: dict[str, Any], cfg: AnnConfig) -> None:
    """Write both approximate indexes into the version ``d`` when ``cfg`` wants them for its size, and record their
    checksums in ``manifest["files"]`` (which :func:`write_index_files` filled)."""
    if not cfg.wanted(int(manifest["counts"]["passages"])):
        return
    for which in ANN_FILES:
        path = write_ann(d, which, cfg)
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


class JsonlRows(Sequence[T]):
    """The rows of a JSONL part, parsed one at a time when asked for, from the file's mapping and an index of where each
    row starts: what a search reads of a large corpus (its top passages, its seed facts) without a Python object per
    row in memory. A row that does not parse is an :class:`IndexFormatError` naming ``file:line``, when it is read.

    Why: at 1M synthetic passages the parsed passages and facts (8.8M triples) held about 2 GiB of anonymous
    memory and took most of the load's time (``docs/scaling.md``)."""

    def __init__(self, path: Path, convert: Callable[[Any], T], rows: int | None) -> None:
        self.path, self.convert = path, convert
        size = path.stat().st_size
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self.bounds = _row_bounds(self._map)
        """Row i is ``bounds[i]:bounds[i+1]`` (with its newline, and any blank lines after it: JSON ignores them)."""
        if rows is not None and len(self) != rows:
            raise IndexFormatError(f"{path}: {len(self):,} rows, the manifest says {rows:,}; {REBUILD_HINT}", path)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - an index or a slice, as a list takes
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        start = int(self.bounds[i])
        try:
            return self.convert(json.loads(self._map[start:int(self.bounds[i + 1])]))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            line = self._map[:start].count(b"\n") + 1
            raise IndexFormatError(f"{self.path}:{line}: corrupt row ({type(exc).__name__}: {exc}); {REBUILD_HINT}",
                                   self.path) from None

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))


def _row_bounds(buf: Any, chunk: int = 1 << 26) -> np.ndarray:
    """Where each non-blank line of ``buf`` starts, then ``len(buf)``: newlines found a chunk at a time."""
    found = [np.flatnonzero(np.frombuffer(buf, dtype=np.uint8, count=min(chunk, len(buf) - lo), offset=lo) == 10) + lo
             for lo in range(0, len(buf), chunk)]
    breaks = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], breaks + 1]).astype(np.int64)
    starts = starts[starts < len(buf)]  # not the position after a final newline
    blank = np.zeros(len(starts), dtype=bool)
    blank[:len(breaks)] = breaks[:len(starts)] == starts[:len(breaks)]  # a line that is only its newline
    return np.append(starts[~blank], len(buf)).astype(np.int64)


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
        return self._rows(PASSAGES, _passage)

    @cached_property
    def passage_rows(self) -> JsonlRows[Passage]:
        """The passages, each parsed when read (:class:`JsonlRows`): what a search serves from."""
        return JsonlRows(self.path / PASSAGES, _passage, integrity.expected_rows(self.manifest, PASSAGES))

    @cached_property
    def fact_rows(self) -> JsonlRows[Triple]:
        """The facts, each parsed when read (:class:`JsonlRows`)."""
        return JsonlRows(self.path / FACTS, _triple, integrity.expected_rows(self.manifest, FACTS))

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
        return self._rows(FACTS, _interned_triple)

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
                        write_ann(self.path, which, self.config.ann)
            except (IndexBusyError, OSError) as exc:
                log.warning("%s: %s built in memory (%s)", self.path, path.name, exc)
                cached[which] = ann.build(np.load(self.path / ANN_SOURCES[which], mmap_mode="r"), name=which,
                                          ivf_from_rows=self.config.ann.ivf_from_rows)
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
            index = read_mapped(path)
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
    def compact_graph(self) -> csr.CompactGraph:
        """The graph as searches use it: CSR arrays, vertex names, passage counts and fact ends, mapped from their
        files (:mod:`graph_index.csr`). An index written before those files existed gets them now, converted from its
        GraphML and written atomically into its version under the index's lock, taken without waiting (as
        :attr:`fact_emb_f16`); when the lock is busy or the directory is read-only, the conversion is kept in memory
        instead."""
        counts = self.manifest["counts"]
        nodes = int(counts["passages"]) + int(counts.get("entities", 0))
        facts = integrity.expected_rows(self.manifest, FACTS)
        if not csr.present(self.path):
            try:
                owner = versions.owner_of(self.path) or self.root  # the lock writers of this version take
                with index_lock(owner, timeout=0, op="derive the compact graph"):
                    if not csr.present(self.path):
                        log.warning("%s: converting the graph to its compact files (once per index)", self.path)
                        csr.write_compact_graph(self.path, self._compact_arrays())
            except (IndexBusyError, OSError) as exc:
                log.warning("%s: compact graph kept in memory (%s)", self.path, exc)
                return csr.CompactGraph(self._compact_arrays())
        return csr.load_compact_graph(self.path, nodes=nodes, facts=len(self.fact_rows) if facts is None else facts)

    def _compact_arrays(self) -> dict[str, np.ndarray]:
        """The compact graph's arrays, from the GraphML graph, the entities' passage counts and the facts."""
        arrays = csr.arrays_from_igraph(self.graph, self.entity_passage_counts, self.facts)
        self.__dict__.pop("graph", None)  # the igraph object served only this conversion
        release_freed_memory()
        return arrays

    @property
    def fact_ends(self) -> np.ndarray:
        """``(facts, 2)`` int64: the vertices of each fact's subject and object (-1 where an end is no node)."""
        return self.compact_graph.fact_ends

    @property
    def vertex_passage_counts(self) -> np.ndarray:
        """Per graph vertex, how many passages link to it (entities; 0 for passage vertices): what HippoRAG 2
        divides an entity seed's weight by."""
        return self.compact_graph.vertex_passage_counts

    def entity_vertex(self, names: Sequence[str]) -> np.ndarray:
        """The vertex of each normalised entity name (-1 where it is no entity node)."""
        return self.compact_graph.names.lookup([ENTITY_PREFIX + n for n in names])

    def vertex_label(self, v: int) -> str:
        """A vertex's name without its prefix: the passage id or the normalised entity name."""
        return self.compact_graph.names.name(v).split(":", 1)[1]

    @cached_property
    def _longest_entity(self) -> int:
        names = self.compact_graph.names
        start, longest = len(self.passage_vertices), 1
        for lo in range(start, len(names), 1 << 20):  # in chunks: a whole graph's blob would be a large temporary
            longest = max(longest, int(names.words_per_name(lo, min(lo + (1 << 20), len(names))).max(initial=1)))
            if longest >= 8:
                break
        return min(longest, 8)

    def entities_in(self, text: str) -> list[int]:
        """Entity vertices ``text`` names verbatim: its longest normalised n-grams that are entity nodes, not
        overlapping (so "new york city" does not also give "york"), longest first."""
        words = normalize_phrase(text).split()
        spans = [(i, n) for n in range(min(self._longest_entity, len(words)), 0, -1)
                 for i in range(len(words) - n + 1)]
        vertex = self.entity_vertex([" ".join(words[i:i + n]) for i, n in spans])  # one lookup for every n-gram
        taken = [False] * len(words)
        found: list[int] = []
        for (i, n), v in zip(spans, vertex.tolist()):
            if v >= 0 and not any(taken[i:i + n]):
                found.append(v)
                taken[i:i + n] = [True] * n
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
        for part in ("passages", "openie", "entities", "entity_passage_counts", "facts", "synonyms", "graph",
                     "compact_graph"):
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


def _passage(r: Any) -> Passage:
    return Passage(id=str(r["id"]), title=r["title"], text=r["text"])


def _triple(r: Any) -> Triple:
    s, rel, o = r
    return (str(s), str(rel), str(o))


def _interned_triple(r: Any) -> Triple:
    s, rel, o = r
    return (sys.intern(s), sys.intern(rel), sys.intern(o))


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps what a large parse freed, such as GraphML's
    temporary strings, in the process); a no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
