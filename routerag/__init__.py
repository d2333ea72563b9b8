"""RouteRAG server: graph-text hybrid retrieval-augmented generation with a learned router."""

__version__ = "0.1.0"
