"""Shared fixtures: real embedded models loaded once per session, fresh caches per test, and the shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graph_index.builder import Components
from graph_index.config import EmbedderConfig, ExtractorConfig
from routerag.config import Settings

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED_DATA = Path(os.environ.get("ROUTERAG_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (or ``$ROUTERAG_SHARED_DATA``); tests that need it skip cleanly without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared benchmark data not found at {SHARED_DATA} (set ROUTERAG_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm():
    """The embedded all-MiniLM-L6-v2, loaded once."""
    from graph_index.embedders import make_embedder

    return make_embedder(EmbedderConfig())


@pytest.fixture(scope="session")
def spacy_extractor():
    """The embedded spaCy extractor, single process (tests feed it a few passages at a time)."""
    from graph_index.openie import make_extractor

    return make_extractor(ExtractorConfig(n_process=1))


@pytest.fixture
def build_cfg(tmp_path: Path) -> Settings:
    """Default build settings with a cache private to this test."""
    return Settings(cache_dir=tmp_path / "cache")


@pytest.fixture
def components(build_cfg: Settings, minilm, spacy_extractor) -> Components:
    """Build components reusing the session's models, so each build costs no model load."""
    return Components(build_cfg, embedder=minilm, extractor=spacy_extractor)


@pytest.fixture
def sample_corpus() -> Path:
    return ROOT / "samples" / "corpus.jsonl"


@pytest.fixture(scope="session")
def index(tmp_path_factory, minilm, spacy_extractor) -> Path:
    """The two-hop fixture corpus as an index, built once and only read (the server tests share it; a module that
    needs another index defines its own ``index``)."""
    from .helpers.server_helpers import build_small_index

    return build_small_index(tmp_path_factory.mktemp("twohop") / "idx", minilm, spacy_extractor)


@pytest.fixture(scope="session")
def retriever(index: Path, minilm):
    """A retriever over :func:`index` (thread-safe, no event-loop state, so one serves every module)."""
    from routerag.config import RetrievalConfig
    from routerag.retrieval import Retriever

    return Retriever(index, RetrievalConfig(), embedder=minilm)
