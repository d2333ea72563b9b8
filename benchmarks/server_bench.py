"""What the REST server costs on top of the engine, and how much traffic it takes.

    python benchmarks/server_bench.py INDEX_DIR [--questions FILE] [--part scripted|smollm2|all]
        [--requests 100] [--concurrency 64] [--duration 10] [--repeats 3] [--out results.json]

(a) ``scripted``: an instant, deterministic policy (it searches the question once, then answers with the first
    document's title), so what is measured is the server, the loop and retrieval. Per /ask: ``Engine.ask`` called
    directly vs ``POST /ask`` on a live uvicorn (a separate process, real sockets, sequential keep-alive httpx
    requests), and the overhead paired per request (latency minus that request's own retrieval and generation
    time). Load: 64 clients in a closed loop (each sends its next request when the last one answered) for
    ``--duration`` seconds, from a minimal raw-socket keep-alive client (httpx's own CPU cost would dominate on a
    small machine): requests/s, latency p50/p95 and CPU per request, next to the same 64-way concurrency on
    ``Engine.ask`` in process.
(b) ``smollm2``: the embedded SmolLM2 policy (``GeneratorConfig()``: transformers, greedy). One request's latency
    broken down (generation, retrieval, loop, HTTP), and the /ask latency over *bare generation*: the same
    generation requests replayed straight on the model (``generate_batch([request])``, no batcher, loop or
    server), on the same model object (the server runs in a thread of this process), in rotating rounds.
    Target: overhead <= 5% of bare generation.

The load generator and the server share this machine's cores, as does anything else running: on a busy machine
compare CPU per request and the paired overheads rather than raw latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from routerag.config import Settings  # noqa: E402
from routerag.prompts import chatml  # noqa: E402
from routerag.policy.types import Generation, GenerationRequest  # noqa: E402

_QUESTION = re.compile(r"Question: (.*?)\n?<\|im_end\|>", re.DOTALL)
_FIRST_DOC = re.compile(r"<information>Doc 1 \(Title: (.*?)\) ")


class InstantPolicy:
    """Deterministic and free: search the question once, then answer with the first document's title."""

    name = "instant"
    tracks_tokens = False
    tokenizer = None

    def __init__(self, tag: str = "[passage]") -> None:
        self.tag = tag

    def render_prompt(self, user_message: str) -> tuple[str, None]:
        return chatml(user_message), None

    async def generate(self, request: GenerationRequest) -> Generation:
        prompt = request.prompt_text
        if request.stop == ("</answer>",):
            return Generation(text="unknown", finish_reason="stop")
        doc = _FIRST_DOC.search(prompt)
        if doc is None:
            m = _QUESTION.search(prompt)
            return Generation(text=f"<think>look it up</think><search>{self.tag} {m.group(1) if m else 'x'}",
                              finish_reason="stop")
        return Generation(text=f"<think>found</think><answer>{doc.group(1)}", finish_reason="stop")


class RecordingGenerator:
    """Passes every request to ``inner`` and keeps it, so the exact generations can be replayed bare."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.tracks_tokens, self.tokenizer = inner.name, inner.tracks_tokens, inner.tokenizer
        self.requests: list[GenerationRequest] = []

    def render_prompt(self, user_message: str) -> Any:
        return self.inner.render_prompt(user_message)

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        return await self.inner.generate(request)


# -- helpers -----------------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))], 3) if s else float("nan")


def summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "mean_ms": round(statistics.fmean(ms), 3), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_question_list(index: Path, questions: Path | None, n: int) -> list[str]:
    if questions is not None:
        from routerag.datasets import load_questions

        return [it.question for it in load_questions(questions, limit=n)]
    from graph_index.store import IndexData

    titles = [p.title for p in IndexData(index).passages][:n]
    return [f"What is known about {t}?" for t in titles]


def build_engine(index: Path, kind: str):
    from routerag.engine import Engine

    settings = Settings()
    if kind == "scripted":
        return Engine(index, settings, generator=InstantPolicy()), settings
    return Engine(index, settings), settings  # GeneratorConfig(): the embedded SmolLM2


class ServerProcess:
    """This script in ``--serve`` mode: a uvicorn process serving the index, ready when /ready answers."""

    def __init__(self, index: Path, kind: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, __file__, str(index), "--serve", kind, "--port",
                                      str(self.port)], env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def serve(index: Path, kind: str, port: int) -> None:
    import uvicorn

    from routerag.runtime import configure_threads
    from server.app import create_app

    configure_threads()
    engine, settings = build_engine(index, kind)
    uvicorn.run(create_app(engine, settings), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- (a) the instant policy --------------------------------------------------------------------------------------------


async def sequential_direct(engine: Any, questions: list[str]) -> tuple[list[float], list[float]]:
    """Latency of each ``Engine.ask``, and the same minus its own retrieval and generation time (paired per
    request, so the variance of retrieval on a shared machine cancels out)."""
    lat, rest = [], []
    for q in questions:
        t = time.perf_counter()
        traj = await engine.ask(q)
        ms = (time.perf_counter() - t) * 1000
        lat.append(ms)
        rest.append(ms - traj.retrieval_ms - traj.generation_ms)
    return lat, rest


async def sequential_http(url: str, questions: list[str]) -> tuple[list[float], list[float], list[float]]:
    """Client latency of each ``POST /ask``, the server's ``total_ms``, and the latency minus the request's own
    retrieval and generation time."""
    lat, server_ms, rest = [], [], []
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        for q in questions:
            t = time.perf_counter()
            r = await c.post("/ask", json={"question": q})
            ms = (time.perf_counter() - t) * 1000
            r.raise_for_status()
            b = r.json()
            lat.append(ms)
            server_ms.append(b["total_ms"])
            rest.append(ms - b["retrieval_ms"] - b["generation_ms"])
    return lat, server_ms, rest


def own_cpu_s() -> float:
    """CPU seconds of this process (all threads)."""
    t = os.times()
    return t.user + t.system


def process_cpu_s(pid: int) -> float:
    """CPU seconds of another process (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def closed_loop(send, questions: list[str], concurrency: int, duration_s: float,
                      cpu: dict[str, Any] | None = None) -> dict[str, Any]:
    """``concurrency`` workers, each sending its next request as soon as the last one answered. ``cpu``: named
    CPU-seconds counters whose per-request cost is reported (on a shared machine, CPU per request is steadier than
    requests per second)."""
    cpu = cpu or {}
    cpu0 = {name: f() for name, f in cpu.items()}
    lat: list[float] = []
    errors = 0
    end = time.perf_counter() + duration_s

    async def worker(w: int) -> None:
        nonlocal errors
        i = w
        while time.perf_counter() < end:
            t = time.perf_counter()
            try:
                await send(questions[i % len(questions)])
                lat.append((time.perf_counter() - t) * 1000)
            except Exception:
                errors += 1
            i += concurrency

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    out = {"concurrency": concurrency, "requests": len(lat), "errors": errors, "wall_s": round(wall, 2),
           "req_per_s": round(len(lat) / wall, 1), "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95)}
    for name, f in cpu.items():
        out[f"{name}_cpu_ms_per_request"] = round((f() - cpu0[name]) * 1000 / max(len(lat), 1), 2)
    return out


class RawHTTPClient:
    """A minimal HTTP/1.1 keep-alive client (one connection per concurrent worker), used as the load generator:
    httpx spends ~10 ms of CPU per request with 64 connections in its pool, which on a small machine measures the
    client rather than the server (as wrk would not)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.free: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post_json(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        conn = self.free.pop() if self.free else await asyncio.open_connection(self.host, self.port)
        reader, writer = conn
        body = json.dumps(payload).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        self.free.append(conn)
        return status, data

    async def close(self) -> None:
        for _, writer in self.free:
            writer.close()
        self.free.clear()


def part_scripted(index: Path, questions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    engine, _ = build_engine(index, "scripted")
    n = min(args.requests, len(questions))
    qs = questions[:n]
    with asyncio.Runner() as runner:
        runner.run(sequential_direct(engine, qs[:10]))  # warm-up (query encoder, graph)
        direct, direct_rest = runner.run(sequential_direct(engine, qs))
        runner.run(closed_loop(engine.ask, questions, args.concurrency, 2.0))  # warm-up at this concurrency
        direct_load = runner.run(closed_loop(engine.ask, questions, args.concurrency, args.duration,
                                             {"engine": own_cpu_s}))
    server = ServerProcess(index, "scripted")
    try:
        server.wait_ready()
        asyncio.run(sequential_http(server.url, qs[:10]))  # warm-up
        lat, server_ms, rest = asyncio.run(sequential_http(server.url, qs))

        async def http_load() -> dict[str, Any]:
            client = RawHTTPClient("127.0.0.1", server.port)

            async def send(q: str) -> None:
                status, _ = await client.post_json("/ask", {"question": q})
                if status != 200:
                    raise RuntimeError(f"HTTP {status}")

            try:
                await closed_loop(send, questions, args.concurrency, 2.0)  # warm-up: open the connections
                return await closed_loop(send, questions, args.concurrency, args.duration,
                                         {"server": lambda: process_cpu_s(server.proc.pid), "client": own_cpu_s})
            finally:
                await client.close()

        load = asyncio.run(http_load())
    finally:
        server.stop()
    d, h = summary(direct), summary(lat)
    http_json = [c - s for c, s in zip(lat, server_ms)]
    return {
        "engine_ask_direct": d,
        "post_ask": h,
        "server_total_ms": summary(server_ms),
        "overhead_per_ask_ms": {
            "p50_latency_difference": round(h["p50_ms"] - d["p50_ms"], 3),
            "engine_loop_p50": pct(direct_rest, 50),
            "server_and_loop_p50": pct(rest, 50),
            "server_only_p50": round(pct(rest, 50) - pct(direct_rest, 50), 3),
            "http_and_json_p50": pct(http_json, 50)},
        "load_engine_direct": direct_load,
        "load_post_ask": load,
    }


# -- (b) the embedded SmolLM2 policy -----------------------------------------------------------------------------------


class ThreadServer:
    """uvicorn serving ``app`` in a thread of this process: the server then uses the very model object that the
    bare-generation measurement uses, so the comparison is not blurred by differences between processes."""

    def __init__(self, app: Any) -> None:
        import threading

        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="uvicorn")
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def part_smollm2(index: Path, question: str, args: argparse.Namespace) -> dict[str, Any]:
    """Bare generation, ``POST /ask`` and ``Engine.ask``, on one model in one process, measured in rounds whose
    order rotates (so drift in what else the machine runs hits all three alike); and the server's own breakdown of
    each request (generation, retrieval, the rest), which is paired and needs no such care."""
    from routerag.runtime import configure_threads
    from server.app import create_app

    configure_threads()
    engine, settings = build_engine(index, "smollm2")
    rec = RecordingGenerator(engine.generator)
    engine.loop.generator = rec
    inner = engine.generator
    out: dict[str, Any] = {"question": question, "policy": inner.name}
    server = ThreadServer(create_app(engine, settings))
    times: dict[str, list[float]] = {"bare": [], "server": [], "direct": []}
    runs: list[dict[str, Any]] = []
    try:
        with asyncio.Runner() as runner, httpx.Client(base_url=server.url, timeout=900) as c:
            traj = runner.run(engine.ask(question))  # warm-up, and the generation requests to replay
            requests = list(rec.requests)
            c.post("/ask", json={"question": question}).raise_for_status()  # warm-up

            def bare() -> None:
                t = time.perf_counter()
                for req in requests:
                    inner.generate_batch([req])
                times["bare"].append((time.perf_counter() - t) * 1000)

            def via_server() -> None:
                t = time.perf_counter()
                r = c.post("/ask", json={"question": question})
                lat = (time.perf_counter() - t) * 1000
                r.raise_for_status()
                b = r.json()
                times["server"].append(lat)
                runs.append({"latency_ms": lat, "generation_ms": b["generation_ms"], "retrieval_ms": b["retrieval_ms"],
                             "total_ms": b["total_ms"], "steps": [s["action"] for s in b["trace"]]})

            def direct() -> None:
                t = time.perf_counter()
                runner.run(engine.ask(question))
                times["direct"].append((time.perf_counter() - t) * 1000)

            order = [bare, via_server, direct]
            for i in range(args.repeats):
                for fn in order[i % 3:] + order[: i % 3]:
                    fn()
    finally:
        server.stop()
    steps = [s.action for s in traj.steps]
    out["trajectory"] = {"steps": steps, "generations": len(requests), "completion_tokens": traj.completion_tokens,
                         "same_in_server": all(r["steps"] == steps for r in runs)}
    med = {k: statistics.median(r[k] for r in runs) for k in ("latency_ms", "generation_ms", "retrieval_ms",
                                                              "total_ms")}
    rest = [r["latency_ms"] - r["generation_ms"] - r["retrieval_ms"] for r in runs]
    bare_ms = statistics.median(times["bare"])
    out["rounds_ms"] = {k: [round(x, 1) for x in v] for k, v in times.items()}
    out["post_ask_breakdown_ms"] = {
        "latency": round(med["latency_ms"], 1),
        "generation": round(med["generation_ms"], 1),
        "retrieval": round(med["retrieval_ms"], 1),
        "loop_and_batching": round(med["total_ms"] - med["generation_ms"] - med["retrieval_ms"], 1),
        "http_and_json": round(med["latency_ms"] - med["total_ms"], 1),
        "all_but_generation_and_retrieval": round(statistics.median(rest), 1),
    }
    over = med["latency_ms"] - bare_ms
    out["overhead_vs_bare_generation"] = {
        "bare_generation_ms": round(bare_ms, 1),
        "engine_ask_direct_ms": round(statistics.median(times["direct"]), 1),
        "post_ask_ms": round(med["latency_ms"], 1),
        "all_ms": round(over, 1), "all_pct": round(100 * over / bare_ms, 2),
        "paired_non_generation_pct": round(100 * statistics.median(rest) / med["generation_ms"], 3),
        "target_pct": 5.0}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("index", type=Path)
    ap.add_argument("--questions", type=Path, help="question file (any supported format); default: from titles")
    ap.add_argument("--part", choices=["scripted", "smollm2", "all"], default="all")
    ap.add_argument("--requests", type=int, default=100, help="sequential requests per path (scripted)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of closed-loop load")
    ap.add_argument("--repeats", type=int, default=3, help="smollm2: measured requests (median reported)")
    ap.add_argument("--question", help="smollm2: the question (default: the first of --questions or a title)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--serve", choices=["scripted", "smollm2"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=8000, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.index, args.serve, args.port)
        return
    from routerag.runtime import configure_threads

    configure_threads()
    questions = load_question_list(args.index, args.questions, max(args.requests, 256))
    result: dict[str, Any] = {"index": str(args.index), "machine": {"cpus": os.cpu_count(),
                                                                  "python": platform.python_version()}}
    if args.part in ("scripted", "all"):
        result["scripted"] = part_scripted(args.index, questions, args)
        print(json.dumps({"scripted": result["scripted"]}, indent=2), flush=True)
    if args.part in ("smollm2", "all"):
        result["smollm2"] = part_smollm2(args.index, args.question or questions[0], args)
        print(json.dumps({"smollm2": result["smollm2"]}, indent=2), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
