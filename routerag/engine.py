"""The question-answering engine over one index: retriever + batched search + policy backend + policy loop.

The server, ``routerag ask`` and evaluation all build one of these from :class:`~routerag.config.Settings`; tests
pass their own generator or search backend.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from .batching import MicroBatcher
from .config import EMBEDDED_ROUTER, Settings
from .policy import LoopConfig, PolicyLoop, Trajectory
from .policy.backends import make_generator, reader_model
from .policy.card import resolve_policy
from .policy.loop import EventSink
from .policy.search import LocalSearch, ShardSearch
from .policy.types import Generator, SearchBackend
from .retrieval import Retriever
from .retrieval.types import QueryError, RetrievalResult
from .retrieval.shards import ShardedRetriever
from .vocabulary import ASK_MODES, AskMode, Mode

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, index: str | Path | None, settings: Settings | None = None, *,
                 generator: Generator | None = None, search: SearchBackend | None = None,
                 retriever: Retriever | None = None, answer_generator: Generator | None = None,
                 shards: ShardedRetriever | None = None) -> None:
        self.settings = settings or Settings()
        self.index = index
        """The index's path (what :meth:`reload` opens again after an update); None with ``shards``."""
        self.shards = shards
        """Shard servers searched instead of a local index (``routerag serve --shards``)."""
        pol = self.settings.policy
        if shards is not None:
            self.retriever = None
            search = search or ShardSearch(shards)
        else:
            if index is None and retriever is None:
                raise ValueError("an engine needs an index, a retriever or shards")
            self.retriever = retriever or Retriever(index, self.settings.retrieval)  # type: ignore[arg-type]
        if generator is None:
            generator = make_generator(pol.generator)
        self.generator = generator
        exclusive = None
        gen_batcher = getattr(generator, "batcher", None)
        if pol.isolate_retrieval and isinstance(gen_batcher, MicroBatcher):  # in-process models only
            # engines over several indexes share one model: they share its lock too, or one index's searches
            # would run during another's generation
            exclusive = gen_batcher.exclusive = gen_batcher.exclusive or threading.Lock()
        self.search = search or LocalSearch(self.retriever, exclusive=exclusive)
        self.policy = resolve_policy(pol)
        """The loop settings, template and reader in effect: the user's, else the policy's card, else defaults."""
        if (self.policy.reader == "base" and pol.reader is None and answer_generator is None
                and pol.generator.model == EMBEDDED_ROUTER and pol.generator.adapter is None
                and getattr(generator, "base_view", None) is None):
            # the default settings name the embedded router, whose card reads with its base model and trims the
            # reply to a span; a generator handed in instead (a test double, a program's own) cannot switch an adapter
            # off, so its own answers stand, untrimmed unless the user says otherwise. A card the user chose (an
            # adapter, a model folder) still fails in reader_model, saying what to change.
            log.warning("the embedded router's card reads with its base model, which the generator given (%s) "
                        "cannot provide; its own answers stand (set policy.reader to choose)", generator.name)
            self.policy = replace(self.policy, reader="policy",
                                  short_answer=bool(pol.short_answer))
        if (self.policy.reader == "extractive" and pol.reader is None and pol.generator.model == EMBEDDED_ROUTER
                and pol.generator.adapter is None
                and (answer_generator is not None or getattr(generator, "base_view", None) is None)):
            # the same rule for the embedded router's extractive reader: a reader model handed in reads instead, and
            # a generator handed in instead of the router (a test double, a program's own) answers on its own
            self.policy = replace(self.policy, reader="generator" if answer_generator is not None else "policy",
                                  short_answer=bool(pol.short_answer) if answer_generator is None
                                  else self.policy.short_answer)
        if answer_generator is None:
            answer_generator = reader_model(self.policy.reader, generator, pol.answer_generator)
        self.loop_config = LoopConfig.from_policy(pol, self.policy, answer_generator=answer_generator)
        self.loop = PolicyLoop(self.generator, self.search, self.loop_config)
        self._ready = False

    async def ask(self, question: str, *, mode: AskMode = "learned", budget: int | None = None,
                  k: int | None = None, on_event: EventSink | None = None) -> Trajectory:
        """Run the policy loop on one question. ``mode`` other than ``learned`` forces that retrieval mode."""
        if mode not in ASK_MODES:
            raise QueryError(f"unknown mode {mode!r}; choose one of {', '.join(ASK_MODES)}")
        overrides: dict[str, Any] = {}
        if mode != "learned":
            overrides["force_mode"] = mode
        if budget is not None:
            overrides["budget"] = budget
        if k is not None:
            overrides["k"] = k
        return await self.loop.run(question, on_event=on_event, **overrides)

    async def retrieve(self, queries: list[str], mode: Mode, k: int) -> list[RetrievalResult]:
        """Batched retrieval without the policy (the ``/retrieve`` endpoint), off the event loop; over shards, one
        fan-out whose results say how each shard answered."""
        if self.shards is not None:
            results, _ = await self.shards.search(queries, mode, k)
            return results
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.retriever.search(queries, mode=mode, k=k))

    async def shard_stage(self, queries: list[str], stage: str, seeds: list[dict[str, Any]] | None,
                          k: int) -> list[dict[str, Any]] | list[RetrievalResult]:
        """This index as one shard of a sharded graph search (:mod:`routerag.retrieval.shard_seeds`): its seeding
        candidates (``seeds``), or its passages ranked from the global seeding (``rank``)."""
        from .retrieval import shard_seeds

        if self.retriever is None:
            raise QueryError("this server searches shards itself; it cannot serve as a shard")
        retriever = self.retriever
        if stage == "seeds":
            work = lambda: shard_seeds.seed_candidates(retriever, queries)  # noqa: E731
        else:
            if seeds is None or len(seeds) != len(queries):
                raise QueryError("stage rank needs one seeding per query")
            work = lambda: shard_seeds.rank_with_seeds(retriever, queries, seeds, k)  # noqa: E731
        return await asyncio.get_running_loop().run_in_executor(None, work)

    def reload(self) -> Retriever:
        """Open the index's current version, warm it up, then swap it in for every later search; returns the new
        retriever. Searches already running finish on the version they started with, and no request waits: the
        server calls this after an ingestion job published a new version (old versions stay readable while
        pinned). Costs one index load off the event loop, and the memory of two versions until the old is freed."""
        if not isinstance(self.search, LocalSearch) or self.search.retriever is not self.retriever:
            raise ValueError("this engine does not search its own index in process; nothing to reload")
        fresh = Retriever(self.index, self.settings.retrieval, embedder=self.retriever.embedder)
        fresh.warm_up()
        self.retriever = self.search.retriever = fresh
        return fresh

    def warm_up(self) -> None:
        """Load the lazily loaded parts (the graph, the query encoder) before serving: the first request of a cold
        engine would otherwise pay seconds."""
        if self.retriever is not None:
            self.retriever.warm_up()
        self._ready = True

    @property
    def ready(self) -> bool:
        """True once :meth:`warm_up` has run (the server's ``/ready``)."""
        return self._ready
