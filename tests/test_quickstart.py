"""Every fenced ``routerag`` command in docs/quickstart.md runs against the sample corpus, so the quickstart cannot
drift from the code. ``routerag serve`` is started, asked once over HTTP, and stopped."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .helpers.server_helpers import wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "docs" / "quickstart.md"


def quickstart_commands() -> list[str]:
    """``routerag …`` commands of the fenced blocks, continuation lines joined, prompts and comments dropped."""
    text = QUICKSTART.read_text(encoding="utf-8")
    cmds = []
    for lang, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        if lang not in ("", "bash", "sh", "shell", "console"):
            continue  # ```text blocks are shown, not run (curl against a server the reader started)
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ").split("  #")[0].strip()
            if line.startswith("routerag "):
                cmds.append(line)
    return cmds


def test_the_quickstart_has_the_commands_a_user_needs() -> None:
    cmds = " ".join(quickstart_commands())
    for sub in ("build-graph", "info", "search", "ask", "serve", "eval", "index add", "index delete",
                "index snapshot", "index restore"):
        assert f"routerag {sub}" in cmds, sub


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_serve(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    port = _free_port()
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(port)
    else:
        argv += ["--port", str(port)]
    log = cwd / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_ready(proc, f"http://127.0.0.1:{port}", log, timeout_s=240)
        r = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["Glass Lighthouse"], "topk": 2}, timeout=30)
        assert r.status_code == 200 and len(r.json()["result"][0]) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_every_quickstart_command_runs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "samples", work / "samples")
    env = {**os.environ, "ROUTERAG_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    cmds = quickstart_commands()
    assert cmds
    for cmd in cmds:
        argv = [sys.executable, "-m", "routerag", *shlex.split(cmd)[1:]]
        if cmd.startswith("routerag serve"):
            _run_serve(argv, env, work)
            continue
        res = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"`{cmd}` failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
