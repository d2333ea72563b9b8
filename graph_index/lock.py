"""One writer per index: an exclusive ``flock`` on a lock file beside the index.

Build, ``index add`` and ``index delete`` read the current version and publish the next one; two of them at once
would each publish their own result and one update would be lost. Readers (search, serve) never take this lock:
they read an immutable version (see :mod:`graph_index.versions`).

The lock file records who holds it, so a waiting writer can say whom it waits for. It is removed on release; a
writer that locked a file another one had just removed notices (the inode no longer matches the path) and tries
again, so the removal cannot let two writers in.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from .forked import CLOSE_IN_CHILD

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_S = 600.0
"""How long a writer waits for another writer of the same index before giving up (``--lock-timeout``)."""


class IndexBusyError(RuntimeError):
    """Another process is writing the index and did not finish within the timeout."""


def lock_path(root: Path) -> Path:
    """``indexes/.NAME.lock`` for the index ``indexes/NAME``: beside it, so it survives the index's replacement."""
    return root.parent / f".{root.name}.lock"


def holder(path: Path) -> str:
    """Who holds the lock file at ``path``, in words (best effort: it may change while we read it)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another writer"
    who = (f"pid {info['pid']} on {info.get('host', '?')} ({info.get('op', '?')}, since {info.get('since', '?')}: "
           f"{info.get('command', '')})")
    if info.get("host") == socket.gethostname() and not _alive(int(info["pid"])):
        who += " - that process is gone, so a process it started still holds the lock (`fuser -v` on " \
               f"{path} lists it)"
    return who


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def index_lock(root: Path, *, timeout: float = DEFAULT_LOCK_TIMEOUT_S, op: str = "write") -> Iterator[Path]:
    """Hold the write lock of the index at ``root`` for the ``with`` body; wait at most ``timeout`` seconds.

    Raises :class:`IndexBusyError` naming the holder when the wait runs out (``timeout=0``: do not wait).
    """
    root = Path(root)
    path = lock_path(root)
    deadline = time.monotonic() + max(timeout, 0.0)
    delay, announced = 0.05, False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            left = deadline - time.monotonic()
            if left <= 0:
                raise IndexBusyError(f"{root} is being written by {holder(path)}; gave up after {timeout:g} s "
                                     "(wait longer with --lock-timeout; the lock is released as soon as that "
                                     "process ends, even if it is killed)") from None
            if not announced:
                log.warning("waiting up to %.0f s for the write lock of %s, held by %s", left, root, holder(path))
                announced = True
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)
            continue
        if _still_linked(fd, path):
            break
        os.close(fd)  # the previous holder removed the file after we opened it: lock the new one instead
    CLOSE_IN_CHILD.add(fd)
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "op": op,
                "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:300]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield path
    finally:
        if fd in CLOSE_IN_CHILD:  # else this is a forked child, whose copy was closed at the fork: the parent releases
            CLOSE_IN_CHILD.discard(fd)
            try:
                os.unlink(path)  # while still holding it, so a waiter that opened this inode retries on a fresh one
            except FileNotFoundError:
                pass
            os.close(fd)


def _still_linked(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
