"""Passage and fact vectors in Milvus (issue 39), against the real Milvus Lite engine: every mode returns what the
FAISS path returns, collections are reused by content and re-uploaded when cut short, and a bad setting is a clear
error."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pymilvus", reason="the milvus extra is not installed")
pytest.importorskip("milvus_lite", reason="the milvus extra is not installed")

from routerag.config import RetrievalConfig  # noqa: E402
from routerag.retrieval import Retriever  # noqa: E402
from routerag.retrieval.vector_store import content_key  # noqa: E402

QUERIES = ["Where was Joran Veld born?", "What does Tarsk trade?", "Which river flows through Brannock?",
           "glassblower windows chapels"]


def milvus_retriever(index: Path, uri: Path, minilm) -> Retriever:  # noqa: ANN001
    return Retriever(index, RetrievalConfig(vector_store="milvus", milvus_uri=str(uri)), embedder=minilm)


@pytest.fixture(scope="module")
def milvus_db(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("milvus") / "routerag.db"


def test_milvus_search_equals_faiss_in_every_mode(index: Path, retriever: Retriever, milvus_db: Path,
                                                  minilm) -> None:
    mine = milvus_retriever(index, milvus_db, minilm)
    for mode in ("passage", "graph", "hybrid"):
        for got, want in zip(mine.search(QUERIES, mode, 5), retriever.search(QUERIES, mode, 5)):
            assert [d.id for d in got.docs] == [d.id for d in want.docs], mode
            assert np.allclose([d.score for d in got.docs], [d.score for d in want.docs], atol=1e-5)
    q = retriever.embed(QUERIES)
    a, b = mine.fact_scorer.match(q, 3), retriever.fact_scorer.match(q, 3)
    assert (a.top == b.top).all() and np.allclose(a.lo, b.lo, atol=1e-5) and np.allclose(a.hi, b.hi, atol=1e-5)
    mine.milvus.close()


def test_collections_are_reused_by_content_and_uploaded_again_when_cut_short(index: Path, retriever: Retriever,
                                                                             milvus_db: Path, minilm, caplog) -> None:
    first = milvus_retriever(index, milvus_db, minilm)
    name = f"routerag_{content_key(retriever.data.manifest)}_passages"
    assert name in first.milvus.client.list_collections()
    first.milvus.client.delete(name, ids=[0, 1])  # an upload cut off, or rows lost
    first.milvus.client.flush(name)
    first.milvus.close()
    with caplog.at_level(logging.WARNING, logger="routerag.retrieval.vector_store"):
        again = milvus_retriever(index, milvus_db, minilm)
    assert "uploading it again" in caplog.text
    got = again.search(QUERIES, "passage", 5)
    assert [[d.id for d in r.docs] for r in got] == [[d.id for d in r.docs]
                                                    for r in retriever.search(QUERIES, "passage", 5)]
    again.milvus.close()


def test_milvus_without_a_uri_is_a_clear_error(index: Path, minilm) -> None:
    with pytest.raises(ValueError, match="milvus_uri"):
        Retriever(index, RetrievalConfig(vector_store="milvus"), embedder=minilm)
