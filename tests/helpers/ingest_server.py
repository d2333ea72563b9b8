"""A real server process over one index with the test policy, for the kill -9 ingestion test:
``python -m tests.helpers.ingest_server INDEX PORT``. Its build models (MiniLM, spaCy) are the embedded ones."""

from __future__ import annotations

import sys
from pathlib import Path

import uvicorn

from graph_index.builder import Components, config_for_update
from routerag.config import Settings
from routerag.engine import Engine
from server.app import create_app

from .server_helpers import RoutingPolicy


def main(index: str, port: int) -> None:
    settings = Settings(cache_dir=Path(index).parent / "cache")
    engine = Engine(index, settings, generator=RoutingPolicy())
    components = {"idx": Components(config_for_update(engine.retriever.data, settings),
                                    embedder=engine.retriever.embedder)}
    app = create_app({"idx": engine}, settings, components=components)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
