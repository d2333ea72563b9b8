"""Query-time retrieval over a built index: dense, graph (Personalized PageRank) and hybrid (RRF)."""

from .retriever import MODES, Mode, QueryError, RetrievalResult, RetrievedDoc, Retriever

__all__ = ["MODES", "Mode", "QueryError", "RetrievalResult", "RetrievedDoc", "Retriever"]
