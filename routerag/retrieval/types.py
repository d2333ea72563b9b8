"""The retriever's value types: what a search returns, and the error for a query it refuses.

Kept apart from :mod:`.retriever` (FAISS, scipy, the embedders) so the policy loop, the server, evaluation and the
rewards can name them without loading a retriever."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..vocabulary import Mode


class QueryError(ValueError):
    """A query the retriever cannot take (empty, too long, unknown mode)."""


@dataclass(slots=True)
class RetrievedDoc:
    id: str
    title: str
    text: str
    score: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text, "score": round(self.score, 6)}


@dataclass(slots=True)
class RetrievalResult:
    query: str
    mode: Mode
    docs: list[RetrievedDoc]
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Per stage; in a batch each stage's time is shared equally by its queries."""
    facts: list[tuple[tuple[str, str, str], float]] = field(default_factory=list)
    """Graph and hybrid modes: the facts that seeded the PageRank, with their normalised scores."""
    fallback: str | None = None
    """Why graph seeding fell back, if it did (e.g. no fact links to an entity)."""
    shards: list[Any] = field(default_factory=list)
    """Sharded retrieval (:mod:`routerag.retrieval.shards`): how each shard answered the fan-out."""

    @property
    def ms(self) -> float:
        return round(sum(self.timings_ms.values()), 3)

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "mode": self.mode, "docs": [d.to_json() for d in self.docs], "ms": self.ms}
