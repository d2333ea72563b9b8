"""Pyflakes-level checks (unused imports, undefined names, redefinitions) over the whole repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_pyflakes_rules() -> None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (pip install ruff)")
    res = subprocess.run([exe, "check", "--select", "F", "--output-format", "concise", "routerag", "graph_index",
                          "server", "training", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
