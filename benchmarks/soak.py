"""Soak: minutes of mixed ``/ask`` and ``/retrieve`` traffic, above the admission bound, against a real ``routerag
serve`` on the embedded policy; does the server stay responsive, refuse rather than time out, and hold its memory?

    python benchmarks/soak.py [--index indexes/sample] [--minutes 30] [--ask-clients N] [--retrieve-clients 4]
        [--budget 1] [--out runs/soak]

The server runs as a subprocess (``routerag serve INDEX --host 127.0.0.1``, its own settings: the embedded SmolLM2
router policy and the default admission bounds unless ``--max-inflight``/``--max-queue``/``--timeout`` set them
through ``ROUTERAG_SERVER__*``). Without ``--index``, the sample index is built from ``samples/corpus.jsonl`` into
``indexes/sample`` (as ``make demo`` does) if it is not there yet.

Load: ``--ask-clients`` closed loops send ``/ask`` (default: 1.5 × the server's in-flight + queue bound, read from
``/metrics``, so some requests must be refused), and ``--retrieve-clients`` loops send a ``/retrieve`` of 1-4
queries every ``--retrieve-interval`` seconds. A refused client waits what ``Retry-After`` says (as a well-behaved
client does) before its next request. Every loop stops by itself at the end of the run; requests still in flight
then finish or hit their client timeout (the server's request timeout + 30 s), so the run is bounded.

Report (``OUT/soak.json`` and ``OUT/soak.png``): per route, requests by outcome, success rate, refusals (503),
latency p50/p95 of admitted requests (everything but 503s) and of refusals, whether any admitted request timed
out (504, or no answer within the client timeout); the server's RSS, in-flight and queue depth every
``--sample-s`` seconds, RSS growth after the first minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_CORPUS = ROOT / "samples" / "corpus.jsonl"
METRIC_LINE = re.compile(r'^(routerag_[a-z_]+)\{([^}]*)\} ([0-9.e+-]+)$', re.MULTILINE)


# -- the server --------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_index(index: Path | None) -> Path:
    """The index to serve; the sample index is built once if none is given."""
    if index is not None:
        return index
    index = ROOT / "indexes" / "sample"
    if not (index / "manifest.json").is_file():
        print(f"building the sample index into {index}", flush=True)
        subprocess.run([sys.executable, "-m", "routerag.cli", "build-graph", str(SAMPLE_CORPUS), "--out", str(index),
                        "--force"], check=True, cwd=ROOT)
    return index


class Server:
    """``routerag serve`` in a subprocess on 127.0.0.1; ready when ``/ready`` answers 200."""

    def __init__(self, index: Path, env: dict[str, str], log: Path, args: tuple[str, ...] = (),
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("a")
        self.proc = subprocess.Popen([sys.executable, "-m", "routerag.cli", "serve", str(index), "--host", "127.0.0.1",
                                      "--port", str(self.port), *args], cwd=ROOT, env={**os.environ, **env},
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 900) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("the server did not become ready")

    def rss_mb(self) -> float | None:
        """Resident memory of the server process (Linux /proc)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def scrape(text: str) -> dict[tuple[str, str], float]:
    """``{(metric, labels): value}`` from the Prometheus text format."""
    return {(m.group(1), m.group(2)): float(m.group(3)) for m in METRIC_LINE.finditer(text)}


def metric(values: dict[tuple[str, str], float], name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return values.get((name, want), 0.0)


# -- the load ----------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    route: str
    t: float
    """Seconds since the start of the run, at send."""
    latency_s: float
    status: int
    """HTTP status, or 0 when no answer came within the client timeout (or the connection failed)."""
    error: str = ""


@dataclass
class Run:
    end: float
    client_timeout_s: float
    t0: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)

    async def call(self, client: httpx.AsyncClient, route: str, body: dict[str, Any]) -> Outcome:
        t = time.monotonic()
        try:
            r = await client.post(route, json=body, timeout=self.client_timeout_s)
            status, error = r.status_code, ""
            if status != 200:
                try:
                    error = r.json()["error"]["type"]
                except (ValueError, KeyError, TypeError):
                    error = r.text[:80]
            retry = float(r.headers.get("retry-after", 0) or 0)
        except httpx.HTTPError as exc:
            status, error, retry = 0, type(exc).__name__, 1.0
        out = Outcome(route, t - self.t0, time.monotonic() - t, status, error)
        self.outcomes.append(out)
        if status != 200 and retry:  # back off as told (and never past the end of the run)
            await asyncio.sleep(max(0.0, min(retry, self.end - time.monotonic())))
        return out


async def ask_loop(run: Run, client: httpx.AsyncClient, questions: list[str], budget: int, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < run.end:
        await run.call(client, "/ask", {"question": rng.choice(questions), "budget": budget})


async def retrieve_loop(run: Run, client: httpx.AsyncClient, questions: list[str], interval_s: float,
                        seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < run.end:
        t = time.monotonic()
        body = {"queries": rng.sample(questions, rng.randint(1, 4)), "topk": 3,
                "mode": rng.choice(["passage", "graph", "hybrid"])}
        await run.call(client, "/retrieve", body)
        await asyncio.sleep(max(0.0, min(interval_s - (time.monotonic() - t), run.end - time.monotonic())))


async def sampler(run: Run, server: Server, client: httpx.AsyncClient, every_s: float,
                  samples: list[dict[str, Any]]) -> None:
    """RSS and the admission gauges every ``every_s`` seconds, until every load loop has finished."""
    while True:
        row: dict[str, Any] = {"t_s": round(time.monotonic() - run.t0, 1), "rss_mb": server.rss_mb()}
        try:
            m = scrape((await client.get("/metrics", timeout=10)).text)
            for route in ("/ask", "/retrieve"):
                key = route.strip("/")
                row[f"{key}_in_flight"] = metric(m, "routerag_admission_in_flight", route=route)
                row[f"{key}_queued"] = metric(m, "routerag_admission_queue_depth", route=route)
                row[f"{key}_refused"] = sum(v for (name, labels), v in m.items() if name == "routerag_admission_"
                                            "refused_total" and f'route="{route}"' in labels)
        except httpx.HTTPError:
            pass
        samples.append(row)
        await asyncio.sleep(every_s)


def load_questions(index: Path, n: int = 200) -> list[str]:
    """Questions about the index's own pages (the policy then has something to find)."""
    titles: list[str] = []
    with (index / "passages.jsonl").open(encoding="utf-8") as f:
        for line in f:
            titles.append(json.loads(line)["title"])
    forms = ["What is known about {}?", "Where is {} located?", "Who founded {}?", "When was {} created?"]
    return [forms[i % len(forms)].format(titles[i % len(titles)]) for i in range(min(n, 4 * len(titles)))]


# -- the report --------------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))], 3) if s else None


def route_report(outs: list[Outcome]) -> dict[str, Any]:
    by: dict[str, int] = {}
    for o in outs:
        key = str(o.status) if o.status else f"no_answer:{o.error}"
        by[key] = by.get(key, 0) + 1
    admitted = [o for o in outs if o.status != 503]
    ok = [o for o in outs if o.status == 200]
    refused = [o for o in outs if o.status == 503]
    timed_out = [o for o in admitted if o.status in (0, 504)]
    return {
        "requests": len(outs), "by_status": dict(sorted(by.items())),
        "success_rate": round(len(ok) / len(outs), 4) if outs else None,
        "admitted_success_rate": round(len(ok) / len(admitted), 4) if admitted else None,
        "refused": len(refused),
        "admitted": len(admitted),
        "admitted_timed_out": len(timed_out),
        "any_admitted_timed_out": bool(timed_out),
        "admitted_latency_s": {"p50": pct([o.latency_s for o in admitted], 50),
                               "p95": pct([o.latency_s for o in admitted], 95),
                               "max": round(max((o.latency_s for o in admitted), default=0), 3)},
        "refusal_latency_s": {"p50": pct([o.latency_s for o in refused], 50),
                              "p95": pct([o.latency_s for o in refused], 95)},
    }


def rss_report(samples: list[dict[str, Any]], warmup_s: float = 60.0) -> dict[str, Any]:
    rss = [(s["t_s"], s["rss_mb"]) for s in samples if s.get("rss_mb") is not None]
    if not rss:
        return {}
    after = [(t, v) for t, v in rss if t >= warmup_s] or rss
    slope = None
    if len(after) >= 3:  # least squares, MB per hour
        n = len(after)
        mt = sum(t for t, _ in after) / n
        mv = sum(v for _, v in after) / n
        den = sum((t - mt) ** 2 for t, _ in after)
        slope = round(sum((t - mt) * (v - mv) for t, v in after) / den * 3600, 1) if den else None
    return {"start_mb": round(rss[0][1], 1), "end_mb": round(rss[-1][1], 1),
            "max_mb": round(max(v for _, v in rss), 1), "after_warmup_start_mb": round(after[0][1], 1),
            "growth_after_warmup_mb": round(after[-1][1] - after[0][1], 1),
            "slope_after_warmup_mb_per_h": slope, "warmup_s": warmup_s}


def plot(samples: list[dict[str, Any]], outs: list[Outcome], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    t = [s["t_s"] / 60 for s in samples]
    a.plot(t, [s.get("rss_mb") for s in samples], color="tab:blue")
    a.set_ylabel("server RSS (MB)")
    a.set_title(title)
    b.plot(t, [s.get("ask_in_flight", 0) for s in samples], label="/ask in flight")
    b.plot(t, [s.get("ask_queued", 0) for s in samples], label="/ask queued")
    b.plot(t, [s.get("retrieve_in_flight", 0) for s in samples], label="/retrieve in flight", alpha=0.6)
    b.set_ylabel("requests")
    b.legend(loc="upper right", fontsize=8)
    for route, color in (("/ask", "tab:green"), ("/retrieve", "tab:purple")):
        pts = [(o.t / 60, o.latency_s) for o in outs if o.route == route and o.status != 503]
        if pts:
            c.scatter(*zip(*pts), s=6, color=color, label=f"{route} admitted")
    refused = [(o.t / 60, o.latency_s) for o in outs if o.status == 503]
    if refused:
        c.scatter(*zip(*refused), s=6, color="tab:red", marker="x", label="refused (503)")
    c.set_yscale("log")
    c.set_ylabel("latency (s)")
    c.set_xlabel("minutes")
    c.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main --------------------------------------------------------------------------------------------------------------


async def soak(server: Server, args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url) as c:
        m = scrape((await c.get("/metrics")).text)
    bound = {route: {kind: int(metric(m, "routerag_admission_limit", route=route, kind=kind))
                     for kind in ("in_flight", "queue")} for route in ("/ask", "/retrieve")}
    ask_bound = bound["/ask"]["in_flight"] + bound["/ask"]["queue"]
    ask_clients = args.ask_clients or max(ask_bound + 1, int(1.5 * ask_bound + 0.5))
    timeout_s = float(args.timeout or 120.0)
    run = Run(end=time.monotonic() + args.minutes * 60, client_timeout_s=timeout_s + 30)
    samples: list[dict[str, Any]] = []
    print(f"soak: {args.minutes} min, {ask_clients} /ask clients (bound: {bound['/ask']}), {args.retrieve_clients} "
          f"/retrieve clients (bound: {bound['/retrieve']})", flush=True)
    async with httpx.AsyncClient(base_url=server.url, timeout=run.client_timeout_s,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)) as c:
        watch = asyncio.ensure_future(sampler(run, server, c, args.sample_s, samples))
        loops = [ask_loop(run, c, questions, args.budget, seed=i) for i in range(ask_clients)]
        loops += [retrieve_loop(run, c, questions, args.retrieve_interval, seed=1000 + i)
                  for i in range(args.retrieve_clients)]
        await asyncio.gather(*loops)
        watch.cancel()
        final = scrape((await c.get("/metrics")).text)
    samples.append({"t_s": round(time.monotonic() - run.t0, 1), "rss_mb": server.rss_mb()})
    routes = {route: route_report([o for o in run.outcomes if o.route == route]) for route in ("/ask", "/retrieve")}
    server_counts = {f"{name}{{{labels}}}": v for (name, labels), v in final.items()
                     if name in ("routerag_http_requests_total", "routerag_admission_refused_total",
                                 "routerag_request_errors_total", "routerag_ask_finish_total")}
    return {"bound": bound, "ask_clients": ask_clients, "retrieve_clients": args.retrieve_clients,
            "routes": routes, "rss": rss_report(samples), "server_counters": server_counts,
            "ask_planned_service_s": metric(final, "routerag_admission_service_seconds", route="/ask"),
            "samples": samples, "outcomes": [o.__dict__ for o in run.outcomes]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--ask-clients", type=int, help="default: 1.5 x the /ask in-flight + queue bound")
    ap.add_argument("--retrieve-clients", type=int, default=4)
    ap.add_argument("--retrieve-interval", type=float, default=0.5, help="seconds between one client's /retrieve")
    ap.add_argument("--budget", type=int, default=1, help="searches per /ask (the request's budget)")
    ap.add_argument("--max-inflight", type=int, help="server.max_inflight (default: the server's rule)")
    ap.add_argument("--max-queue", type=int, help="server.max_queue")
    ap.add_argument("--timeout", type=float, help="server.request_timeout_s (default 120)")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "soak")
    args = ap.parse_args()
    index = ensure_index(args.index)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {k: str(v) for k, v in {"ROUTERAG_SERVER__MAX_INFLIGHT": args.max_inflight,
                                  "ROUTERAG_SERVER__MAX_QUEUE": args.max_queue,
                                  "ROUTERAG_SERVER__REQUEST_TIMEOUT_S": args.timeout}.items() if v is not None}
    server = Server(index, env, args.out / "server.log")
    try:
        ready_s = server.wait_ready()
        print(f"server ready in {ready_s:.1f} s at {server.url}", flush=True)
        result = asyncio.run(soak(server, args, load_questions(index)))
    finally:
        server.stop()
    result = {"index": str(index), "minutes": args.minutes, "budget": args.budget, "server_env": env,
              "machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()}, **result}
    (args.out / "soak.json").write_text(json.dumps(result, indent=2))
    plot(result["samples"], [Outcome(**o) for o in result["outcomes"]], args.out / "soak.png",
         f"soak: {args.minutes:g} min, {result['ask_clients']} /ask + {args.retrieve_clients} /retrieve clients")
    summary = {k: v for k, v in result.items() if k not in ("samples", "outcomes")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
