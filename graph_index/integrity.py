"""What an index's manifest promises about its files, and the checks that hold the files to it.

At write time every data file gets a record in ``manifest["files"]``: its size, its sha256, and its rows (lines of a
JSONL file; shape and dtype of an ``.npy``). Opening an index compares sizes and ``.npy`` headers (a ``stat`` and a
few hundred bytes per file: cheap enough for every open, and it catches any truncation); loading a part compares
what it parsed with the record; ``routerag info --verify`` recomputes the checksums (it reads every byte).

Every failure is an :class:`~graph_index.layout.IndexFormatError` whose message starts with the file's path.
Indexes written before records existed are checked against their manifest's counts instead.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .layout import DATA_FILES, DERIVED_FILES, ENTITY_EMB, FACT_EMB, PASSAGE_EMB, REBUILD_HINT, ROWS_FROM_COUNT, IndexFormatError

_CHUNK = 1 << 20
NPY_FILES = (PASSAGE_EMB, ENTITY_EMB, FACT_EMB)


def sha256_file(path: Path, *, fsync: bool = False) -> str:
    """The file's sha256; with ``fsync`` also flushes it to disk (one pass over a file the write just left in the
    page cache)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
        if fsync:
            os.fsync(f.fileno())
    return h.hexdigest()


def file_record(path: Path, rows: int | None = None) -> dict[str, Any]:
    """The manifest's record of a data file just written (which it also makes durable)."""
    rec: dict[str, Any] = {"bytes": path.stat().st_size, "sha256": sha256_file(path, fsync=True)}
    if path.suffix == ".npy":
        shape, dtype, _ = npy_header(path)
        rec["shape"], rec["dtype"] = list(shape), dtype.str
    elif rows is not None:
        rec["rows"] = rows
    return rec


def expected_rows(manifest: dict[str, Any], name: str) -> int | None:
    """Rows the manifest promises for ``name``: its own record, else the matching count, else unknown."""
    rec = manifest.get("files", {}).get(name, {})
    if "rows" in rec:
        return int(rec["rows"])
    if "shape" in rec:
        return int(rec["shape"][0])
    key = ROWS_FROM_COUNT.get(name)
    value = manifest.get("counts", {}).get(key) if key else None
    return int(value) if value is not None else None


def check_sizes(d: Path, manifest: dict[str, Any]) -> None:
    """Every recorded file has its recorded size (catches truncation and partial copies at open)."""
    for name, rec in manifest.get("files", {}).items():
        path = d / name
        size = path.stat().st_size
        if size != rec.get("bytes", size):
            raise IndexFormatError(f"{path}: {size:,} bytes, but the manifest records {rec['bytes']:,} (truncated or "
                                   f"changed after the write); {REBUILD_HINT}", path)


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, offset of the data)`` of an ``.npy`` file, from its header alone."""
    fmt = np.lib.format
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"unknown .npy version {version}")
        except (ValueError, OSError, SyntaxError) as exc:
            raise IndexFormatError(f"{path}: not a readable .npy array ({exc}); {REBUILD_HINT}", path) from None
        return tuple(shape), np.dtype(dtype), f.tell()


def check_npy(path: Path, rows: int | None, dim: int | None) -> None:
    """The array's header says ``(rows, dim)`` float32 and the file holds exactly that much data."""
    shape, dtype, offset = npy_header(path)
    want = (rows if rows is not None else shape[0] if shape else None, dim if dim is not None else
            shape[1] if len(shape) > 1 else None)
    if len(shape) != 2 or shape != want or dtype != np.float32:
        raise IndexFormatError(f"{path}: array of shape {shape} {dtype}, the manifest says {want} float32; "
                               f"{REBUILD_HINT}", path)
    size, need = path.stat().st_size, offset + int(np.prod(shape)) * dtype.itemsize
    if size != need:
        raise IndexFormatError(f"{path}: {size:,} bytes, but its header needs {need:,} (truncated?); {REBUILD_HINT}",
                               path)


def faiss_header(path: Path) -> tuple[int, int]:
    """``(dimension, number of vectors)`` from a FAISS index file's header (common to every index type)."""
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) < 16:
        raise IndexFormatError(f"{path}: {len(head)} bytes, too short for a FAISS index; {REBUILD_HINT}", path)
    d, ntotal = struct.unpack("<iq", head[4:16])
    return d, ntotal


def check_dense_counts(path: Path, d: int, ntotal: int, rows: int | None, dim: int | None) -> None:
    if (rows is not None and ntotal != rows) or (dim is not None and d != dim):
        raise IndexFormatError(f"{path}: FAISS index of {ntotal:,} vectors of dimension {d}, the manifest says "
                               f"{rows if rows is not None else '?'} of {dim if dim is not None else '?'}; "
                               f"{REBUILD_HINT}", path)


def verify_checksums(d: Path, manifest: dict[str, Any]) -> list[str]:
    """Recompute every recorded checksum; one ``path: problem`` line per mismatch (empty: all intact)."""
    files = manifest.get("files")
    if not files:
        return [f"{d}: the manifest records no checksums (written by an older version); the next write "
                "(`routerag index add`, or a rebuild) records them"]
    problems = []
    for name in (*DATA_FILES, *(n for n in DERIVED_FILES if n in files)):
        rec, path = files.get(name), d / name
        if rec is None:
            problems.append(f"{path}: no checksum recorded")
        elif not path.is_file():
            problems.append(f"{path}: missing")
        elif (digest := sha256_file(path)) != rec.get("sha256"):
            problems.append(f"{path}: sha256 {digest[:16]}…, the manifest records {str(rec.get('sha256'))[:16]}… "
                            "(the file changed after the write)")
    return problems

