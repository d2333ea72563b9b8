"""Ingestion over HTTP: passages added and deleted by background jobs, one at a time per index.

A job runs the same incremental update as ``routerag index add`` / ``delete`` (:mod:`graph_index.builder`, under the
index's write lock, published as a new version in one atomic rename), then the engine opens that version and swaps
it in (:meth:`routerag.engine.Engine.reload`). Queries are answered from the current version the whole time: none
waits for a job and none fails because of a swap.

Nothing is lost to a crash. A job's input is on disk before the job is accepted, and its record after every change
of state, beside the index (``.NAME.jobs/``, as the index's versions and lock are). A server killed mid-job still
serves the last published version when it restarts (a killed writer never publishes), and runs the job again: both
operations are idempotent (an add skips the passages already indexed, a delete removes the ids still there).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graph_index.atomic import write_bytes_atomic
from graph_index.corpus import CorpusError, load_corpus

from .protocol import Job, JobOp

log = logging.getLogger(__name__)

UPLOAD_SUFFIX = {"jsonl": ".upload.jsonl", "json": ".upload.json"}
RECORD = ".job.json"


class JobError(Exception):
    """A job request refused before it was accepted, with its HTTP status and error type."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def jobs_dir(index: Path) -> Path:
    """Where an index's jobs live: beside it, named after it, like its versions and write lock."""
    index = Path(index).absolute()
    return index.parent / f".{index.name}.jobs"


_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/>])/(?:[^\s'\"/:]+/)+([^\s'\":]+)")


def without_paths(message: str, index: Path, name: str) -> str:
    """A job's error as its client may read it: the index's own directory (and its versions and jobs beside it) as
    the index's name, any other absolute path as its file name. The server's log keeps the full message."""
    index = Path(index).absolute()
    for root in sorted({str(index.resolve()), str(index), str(index.parent.resolve()), str(index.parent)},
                       key=len, reverse=True):
        message = message.replace(root + "/", f"<{name}>/").replace(root, f"<{name}>")
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1), message)


class Target:
    """What a job needs of one served index: its path, and how to swap in and read the published version."""

    def __init__(self, path: Path, reload: Callable[[], Any], passages: Callable[[], list[Any]]) -> None:
        self.path, self.reload, self.passages = Path(path), reload, passages


class JobRunner:
    """Accepts, runs, persists and resumes the ingestion jobs of several indexes."""

    def __init__(self, targets: dict[str, Target], build_settings: Any, *, components: dict[str, Any] | None = None,
                 max_pending: int = 4, on_finish: Callable[[Job], None] | None = None) -> None:
        self.targets = targets
        self.settings = build_settings
        self.components = components or {}
        """Per index, the build's loaded models (:class:`graph_index.builder.Components`) for its updates; an index
        without them loads its models for every job, as ``routerag index add`` does."""
        self.max_pending = max_pending
        self.on_finish = on_finish
        self.jobs: dict[str, Job] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        for name, target in targets.items():
            for record in sorted(jobs_dir(target.path).glob(f"*{RECORD}")):
                try:
                    job = Job.model_validate_json(record.read_bytes())
                except ValueError as exc:
                    log.warning("ignoring the unreadable job record %s: %s", record, exc)
                    continue
                if job.index == name:
                    self.jobs[job.id] = job

    # -- accepting ------------------------------------------------------------------------------------------------

    def pending(self, index: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.index == index and j.state in ("queued", "running")]

    def _admit(self, index: str) -> None:
        waiting = self.pending(index)
        if len(waiting) >= self.max_pending:
            raise JobError(409, "conflict", f"index {index!r} already has {len(waiting)} ingestion jobs queued or "
                                            f"running ({', '.join(j.id for j in waiting)}; server.max_pending_jobs "
                                            f"= {self.max_pending}); wait for one to finish")

    async def submit_add(self, index: str, body: bytes, kind: str) -> Job:
        """Validate an upload of passages (JSONL or a JSON array), keep it on disk, and queue the job. A malformed
        record is refused here, with its line, before anything is queued."""
        self._admit(index)
        job = self._new(index, "add")
        folder = jobs_dir(self.targets[index].path)
        folder.mkdir(parents=True, exist_ok=True)
        upload = folder / f"{job.id}{UPLOAD_SUFFIX[kind]}"
        write_bytes_atomic(upload, body, fsync=True)
        try:
            passages, report = await asyncio.get_running_loop().run_in_executor(None, self._parse, upload)
        except CorpusError as exc:
            upload.unlink(missing_ok=True)
            raise JobError(422, "invalid_document", str(exc).replace(str(upload), "body")) from None
        job.counts = {"records": report.records, "uploaded": len(passages)}
        return self._queue(job)

    async def submit_delete(self, index: str, ids: list[str]) -> Job:
        """Queue the deletion of ``ids``; ids the index does not hold are refused (404) and nothing is queued."""
        self._admit(index)
        known = {p.id for p in self.targets[index].passages()}
        unknown = sorted(set(ids) - known)
        if unknown:
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise JobError(404, "not_found", f"index {index!r} has no passages with ids: "
                                             f"{', '.join(map(repr, unknown[:10]))}{more}")
        if len(known - set(ids)) == 0:
            raise JobError(409, "conflict", "deleting these ids would leave the index empty")
        job = self._new(index, "delete")
        folder = jobs_dir(self.targets[index].path)
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(folder / f"{job.id}.ids.json", json.dumps(sorted(set(ids))).encode(), fsync=True)
        job.counts = {"requested": len(set(ids))}
        return self._queue(job)

    def _parse(self, upload: Path) -> tuple[list[Any], Any]:
        return load_corpus([upload], **self.settings.corpus.model_dump())

    def _new(self, index: str, op: JobOp) -> Job:
        return Job(id=uuid.uuid4().hex[:16], index=index, op=op, state="queued", created=time.time())

    def _queue(self, job: Job) -> Job:
        self.jobs[job.id] = job
        self._save(job)
        self._spawn(job)
        return job

    # -- running --------------------------------------------------------------------------------------------------

    def resume(self) -> list[Job]:
        """Start again the jobs a previous server left queued or running (call from the running event loop)."""
        left = sorted((j for j in self.jobs.values() if j.state in ("queued", "running")), key=lambda j: j.created)
        for job in left:
            job.resumed += 1
            job.state = "queued"
            self._save(job)
            log.warning("resuming ingestion job %s (%s on %s) left unfinished by a previous server", job.id,
                        job.op, job.index)
            self._spawn(job)
        return left

    async def drain(self) -> None:
        """Wait for the running and queued jobs (tests, and a graceful shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _spawn(self, job: Job) -> None:
        task = asyncio.get_running_loop().create_task(self._run(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, job: Job) -> None:
        lock = self._locks.setdefault(job.index, asyncio.Lock())
        async with lock:  # one job at a time per index, in the order they were accepted
            loop = asyncio.get_running_loop()
            job.state, job.started = "running", time.time()
            self._save(job)
            try:
                counts = await loop.run_in_executor(None, self._apply, job)
                job.counts.update(counts)
                job.state = "done"
            except Exception as exc:  # the job's failure is its record's business, not the server's
                log.warning("ingestion job %s failed: %s", job.id, exc)
                message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
                job.state, job.error = "failed", without_paths(message, self.targets[job.index].path, job.index)
            job.finished = time.time()
            self._save(job)
            self._discard_input(job)
            if self.on_finish is not None:
                self.on_finish(job)

    def _apply(self, job: Job) -> dict[str, int]:
        """The update itself, in a worker thread: write the new version, then swap it into the engine."""
        from graph_index.builder import add_to_index, delete_from_index

        target = self.targets[job.index]
        folder = jobs_dir(target.path)
        if job.op == "add":
            upload = next(folder.glob(f"{job.id}.upload.*"))
            try:
                manifest = add_to_index(target.path, [upload], self.settings,
                                        components=self.components.get(job.index), progress=False)
            except CorpusError as exc:
                raise CorpusError(str(exc).replace(str(upload), "body"), exc.kind) from None
            target.reload()  # also when nothing was added: another writer may have published what this served
            return {"added": manifest["history"][-1]["added"], "duplicates": manifest["corpus"]["duplicates"],
                    "passages": manifest["counts"]["passages"]}
        ids = json.loads((folder / f"{job.id}.ids.json").read_text())
        # what is still there when the write lock is held (a resumed job, or another writer, may have removed some)
        manifest = delete_from_index(target.path, ids, self.settings, components=self.components.get(job.index),
                                     progress=False, missing_ok=True)
        target.reload()  # also when nothing was left to delete: the served version may predate another writer's
        return {"deleted": manifest["history"][-1]["deleted"], "passages": manifest["counts"]["passages"]}

    # -- records --------------------------------------------------------------------------------------------------

    def _save(self, job: Job) -> None:
        folder = jobs_dir(self.targets[job.index].path)
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(folder / f"{job.id}{RECORD}", job.model_dump_json(indent=1).encode(), fsync=True)

    def _discard_input(self, job: Job) -> None:
        for leftover in jobs_dir(self.targets[job.index].path).glob(f"{job.id}.*"):
            if leftover.name != f"{job.id}{RECORD}":
                leftover.unlink(missing_ok=True)
