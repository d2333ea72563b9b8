"""Atomic file writes: a file is written under a temporary sibling name and renamed over its own name only when the
write finished, so a reader (or a process restarted after kill -9) sees the old file or the new one, never half of
one. The one mechanism behind every single-file write that must not be seen half done: index derivatives, exported
models, per-batch build results, job records, policy cards, reports, cost tables. (Whole index versions are
directories: :func:`graph_index.store.atomic_directory`.)"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


TMP_MARK = ".tmp-"
"""In the name of every temporary file these writes make (``NAME.tmp-PID-NS``): what a clean-up or a test looks for."""


@contextmanager
def atomic_path(path: str | Path, *, suffix: str = "") -> Iterator[Path]:
    """A temporary sibling of ``path`` to write to; renamed over ``path`` when the block ends without error, removed
    otherwise. ``suffix`` ends the temporary name, for writers that pick a format by extension. The name starts with
    ``path``'s own and is unique per process and call, so concurrent writers of one file never share a temporary
    file, and a clean-up of ``NAME.*`` finds what a killed writer left."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}-{time.monotonic_ns()}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes, *, fsync: bool = False) -> None:
    """``path`` holds ``data`` in full or keeps what it held. ``fsync``: on disk before the rename (a record that
    must survive a power cut, not only a killed process)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def write_text_atomic(path: str | Path, text: str, *, fsync: bool = False) -> None:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)
