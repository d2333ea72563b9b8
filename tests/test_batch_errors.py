"""One caller's bad input fails that caller only: micro-batches mix the requests of unrelated trajectories, so an
error must reach the request that caused it and not its neighbours in the batch (the batcher, the retriever's
per-query validation, the in-process generator's per-request checks, and the whole path through /ask)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from routerag.batching import MicroBatcher
from routerag.config import RetrievalConfig, Settings
from routerag.engine import Engine
from routerag.policy.search import LocalSearch
from routerag.policy.types import GenerationRequest
from routerag.retrieval import Retriever
from routerag.retrieval.types import QueryError
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy


def gather_in_one_batch(batcher: MicroBatcher, items: list) -> list:
    """Submit every item at once and return each result or exception, checking they shared one batch."""
    async def go() -> list:
        before = batcher.batches
        out = await asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True)
        assert batcher.batches - before == 1
        return list(out)

    return asyncio.run(go())


@pytest.mark.parametrize("style", ["returned", "raised"])
def test_a_bad_item_fails_alone(style: str) -> None:
    def fn(items: list[int]) -> list[int | Exception]:
        if style == "raised" and -1 in items:
            raise ValueError("negative")  # the whole batch: the batcher reruns its items one by one
        return [ValueError("negative") if i < 0 else i * 10 for i in items]

    b = MicroBatcher(fn, max_wait_ms=100)
    out = gather_in_one_batch(b, [1, -1, 2])
    assert out[0] == 10 and out[2] == 20
    assert isinstance(out[1], ValueError) and str(out[1]) == "negative"
    assert b.isolated == (1 if style == "raised" else 0)
    b.close()


def test_without_isolation_the_whole_batch_fails() -> None:
    def fn(items: list[int]) -> list[int]:
        raise RuntimeError("device lost")

    b = MicroBatcher(fn, max_wait_ms=100, isolate_failures=False)
    assert all(isinstance(r, RuntimeError) for r in gather_in_one_batch(b, [1, 2]))
    b.close()


@pytest.fixture(scope="module")
def short_retriever(index: Path, minilm) -> Retriever:
    """Queries over 60 characters are refused (the policy writes longer ones by mistake)."""
    return Retriever(index, RetrievalConfig(max_query_chars=60), embedder=minilm)


def test_a_refused_query_does_not_fail_its_neighbours(short_retriever: Retriever) -> None:
    long = "Where was Joran Veld born and what did he do " * 3
    out = short_retriever.search_each(["Joran Veld", long, "   "], mode="passage", k=2)
    assert out[0].docs[0].title == "Joran Veld"
    assert isinstance(out[1], QueryError) and "longer than 60" in str(out[1])
    assert isinstance(out[2], QueryError) and "empty query" in str(out[2])
    with pytest.raises(QueryError):  # a caller who sends one batch still gets one error
        short_retriever.search(["Joran Veld", long], mode="passage", k=2)

    search = LocalSearch(short_retriever, max_wait_ms=200)  # long enough for both searches to share a batch
    res = gather_in_one_batch(search.batcher, [("Joran Veld", "graph", 2), (long, "graph", 2),
                                               ("Kesh", "web", 2)])
    assert res[0].docs[0].title == "Joran Veld"
    assert isinstance(res[1], QueryError) and isinstance(res[2], QueryError) and "unknown mode" in str(res[2])


def test_a_bad_generation_request_does_not_fail_its_neighbours() -> None:
    from routerag.config import GeneratorConfig
    from routerag.policy.backends.transformers_backend import TransformersGenerator
    from training.models import tiny_random_model

    model, tok = tiny_random_model(0)
    gen = TransformersGenerator(GeneratorConfig(model="tiny-random", max_wait_ms=200), model=model, tokenizer=tok)
    good = GenerationRequest("hello", tok.encode("hello", add_special_tokens=False), max_tokens=3, stop=())
    out_of_vocab = GenerationRequest("x", [5, 10 ** 7], max_tokens=3, stop=())  # an index error in the embedding
    too_long = GenerationRequest("y", [5] * 4096, max_tokens=3, stop=())  # fills the tiny model's context
    res = gather_in_one_batch(gen.batcher, [good, out_of_vocab, too_long])
    assert len(res[0].token_ids) == 3
    assert isinstance(res[1], ValueError) and "outside the model's vocabulary" in str(res[1])
    assert isinstance(res[2], ValueError) and "context of 4096" in str(res[2])
    gen.batcher.close()


def test_one_ask_with_a_refused_search_leaves_a_concurrent_ask_intact(index: Path, short_retriever: Retriever) -> None:
    """The hostile user's case: request B's policy writes a query the retriever refuses, in the same retrieval
    batch as request A's valid search; A must get its documents, B an invalid turn (its own mistake)."""
    settings = Settings()
    search = LocalSearch(short_retriever, max_wait_ms=300)
    engine = Engine(index, settings, generator=RoutingPolicy(), retriever=short_retriever, search=search)
    app = create_app(engine, settings)
    valid, too_long = "Where was Joran Veld born?", "What is known about Joran Veld, " + "his family " * 6 + "?"

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            return list(await asyncio.gather(*(c.post("/ask", json={"question": q, "budget": 1})
                                               for q in (valid, too_long))))

    a, b = asyncio.run(go())
    assert a.status_code == b.status_code == 200
    # A searched once and B's retries are sequential: one batch of two means A's search shared it with one of B's
    assert search.batcher.items == search.batcher.batches + 1
    first = a.json()["trace"][0]
    assert first["action"] == "search" and first["doc_titles"][0] == "Joran Veld" and a.json()["finish"] == "answer"
    assert b.json()["trace"][0]["action"] == "invalid"
    search.batcher.close()
