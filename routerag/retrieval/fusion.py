"""Reciprocal Rank Fusion (Cormack et al. 2009): score(d) = Σ over lists of 1 / (rrf_k + rank of d), ranks from 1.

``rrf_k`` is RRF's smoothing constant (:data:`~routerag.config.RRF_K`), not ``k``, the documents per search."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from routerag.config import RRF_K


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hashable]], rrf_k: int = RRF_K, *,
                           k: int | None = None) -> list[tuple[Hashable, float]]:
    """Fuse ranked lists of ids into one list of (id, score), best first. ``k`` is ``rrf_k``'s former name, still
    read.

    Ties (the same fused score) go to the id with the better best rank, then to the earlier list, so the result
    is deterministic.
    """
    if k is not None:
        rrf_k = k
    scores: dict[Hashable, float] = {}
    best: dict[Hashable, tuple[int, int]] = {}
    for li, ranking in enumerate(rankings):
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (rrf_k + rank)
            if doc not in best or (rank, li) < best[doc]:
                best[doc] = (rank, li)
    return sorted(scores.items(), key=lambda kv: (-kv[1], best[kv[0]]))
