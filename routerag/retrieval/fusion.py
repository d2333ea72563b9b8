"""Reciprocal Rank Fusion (Cormack et al. 2009): score(d) = Σ over lists of 1 / (k + rank of d), ranks from 1."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hashable]], k: int = 60) -> list[tuple[Hashable, float]]:
    """Fuse ranked lists of ids into one list of (id, score), best first.

    Ties (the same fused score) go to the id with the better best rank, then to the earlier list, so the result
    is deterministic.
    """
    scores: dict[Hashable, float] = {}
    best: dict[Hashable, tuple[int, int]] = {}
    for li, ranking in enumerate(rankings):
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
            if doc not in best or (rank, li) < best[doc]:
                best[doc] = (rank, li)
    return sorted(scores.items(), key=lambda kv: (-kv[1], best[kv[0]]))
