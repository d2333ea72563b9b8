"""Query-time retrieval over a built index: dense, graph (Personalized PageRank) and hybrid (RRF).

The value types (:mod:`.types`) load at once; :class:`Retriever` (FAISS, scipy, the embedders) on first use, so
code that only names a result does not pay for the retriever's imports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .types import QueryError, RetrievalResult, RetrievedDoc

if TYPE_CHECKING:
    from .retriever import Retriever

__all__ = ["QueryError", "RetrievalResult", "RetrievedDoc", "Retriever"]


def __getattr__(name: str) -> Any:
    if name == "Retriever":
        from .retriever import Retriever

        return Retriever
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
