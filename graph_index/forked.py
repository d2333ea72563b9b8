"""What a child forked by this process does first. spaCy's ``n_process`` extraction workers are forked; so is any
``multiprocessing`` pool.

A forked child inherits every descriptor its parent holds, including a server's listening socket and an index's
write lock, and by default it outlives its parent. After ``kill -9`` of a server in the middle of an ingestion job,
its two spaCy workers lived on: they kept the port, so the restarted server could not bind it (Errno 98), and they
waited forever on a queue nobody would fill. So every forked child, at once:

- closes the index-lock descriptors listed in :data:`CLOSE_IN_CHILD` (``flock`` belongs to the open file: a child
  that outlived a killed writer would otherwise keep the index locked);
- asks the kernel to kill it when the thread that forked it ends (Linux ``PR_SET_PDEATHSIG``), so killing the parent
  in any way also ends its workers and frees everything they inherited.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

CLOSE_IN_CHILD: set[int] = set()
"""Descriptors a forked child closes at once (the index locks this process holds; see :mod:`graph_index.lock`)."""

_PR_SET_PDEATHSIG = 1
_parent_pid = os.getpid()


def _libc_prctl():  # noqa: ANN202 - a ctypes function, or None off Linux
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except OSError:
        return None


_prctl = _libc_prctl()


def _before_fork() -> None:
    global _parent_pid
    _parent_pid = os.getpid()


def _in_child() -> None:
    for fd in CLOSE_IN_CHILD:
        try:
            os.close(fd)
        except OSError:
            pass
    CLOSE_IN_CHILD.clear()
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != _parent_pid:  # the parent died before the request was made: nothing would signal us
            os._exit(1)


os.register_at_fork(before=_before_fork, after_in_child=_in_child)
