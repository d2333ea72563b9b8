"""The crash harness, short (issue 34): random CLI and HTTP writes against a live server, SIGKILLs of the server or a
CLI writer at random moments, and after each round the index verifies, no acknowledged write is lost and the served
version was always a published one. The long run (30 minutes) is recorded in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers.curie_index import build_curie_index

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_short_crash_run_loses_nothing_acknowledged(tmp_path: Path, minilm) -> None:
    base = build_curie_index(tmp_path / "base", minilm)
    report = tmp_path / "crasher.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "crasher.py"), "--index", str(base / "idx"),
                          "--work", str(tmp_path / "work"), "--rounds", "1", "--seed", "7",
                          "--out", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    summary = json.loads(report.read_text())
    assert summary["findings"] == [] and summary["rounds"] >= 1 and summary["kills_total"] >= 1, summary
    assert sum(summary["writes"].values()) >= 1
    assert "round 1:" in run.stdout and "checks ok" in run.stdout
