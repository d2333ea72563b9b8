"""Turning concurrent single requests into batches.

Many trajectories run at once (server requests, evaluation, rollouts); each asks for one generation or one search
at a time. :class:`MicroBatcher` gathers the requests that arrive within a few milliseconds into one call of a batch
function, run in a worker thread so the event loop stays free. The model or index then sees batches — one PageRank
solve, one padded forward pass — instead of a queue of singles behind a lock.
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
    def __init__(self, fn: Callable[[list[T]], Sequence[R]], *, max_batch: int = 64, max_wait_ms: float = 2.0,
                 name: str = "batcher", exclusive: threading.Lock | None = None) -> None:
        """``exclusive``: a lock held while a batch runs; batchers sharing one never run at the same time (the local
        trainer gives its generator and its retriever one, so retrieval is timed without generation competing for
        the cores, since stage 2 rewards that time)."""
        self.fn = fn
        self.exclusive = exclusive
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        # one worker thread: batches of one model run one after another, never interleaved
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._queues: dict[asyncio.AbstractEventLoop, asyncio.Queue] = {}
        self._lock = threading.Lock()
        self.batches = 0
        self.items = 0

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
                results = await loop.run_in_executor(self._executor, self._call, [item for item, _ in live])
                if len(results) != len(live):
                    raise RuntimeError(f"batch function returned {len(results)} results for {len(live)} items")
            except Exception as exc:  # every waiter of the batch gets the error
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), res in zip(live, results):
                if not fut.done():
                    fut.set_result(res)

    def _call(self, items: list[T]) -> Sequence[R]:
        if self.exclusive is None:
            return self.fn(items)
        with self.exclusive:
            return self.fn(items)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
