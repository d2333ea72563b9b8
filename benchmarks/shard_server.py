"""A retrieval-only ``/retrieve`` server over one shard, for ``benchmarks/shards.py``: the real app and retriever,
and a policy that is never asked (a shard serves retrieval only). ``python benchmarks/shard_server.py INDEX PORT``."""

from __future__ import annotations

import sys

import uvicorn

from routerag.config import Settings
from routerag.engine import Engine
from routerag.prompts import chatml
from routerag.runtime import configure_threads
from server.app import create_app


class NoPolicy:
    """A shard answers /retrieve; /ask on a shard is a configuration mistake, refused loudly."""

    name = "none (retrieval-only shard)"
    tracks_tokens = False
    tokenizer = None

    def render_prompt(self, user_message: str) -> tuple[str, None]:
        return chatml(user_message), None

    async def generate(self, request):  # noqa: ANN001, ANN201
        raise RuntimeError("this shard server answers /retrieve only")


if __name__ == "__main__":
    configure_threads()
    settings = Settings(policy={"reader": "policy"})
    engine = Engine(sys.argv[1], settings, generator=NoPolicy())
    engine.warm_up()
    uvicorn.run(create_app({"shard": engine}, settings), host="127.0.0.1", port=int(sys.argv[2]),
                log_level="warning")
