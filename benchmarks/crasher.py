"""Crasher: random index writes against a running server, with SIGKILLs at random moments; does anything
acknowledged get lost? (In the spirit of Qdrant's crasher.)

    python benchmarks/crasher.py [--index DIR] [--work DIR] [--minutes 30 | --rounds N] [--seed 0] [--out FILE]

Without ``--index`` the sample corpus (``samples/corpus.jsonl``) is built into ``WORK/idx`` first; with it, that
index is written to (give it a copy: ``routerag index snapshot`` and ``restore``). A server runs as a subprocess
(``routerag serve IDX --host 127.0.0.1``, a policy endpoint that is never called: the crasher only writes and reads
the index), with every write process sharing one cache directory.

Each round starts a random mix of writes, each with passages of its own (unique ids, never reused):

* ``routerag index add IDX FILE`` and ``routerag index delete IDX --ids ...`` processes (the CLI writer);
* ``POST /documents`` and ``DELETE /documents/{id}`` jobs of the server (the server's writer);

then, at a random moment within the writes' usual duration, SIGKILLs the server or one running CLI writer (the
server is started again at once). When every write has ended (a killed server resumes its accepted jobs), it checks:

* ``routerag index info IDX --verify`` passes (every file's sha256 is the manifest's);
* no acknowledged write is lost: the passages of every job whose status said ``done`` and of every ``index add``
  that exited 0 are in the index, and the ids of every acknowledged delete are not; an accepted job (202) is never
  forgotten by a restarted server;
* the served version (``GET /indexes``, sampled every 0.25 s through the round) is always one the index's link has
  named (a watcher reads the link every 20 ms), its directory is there, and it never goes back while a server lives;
* the write lock is free once the writers are gone.

Ids of a write that was killed or not acknowledged may be present or absent (both are correct: the write was not
promised). Prints one line per round and a summary (rounds, kills by target, writes acknowledged, findings), writes
it to ``--out`` as JSON, and exits 1 when there are findings.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import ROOT, SAMPLE_CORPUS, Server  # noqa: E402 - the benchmarks' shared server runner

sys.path.insert(0, str(ROOT))  # this checkout's graph_index, as the processes it starts (cwd ROOT) import

NOWHERE_POLICY = ("--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--policy", "crasher-never-asks")
"""The crasher never asks: an OpenAI-compatible policy that is never called, so the server starts without a model."""
PLACES = ["Ossel", "Varn", "Dresk", "Molle", "Tiber", "Aske", "Lune", "Brae", "Corran", "Hesk"]
PEOPLE = ["Anna Verhoef", "Piet Langes", "Mira Osk", "Jon Halvard", "Eda Brun", "Tomas Reel", "Ilse Varga"]


# -- what was promised --------------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """Which ids must be in the index, which must not, and which may be either."""

    present: dict[str, str] = field(default_factory=dict)
    """id → the acknowledged add that put it there (until a delete of it is issued)."""
    absent: dict[str, str] = field(default_factory=dict)
    """id → the acknowledged delete that removed it."""
    undecided: set[str] = field(default_factory=set)
    """ids of writes that were killed or refused: present or absent, both correct."""

    def take_for_delete(self, rng: random.Random, n: int) -> list[str]:
        """Up to ``n`` acknowledged ids, no longer promised present (their delete may or may not land)."""
        ids = rng.sample(sorted(self.present), min(n, len(self.present)))
        for i in ids:
            self.present.pop(i)
            self.undecided.add(i)
        return ids

    def acknowledge(self, op: str, ids: list[str], by: str) -> None:
        for i in ids:
            self.undecided.discard(i)
            (self.present if op == "add" else self.absent)[i] = by

    def give_back(self, ids: list[str], by: str) -> None:
        """A delete that was refused before it was accepted: its ids are promised present again."""
        for i in ids:
            self.undecided.discard(i)
            self.present[i] = by


@dataclass
class Write:
    """One write of a round: a CLI process or a server job."""

    kind: str  # cli-add, cli-delete, http-add, http-delete
    ids: list[str]
    started: float
    proc: subprocess.Popen | None = None
    job: str | None = None
    killed: bool = False
    ended: float = 0.0
    outcome: str = "running"  # running, acknowledged, failed, killed, refused

    @property
    def op(self) -> str:
        return self.kind.split("-")[1]

    @property
    def name(self) -> str:
        return f"{self.kind} {self.job or (self.proc.pid if self.proc else '')}".strip()


# -- the served version, watched --------------------------------------------------------------------------------


class LinkWatcher(threading.Thread):
    """Reads the index's link every 20 ms: the versions it has named are the published ones."""

    def __init__(self, idx: Path) -> None:
        super().__init__(daemon=True)
        self.idx, self.linked, self.stop = idx, set[str](), threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.is_set():
            self.read()
            time.sleep(0.02)

    def read(self) -> str | None:
        try:
            target = os.readlink(self.idx)
        except OSError:
            return None
        with self.lock:
            self.linked.add(target)
        return target

    def was_linked(self, version: str) -> bool:
        self.read()  # the link may have moved since the last look
        with self.lock:
            return version in self.linked


def version_number(name: str) -> int:
    m = re.search(r"\.v(\d+)$", name)
    return int(m.group(1)) if m else -1


# -- the crasher ----------------------------------------------------------------------------------------------------


class Crasher:
    def __init__(self, idx: Path, work: Path, seed: int) -> None:
        self.idx, self.work = idx, work
        self.cache = work / "cache"
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.watcher = LinkWatcher(idx)
        self.findings: list[str] = []
        self.kills: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.rounds = 0
        self.duration_s = {"cli": 20.0, "http": 10.0}
        """How long a CLI write and a server job usually take, learnt as rounds go: where kills are aimed."""
        self.server: Server | None = None
        self.served_max = -1
        self.log = work / "server.log"
        self.jobs_resumed = 0
        self.port: int | None = None

    # -- the server -----------------------------------------------------------------------------------------------

    def start_server(self) -> None:
        env = {"ROUTERAG_CACHE_DIR": str(self.cache)}
        self.server = Server(self.idx, env, self.log, args=NOWHERE_POLICY, port=self.port)
        self.port = self.server.port  # the same port after every restart: a client keeps its address
        self.server.wait_ready(timeout_s=600)
        self.served_max = -1

    def kill_server(self) -> None:
        assert self.server is not None
        os.kill(self.server.proc.pid, signal.SIGKILL)
        self.server.proc.wait()
        self.server.log.close()
        self.kills["server"] += 1
        self.server = None

    def get(self, path: str) -> httpx.Response | None:
        if self.server is None:
            return None
        try:
            return httpx.get(self.server.url + path, timeout=10)  # type: ignore[union-attr]
        except httpx.HTTPError:
            return None

    # -- writes ---------------------------------------------------------------------------------------------------

    def passages(self, tag: str) -> list[dict[str, str]]:
        out = []
        for j in range(self.rng.randint(1, 4)):
            place, person = self.rng.choice(PLACES), self.rng.choice(PEOPLE)
            name = f"{place}{tag.replace('-', '')}{j}".capitalize()
            out.append({"id": f"crash-{tag}-{j}", "title": name,
                        "text": f"{name} is a village on the river {place}. Its bell was cast in "
                                f"{self.rng.randint(1400, 1900)} by {person}, who was born in {name}."})
        return out

    def cli(self, *args: str) -> subprocess.Popen:
        log = open(self.work / "cli.log", "a")
        return subprocess.Popen([sys.executable, "-m", "routerag.cli", "index", *args, "--cache-dir", str(self.cache),
                                 "--json"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)

    def start_writes(self, r: int) -> list[Write]:
        plan = [k for k, p in (("cli-add", 0.7), ("cli-delete", 0.3), ("http-add", 0.8), ("http-delete", 0.4))
                if self.rng.random() < p] or ["http-add"]
        self.rng.shuffle(plan)
        writes = []
        for w, kind in enumerate(plan):
            tag = f"r{r:04d}w{w}"
            if kind.endswith("add"):
                rows = self.passages(tag)
                ids = [p["id"] for p in rows]
                self.ledger.undecided.update(ids)
                body = "".join(json.dumps(p) + "\n" for p in rows)
            else:
                ids = self.ledger.take_for_delete(self.rng, self.rng.randint(1, 2))
                if not ids:
                    continue
            write = Write(kind, ids, time.monotonic())
            if kind == "cli-add":
                path = self.work / "writes" / f"{tag}.jsonl"
                path.parent.mkdir(exist_ok=True)
                path.write_text(body, encoding="utf-8")
                write.proc = self.cli("add", str(self.idx), str(path))
            elif kind == "cli-delete":
                write.proc = self.cli("delete", str(self.idx), "--ids", ",".join(ids))
            else:
                self.submit(write, body if kind == "http-add" else None)
            self.writes[kind] += 1
            writes.append(write)
        return writes

    def submit(self, write: Write, body: str | None) -> None:
        """``POST /documents`` or ``POST /documents/delete``; the job is accepted only with a 202."""
        try:
            if body is not None:
                r = httpx.post(self.server.url + "/documents", content=body,  # type: ignore[union-attr]
                               headers={"Content-Type": "application/x-ndjson"}, timeout=30)
            elif len(write.ids) == 1:
                r = httpx.delete(f"{self.server.url}/documents/{write.ids[0]}", timeout=30)  # type: ignore[union-attr]
            else:
                r = httpx.post(self.server.url + "/documents/delete", json={"ids": write.ids},  # type: ignore[union-attr]
                               timeout=30)
        except httpx.HTTPError:
            write.outcome = "refused"  # no answer: the server may still have kept the job (its ids stay undecided)
            return
        if r.status_code != 202:
            # a delete of ids a CLI add put in after the server's last reload is a 404: the server serves an older
            # version until its own next job (nothing promised, nothing lost)
            self.refuse(write, f"not accepted ({r.status_code})")
            return
        write.job = r.json()["job"]

    def refuse(self, write: Write, why: str) -> None:
        write.outcome = "refused"
        if write.op == "delete":
            self.ledger.give_back(write.ids, f"(refused delete: {why})")

    # -- a round --------------------------------------------------------------------------------------------------

    def round(self, r: int) -> str:
        self.rounds += 1
        writes = self.start_writes(r)
        t0, killed, victim = time.monotonic(), False, ""
        aim = "cli" if any(w.proc for w in writes) and self.rng.random() < 0.5 else "http"
        kill_at = self.rng.uniform(0.2, self.duration_s[aim])
        next_sample = 0.0
        while True:
            now = time.monotonic() - t0
            running = [w for w in writes if w.outcome == "running"]
            aimed = [w for w in running if (w.proc is not None) == (aim == "cli")]
            if not killed and (now >= kill_at or not aimed):
                victim = self.kill(aimed if aim == "cli" else [], running, now)
                killed = True
            if self.server is not None and self.server.proc.poll() is not None:
                self.findings.append(f"round {r}: the server exited by itself ({self.server.proc.returncode}); "
                                     f"see {self.log}")
                self.server.log.close()
                self.server = None
            if self.server is None:
                self.start_server()
            if now >= next_sample:
                self.check_served()
                next_sample = now + 0.25
            for w in running:
                self.poll(w)
            if killed and all(w.outcome != "running" for w in writes):
                break
            if now > 900:
                self.findings.append(f"round {r}: writes still running after 900 s: "
                                     f"{[w.name for w in writes if w.outcome == 'running']}")
                break
            time.sleep(0.1)
        self.learn(writes)
        checks = self.check(r)
        done = Counter(w.outcome for w in writes)
        return (f"round {r}: {len(writes)} writes, killed {victim}; "
                f"{', '.join(f'{n} {o}' for o, n in sorted(done.items()))}; {checks}")

    def kill(self, procs: list[Write], running: list[Write], now: float) -> str:
        """SIGKILL one of the CLI writers ``procs``, or the server when there is none."""
        if procs:
            w = self.rng.choice(procs)
            os.kill(w.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            w.killed = True
            self.kills[w.kind] += 1
            return f"{w.kind} at {now:.1f} s"
        busy = sum(1 for w in running if w.job)
        self.kills["server mid-job"] += busy > 0
        self.kill_server()
        return f"server at {now:.1f} s ({busy} jobs unfinished)"

    def poll(self, w: Write) -> None:
        if w.proc is not None:
            rc = w.proc.poll()
            if rc is None:
                return
            if rc == 0:
                self.acknowledge(w)
            elif w.killed:
                w.outcome = "killed"
            else:
                w.outcome = "failed"
                self.findings.append(f"{w.name} ({','.join(w.ids)}) exited {rc} without being killed; see cli.log")
            return
        if w.job is None:
            return
        resp = self.get(f"/jobs/{w.job}")
        if resp is None:
            return  # the server is down or restarting: ask again later
        if resp.status_code == 404:
            w.outcome = "failed"
            self.findings.append(f"accepted job {w.job} ({w.kind}) unknown to the server after a restart")
            return
        job = resp.json()
        if job["state"] == "done":
            self.jobs_resumed += job.get("resumed", 0)
            self.acknowledge(w)
        elif job["state"] == "failed":
            w.outcome = "failed"
            self.findings.append(f"job {w.job} ({w.kind} {','.join(w.ids)}) failed: {job.get('error')}")

    def acknowledge(self, w: Write) -> None:
        w.outcome, w.ended = "acknowledged", time.monotonic()
        self.ledger.acknowledge(w.op, w.ids, w.name)

    def learn(self, writes: list[Write]) -> None:
        """Aim the next kills within the usual duration of a write of each kind (a running mean of the longest)."""
        for kind in self.duration_s:
            took = [w.ended - w.started for w in writes
                    if w.outcome == "acknowledged" and (w.proc is not None) == (kind == "cli")]
            if took:
                self.duration_s[kind] = 0.7 * self.duration_s[kind] + 0.3 * max(took)

    # -- checks ---------------------------------------------------------------------------------------------------

    def check_served(self) -> None:
        """The version the server serves is one the link named, its directory is there, and it never goes back."""
        resp = self.get("/indexes")
        if resp is None or resp.status_code != 200:
            return
        version = resp.json()["indexes"][0]["version"]
        n = version_number(version)
        if not self.watcher.was_linked(version):
            self.findings.append(f"served version {version!r} was never the index's link target")
        elif not (self.idx.parent / version / "manifest.json").is_file():
            self.findings.append(f"served version {version} has no manifest on disk")
        if n < self.served_max:
            self.findings.append(f"served version went back from v{self.served_max} to {version}")
        self.served_max = max(self.served_max, n)

    def check(self, r: int) -> str:
        t0 = time.monotonic()
        found = len(self.findings)
        verify = subprocess.run([sys.executable, "-m", "routerag.cli", "info", str(self.idx), "--verify", "--json"],
                                cwd=ROOT, capture_output=True, text=True)
        if verify.returncode != 0:
            self.findings.append(f"round {r}: info --verify failed: {verify.stderr.strip()[-500:]}")
        ids = self.index_ids()
        lost = sorted(set(self.ledger.present) - ids)
        back = sorted(set(self.ledger.absent) & ids)
        if lost:
            self.findings.append(f"round {r}: acknowledged adds lost: "
                                 + ", ".join(f"{i} ({self.ledger.present[i]})" for i in lost[:10]))
        if back:
            self.findings.append(f"round {r}: acknowledged deletes undone: "
                                 + ", ".join(f"{i} ({self.ledger.absent[i]})" for i in back[:10]))
        if not self.lock_free():
            self.findings.append(f"round {r}: the write lock is held with no writer running")
        status = "ok" if len(self.findings) == found else f"{len(self.findings) - found} FINDINGS"
        return (f"checks {status} ({len(ids)} passages, {len(self.ledger.present)} promised present, "
                f"{len(self.ledger.absent)} promised absent; {time.monotonic() - t0:.1f} s)")

    def index_ids(self) -> set[str]:
        from graph_index.store import IndexData

        with IndexData(self.idx) as data:
            return {p.id for p in data.passages}

    def lock_free(self) -> bool:
        from graph_index.lock import IndexBusyError, index_lock

        try:
            with index_lock(self.idx, timeout=0, op="crasher check"):
                return True
        except IndexBusyError as exc:
            # the server may be running a job whose 202 never arrived (it kept the job, then was killed): its own
            server = self.server.proc.pid if self.server is not None else None
            return server is not None and f"pid {server} " in str(exc)

    def leftovers(self) -> dict[str, list[str]]:
        """What killed writers left that no later write removed (not a loss; reported, not a finding): files beside
        the index that are neither its link, lock, jobs folder nor a version, and job files no record owns."""
        own = f".{self.idx.name}."
        beside = sorted(p.name for p in self.idx.parent.iterdir() if p.name.startswith(own)
                        and not re.fullmatch(rf"{re.escape(own)}(v\d+|lock|jobs)", p.name))
        jobs = self.idx.parent / f"{own}jobs"
        records = {p.name.split(".")[0] for p in jobs.glob("*.job.json")} if jobs.is_dir() else set()
        orphans = sorted(p.name for p in jobs.iterdir() if p.name.split(".")[0] not in records) if jobs.is_dir() else []
        return {"beside_index": beside, "job_files_without_record": orphans}

    def summary(self, started: float) -> dict[str, Any]:
        kills = {k: n for k, n in self.kills.items() if k != "server mid-job"}
        return {"rounds": self.rounds, "kills": kills, "kills_total": sum(kills.values()),
                "server_kills_mid_job": self.kills["server mid-job"],
                "writes": dict(self.writes), "acknowledged_present": len(self.ledger.present),
                "acknowledged_absent": len(self.ledger.absent), "jobs_resumed": self.jobs_resumed,
                "final_version": os.readlink(self.idx) if self.idx.is_symlink() else None,
                "leftovers": self.leftovers(),
                "minutes": round((time.monotonic() - started) / 60, 2), "findings": self.findings}


def ensure_index(idx: Path | None, work: Path) -> Path:
    if idx is not None:
        return idx.absolute()
    idx = work / "idx"
    if not idx.exists():
        print(f"building the sample index into {idx}", flush=True)
        subprocess.run([sys.executable, "-m", "routerag.cli", "build-graph", str(SAMPLE_CORPUS), "--out", str(idx),
                        "--cache-dir", str(work / "cache"), "--json"], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    return idx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", type=Path, help="An index to write to (default: the sample corpus, built in WORK).")
    ap.add_argument("--work", type=Path, help="Where the cache, logs and write files go (default: a temp dir).")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="Start no round after this many minutes from the first server's start (one round always).")
    ap.add_argument("--rounds", type=int, default=0, help="Stop after this many rounds.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="Summary JSON (default: WORK/crasher.json).")
    args = ap.parse_args()
    if not args.minutes and not args.rounds:
        ap.error("give --minutes or --rounds")
    work = (args.work or Path(tempfile.mkdtemp(prefix="crasher-"))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    idx = ensure_index(args.index, work)
    crasher = Crasher(idx, work, args.seed)
    started = time.monotonic()
    crasher.watcher.start()
    crasher.start_server()
    print(f"crasher: {idx}, server on {crasher.server.url}, work in {work}", flush=True)  # type: ignore[union-attr]
    try:
        r, started = 0, time.monotonic()  # the budget is for rounds: a slow first start does not eat it
        while r == 0 or ((not args.rounds or r < args.rounds) and (not args.minutes or
                                                                    time.monotonic() - started < args.minutes * 60)):
            r += 1
            print(crasher.round(r), flush=True)
    finally:
        crasher.watcher.stop.set()
        if crasher.server is not None:
            crasher.server.stop()
    report = crasher.summary(started)
    out = args.out or work / "crasher.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['rounds']} rounds in {report['minutes']} min, {report['kills_total']} kills "
          f"({', '.join(f'{k} {n}' for k, n in sorted(report['kills'].items()))}; "
          f"{report['server_kills_mid_job']} server kills with a job unfinished), writes "
          f"{', '.join(f'{k} {n}' for k, n in sorted(report['writes'].items()))}; "
          f"{len(report['findings'])} findings", flush=True)
    for f in report["findings"]:
        print("  FINDING:", f, flush=True)
    sys.exit(1 if report["findings"] else 0)


if __name__ == "__main__":
    main()
