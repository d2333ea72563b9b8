"""A process forked by ours (spaCy's extraction workers) dies with it. A server killed with ``kill -9`` during an
ingestion job left its two spaCy workers alive; they kept its port, and the restarted server failed to bind it
(Errno 98 in CI)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PARENT = r"""
import multiprocessing, socket, sys, time
import graph_index.openie.cpu  # as an ingestion job does: the extractor brings the at-fork hook
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen()
ctx = multiprocessing.get_context("fork")  # what spaCy's n_process uses on Linux
workers = [ctx.Process(target=time.sleep, args=(60,)) for _ in range(2)]
for w in workers:
    w.start()
print(s.getsockname()[1], *(w.pid for w in workers), flush=True)
time.sleep(60)
"""


def _running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_forked_workers_die_with_their_killed_parent_and_free_its_port() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    port, *workers = (int(x) for x in parent.stdout.readline().split())
    assert all(_running(w) for w in workers)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if _running(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, f"workers {left} outlived their killed parent"
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # what the restarted server does
