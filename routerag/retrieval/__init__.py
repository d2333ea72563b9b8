"""Query-time retrieval over a built index: dense, graph (Personalized PageRank) and hybrid (RRF)."""

from .retriever import QueryError, RetrievalResult, RetrievedDoc, Retriever

__all__ = ["QueryError", "RetrievalResult", "RetrievedDoc", "Retriever"]
