"""The command-line conventions a practitioner expects: ``-h`` and ``--version``, exit codes (0 done, 1 a runtime
error, 2 a usage error), full-width output when piped, no library warnings, and a line for one-time work."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from rich.table import Table
from typer.testing import CliRunner

from graph_index.embedders import onnx_encoder
from graph_index.llm_clients import UpstreamError
from graph_index.status import STATUS
from routerag import __version__
from routerag.cli import app
from routerag.cli import common

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def restore_logging():
    """setup_logging reconfigures the root logger and the warning filters: put both back after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with warnings.catch_warnings():
        yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["search", "-h"], ["index", "-h"]])
def test_short_and_long_help(runner: CliRunner, argv: list[str]) -> None:
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.output


def test_version_flag_and_command(runner: CliRunner) -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"routerag {__version__}"
    assert runner.invoke(app, ["version"]).output.strip() == __version__


def test_the_installed_entry_point_takes_h_and_version() -> None:
    for flag in ("-h", "--version"):
        res = subprocess.run([sys.executable, "-m", "routerag", flag], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr


def test_usage_errors_exit_2(runner: CliRunner, tmp_path: Path) -> None:
    res = runner.invoke(app, ["search", str(tmp_path), "q", "--no-such-flag"])
    assert res.exit_code == 2  # Click's own
    res = runner.invoke(app, ["info", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "no such index directory" in res.output
    res = runner.invoke(app, ["search", str(tmp_path)])  # neither a query nor --queries
    assert res.exit_code == 2 and "exactly one" in res.output
    res = runner.invoke(app, ["train", "--stage", "3"])
    assert res.exit_code == 2 and "--stage" in res.output


def test_runtime_errors_exit_1(runner: CliRunner, tmp_path: Path) -> None:
    idx = tmp_path / "idx"
    idx.mkdir()
    (idx / "manifest.json").write_text("{ truncated")
    res = runner.invoke(app, ["info", str(idx)])
    assert res.exit_code == 1 and "unreadable manifest" in res.output and "Traceback" not in res.output
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"title": "A", "text": oops}\n')
    res = runner.invoke(app, ["build-graph", str(corpus), "--out", str(tmp_path / "new")])
    assert res.exit_code == 1 and f"{corpus}:1" in res.output


def test_exit_code_classification() -> None:
    from graph_index.config import SettingsError

    assert common.exit_code(SettingsError("api_kye")) == 2
    assert common.exit_code(common.UsageError("--stage must be 1 or 2")) == 2
    assert common.exit_code(FileNotFoundError("x")) == 2
    assert common.exit_code(UpstreamError("connection refused")) == 1
    assert common.exit_code(ValueError("corpus.jsonl:3: invalid JSON")) == 1
    assert common.exit_code(RuntimeError("CUDA out of memory")) == 1


def test_piped_output_is_not_wrapped_at_80_columns(monkeypatch, capsys) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(common.console, "_width", None)
    monkeypatch.setattr(common.err_console, "_width", None)
    common.configure_output()
    assert common.console.width == common.PIPED_WIDTH  # pytest's stdout is not a terminal
    t = Table()
    for col in ("strategy", "GenAcc", "F1"):
        t.add_column(col)
    t.add_row("learned " + "x" * 150, "0.50", "0.61")
    common.console.print(t)
    out = capsys.readouterr().out
    assert "GenAcc" in out and max(len(line) for line in out.splitlines()) > 150


def test_library_deprecation_warnings_are_silenced(restore_logging, monkeypatch, capsys) -> None:
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    monkeypatch.delenv("ROUTERAG_DEBUG", raising=False)
    common.setup_logging(False)
    warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning)
    warnings.warn("old", DeprecationWarning)
    assert "deprecated" not in capsys.readouterr().err


def test_one_time_work_is_announced_without_verbose(restore_logging, capsys) -> None:
    common.setup_logging(False)
    log = logging.getLogger("graph_index.test")
    log.info("an ordinary detail")
    log.info("exporting the query encoder (once)", extra=STATUS)
    err = capsys.readouterr().err
    assert "exporting the query encoder" in err and "ordinary detail" not in err
    common.setup_logging(True)
    log.info("an ordinary detail")
    assert "ordinary detail" in capsys.readouterr().err


def test_the_onnx_export_logs_a_status_line(tmp_path: Path, monkeypatch, caplog) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    monkeypatch.setattr(onnx_encoder, "_check_supported", lambda f: None)
    monkeypatch.setattr(onnx_encoder, "_weights_digest", lambda f: "d1")
    def fake_export(f: Path, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"onnx")
        return target

    monkeypatch.setattr(onnx_encoder, "export_onnx", fake_export)
    with caplog.at_level(logging.INFO, logger=onnx_encoder.__name__):
        onnx_encoder.cached_export(folder, tmp_path / "cache")
        onnx_encoder.cached_export(folder, tmp_path / "cache")  # cached: no second line
    lines = [r for r in caplog.records if getattr(r, "status", False)]
    assert len(lines) == 1 and "ONNX" in lines[0].getMessage()
