"""The small Curie index that tests which rewrite index files start from: built once per module, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

from graph_index.builder import Components, build_index
from routerag.config import Settings

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def build_curie_index(d: Path, embedder) -> Path:  # noqa: ANN001 - the session's MiniLM fixture
    """``d/idx`` built from the Curie fixture with its recorded OpenIE (no extractor runs), cache in ``d/cache``."""
    cfg = Settings(cache_dir=d / "cache")
    build_index([FIX / "curie.jsonl"], d / "idx", cfg, openie_results=FIX / "curie_openie.json", progress=False,
                components=Components(cfg, embedder=embedder))
    return d


def writable_copy(base: Path, tmp_path: Path) -> Path:
    """A copy of ``base`` (from :func:`build_curie_index`) that a test may damage or rewrite; returns its index."""
    shutil.copytree(base, tmp_path / "w", symlinks=True)
    return tmp_path / "w" / "idx"
