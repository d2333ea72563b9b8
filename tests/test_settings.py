"""Strict settings: a key that names no setting, anywhere in the TOML file, in a ROUTERAG_* variable or in code, is an
error that names it and the closest valid key. A typo must never be silently dropped: ``api_kye`` used to start the
server with authentication off."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from routerag.config import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("ROUTERAG_") and name.upper() != "ROUTERAG_CACHE_DIR":
            monkeypatch.delenv(name)


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, needles", [
    ('[server]\napi_kye = "s3cret"\n', ["[server] has no setting 'api_kye'", "did you mean 'api_key'?"]),
    ('srever = 1\n', ["unknown section or setting 'srever'", "did you mean 'server'?"]),
    ("[train.verl]\nmodle = 'x'\n", ["[train.verl] has no setting 'modle'", "did you mean 'model'?"]),
    ("[policy.answer_generator]\nbakend = 'openai'\n", ["[policy.answer_generator]", "'backend'"]),
    ("[server]\nzzzz = 1\n", ["'zzzz'", "valid: admin_key, allowed_hosts, allowed_origins, api_key,"]),
])
def test_unknown_keys_in_the_file_are_refused_with_a_suggestion(tmp_path: Path, text: str,
                                                                needles: list[str]) -> None:
    path = toml(tmp_path, text)
    with pytest.raises(SettingsError) as exc:
        load_settings(Settings, path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message
    for needle in needles:
        assert needle in message, message


def test_a_valid_file_still_loads(tmp_path: Path) -> None:
    s = load_settings(Settings, toml(tmp_path, '[server]\napi_key = "s3cret"\nmax_inflight = 3\n'
                                               "[policy.generator]\nmax_batch = 4\n"))
    assert s.server.api_key.get_secret_value() == "s3cret" and s.server.max_inflight == 3
    assert s.policy.generator.max_batch == 4


@pytest.mark.parametrize("name, needles", [
    ("ROUTERAG_SERVER__API_KYE", ["[server] has no setting 'api_kye'", "did you mean ROUTERAG_SERVER__API_KEY?"]),
    ("ROUTERAG_SEVRER__API_KEY", ["no setting 'sevrer'", "did you mean ROUTERAG_SERVER__API_KEY?"]),
    ("ROUTERAG_FOO", ["ROUTERAG_FOO", "no setting 'foo'", "valid: ann, cache_dir,"]),
    ("ROUTERAG_CACHEDIR", ["did you mean ROUTERAG_CACHE_DIR?"]),
    ("ROUTERAG_MODEL_DRI", ["did you mean ROUTERAG_MODEL_DIR?"]),
    ("ROUTERAG_SERVER__PORT__X", ["server.port is a single setting, not a section"]),
    ("ROUTERAG_POLICY__GENERATOR__MODLE", ["did you mean ROUTERAG_POLICY__GENERATOR__MODEL?"]),
    ("routerag_server__api_kye", ["did you mean ROUTERAG_SERVER__API_KEY?"]),  # read case-insensitively
])
def test_unknown_environment_variables_are_refused(monkeypatch, name: str, needles: list[str]) -> None:
    monkeypatch.setenv(name, "s3cret")
    with pytest.raises(SettingsError) as exc:
        Settings()
    message = str(exc.value)
    assert f"unknown environment variable {name}" in message and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_valid_and_process_variables_are_accepted(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROUTERAG_SERVER__API_KEY", "s3cret")
    monkeypatch.setenv("ROUTERAG_POLICY__ANSWER_GENERATOR__MODEL", "m")
    for process in ("ROUTERAG_MODEL_DIR", "ROUTERAG_BLAS_THREADS", "ROUTERAG_DEBUG", "ROUTERAG_SHARED_DATA"):
        monkeypatch.setenv(process, "1")
    s = Settings()
    assert s.server.api_key.get_secret_value() == "s3cret" and s.policy.answer_generator.model == "m"


def test_unknown_keys_from_code_are_refused_too() -> None:
    with pytest.raises(ValidationError, match="unknown setting 'api_kye'; did you mean 'api_key'"):
        Settings(server={"api_kye": "s3cret"})
    with pytest.raises(SettingsError, match="invalid settings: server.port: Input should be less than or equal"):
        load_settings(Settings, None, server={"port": 70000})


def test_the_cli_reports_a_typo_in_one_line(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from routerag.cli import app as cli

    path = toml(tmp_path, '[server]\napi_kye = "s3cret"\n')
    res = CliRunner().invoke(cli, ["serve", str(tmp_path / "no-index"), "--config", str(path)])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "'api_kye'" in lines[0] and "'api_key'" in lines[0]
    assert "[server] has no setting" in lines[0]  # the section's name is text, not Rich markup to drop
    monkeypatch.setenv("ROUTERAG_SERVER__API_KYE", "s3cret")
    res = CliRunner().invoke(cli, ["serve", str(tmp_path / "no-index")])
    assert res.exit_code == 2 and "ROUTERAG_SERVER__API_KEY" in res.output and "Traceback" not in res.output
    assert "([server] has no setting 'api_kye')" in res.output
