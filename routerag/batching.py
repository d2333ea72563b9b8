"""Turning concurrent single requests into batches.

Many trajectories run at once (server requests, evaluation, rollouts); each asks for one generation or one search
at a time. :class:`MicroBatcher` gathers the requests that arrive within a few milliseconds into one call of a batch
function, run in a worker thread so the event loop stays free. The model or index then sees batches — one PageRank
solve, one padded forward pass — instead of a queue of singles behind a lock.

The requests of a batch come from unrelated callers (different HTTP requests, different rollouts), so one caller's
bad input must fail that caller only: a batch function returns an exception *in place of* the result of an item it
cannot serve, and when it raises for the whole batch instead, the batch is split and its items are rerun one at a
time, so the error reaches only the item that causes it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    def __init__(self, fn: Callable[[list[T]], Sequence[R | BaseException]], *, max_batch: int = 64,
                 max_wait_ms: float = 2.0, name: str = "batcher", exclusive: threading.Lock | None = None,
                 isolate_failures: bool = True) -> None:
        """``fn`` returns one result per item, in order, or an exception in place of an item's result (only that
        item's caller gets it). ``isolate_failures``: when ``fn`` raises for a batch of several items, rerun them
        one by one so that only the culprit fails (off: every waiter gets the batch's exception).

        ``exclusive``: a lock held while a batch runs; batchers sharing one never run at the same time (the local
        trainer gives its generator and its retriever one, so retrieval is timed without generation competing for
        the cores, since stage 2 rewards that time)."""
        self.fn = fn
        self.exclusive = exclusive
        self.isolate_failures = isolate_failures
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        # one worker thread: batches of one model run one after another, never interleaved
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._queues: dict[asyncio.AbstractEventLoop, asyncio.Queue] = {}
        self._lock = threading.Lock()
        self.batches = 0
        self.items = 0
        self.isolated = 0
        """Batches that failed as a whole and were rerun item by item."""

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        await self._queue(loop).put((item, fut))
        return await fut

    def _queue(self, loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
        with self._lock:
            q = self._queues.get(loop)
            if q is None:
                q = asyncio.Queue()
                self._queues[loop] = q
                loop.create_task(self._worker(q, loop))
            return q

    async def _worker(self, q: asyncio.Queue, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            first = await q.get()
            batch = [first]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    # take whatever is already waiting, without waiting more
                    while len(batch) < self.max_batch and not q.empty():
                        batch.append(q.get_nowait())
                    break
                try:
                    batch.append(await asyncio.wait_for(q.get(), timeout))
                except asyncio.TimeoutError:
                    break
            live = [(item, fut) for item, fut in batch if not fut.done()]  # cancelled requests are dropped
            if not live:
                continue
            self.batches += 1
            self.items += len(live)
            try:
                results = await loop.run_in_executor(self._executor, self._run, [item for item, _ in live])
            except Exception as exc:  # the executor itself failed (shut down): nothing can be served
                results = [exc] * len(live)
            for (_, fut), res in zip(live, results):
                if fut.done():
                    continue
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)

    def _run(self, items: list[T]) -> list[R | BaseException]:
        """One result or exception per item (in the worker thread)."""
        try:
            return self._checked(items)
        except Exception as exc:
            if not self.isolate_failures or len(items) == 1:
                return [exc] * len(items)
            self.isolated += 1
            out: list[R | BaseException] = []
            for item in items:  # which item broke the batch? each alone: only the culprit fails
                try:
                    out.extend(self._checked([item]))
                except Exception as single:
                    out.append(single)
            return out

    def _checked(self, items: list[T]) -> list[R | BaseException]:
        results = list(self._call(items))
        if len(results) != len(items):
            raise RuntimeError(f"batch function returned {len(results)} results for {len(items)} items")
        return results

    def _call(self, items: list[T]) -> Sequence[R | BaseException]:
        if self.exclusive is None:
            return self.fn(items)
        with self.exclusive:
            return self.fn(items)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
