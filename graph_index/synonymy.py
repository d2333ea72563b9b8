"""Synonymy edges: entity pairs whose embeddings have cosine ≥ a threshold, found with FAISS range search.

Each entity keeps at most ``max_neighbors`` synonyms, best first (ties by name), and an edge exists when either
end keeps the other. Scores are recomputed exactly (float64) for every candidate pair, so the result does not
depend on how FAISS blocked its arithmetic — which is what lets an incremental update recompute only the
entities it touched and still equal a full rebuild.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import faiss
import numpy as np

from .config import GraphConfig

from .normalize import alnum_count

_CANDIDATE_MARGIN = 1e-3  # FAISS float32 scores are within this of the exact ones
_QUERY_BLOCK = 4096

Selections = dict[str, list[tuple[str, float]]]
"""entity → the synonyms it keeps, best first, with exact cosine."""


@dataclass(slots=True)
class SynonymyStats:
    queried: int = 0
    recomputed: int = 0


def select_synonyms(
    keys: Sequence[str],
    embs: np.ndarray,
    cfg: GraphConfig,
    *,
    previous: Selections | None = None,
    previous_keys: set[str] | None = None,
) -> tuple[Selections, SynonymyStats]:
    """Synonym lists for every entity in ``keys`` (rows of ``embs``).

    With ``previous`` (the lists of an earlier index over ``previous_keys``), only entities whose list can have
    changed are recomputed: new entities, entities that kept a removed one, and entities within the threshold
    of a new one. The result equals a from-scratch computation.
    """
    stats = SynonymyStats()
    eligible = np.array([alnum_count(k) >= cfg.synonymy_min_alnum for k in keys], dtype=bool)
    rows = np.flatnonzero(eligible)
    out: Selections = {}
    if len(rows) < 2:
        return out, stats
    vecs = np.ascontiguousarray(embs[rows], dtype=np.float32)
    index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(vecs)
    row_keys = [keys[i] for i in rows]

    if previous is None or previous_keys is None:
        dirty = np.arange(len(rows))
    else:
        current = set(row_keys)
        added = [j for j, k in enumerate(row_keys) if k not in previous_keys]
        removed = previous_keys - set(keys)
        dirty_set = set(added)
        key_to_j = {k: j for j, k in enumerate(row_keys)}
        for k, kept in previous.items():
            if k in current and any(n in removed for n, _ in kept):
                dirty_set.add(key_to_j[k])
        if added:
            # old entities near a new one may take it into their lists
            for _, cands, _ in _candidates(index, vecs, np.asarray(added), cfg.synonymy_threshold):
                dirty_set.update(int(c) for c in cands)
        dirty = np.array(sorted(dirty_set), dtype=np.int64)
        for k, kept in previous.items():
            j = key_to_j.get(k)
            if j is not None and j not in dirty_set:
                out[k] = kept
    stats.recomputed = len(dirty)
    for q, cands, scores in _candidates(index, vecs, dirty, cfg.synonymy_threshold):
        stats.queried += 1
        keep = [(row_keys[c], s) for c, s in zip(cands, scores) if c != q]
        keep.sort(key=lambda t: (-t[1], t[0]))
        if keep:
            out[row_keys[q]] = keep[: cfg.synonymy_max_neighbors]
    return out, stats


def _candidates(index: faiss.Index, vecs: np.ndarray, queries: np.ndarray, threshold: float):
    """Yield (query row, candidate rows, exact scores ≥ threshold) for each query row."""
    for start in range(0, len(queries), _QUERY_BLOCK):
        q = queries[start : start + _QUERY_BLOCK]
        lims, _, labels = index.range_search(vecs[q], threshold - _CANDIDATE_MARGIN)
        for n, qi in enumerate(q):
            cands = labels[lims[n] : lims[n + 1]]
            if len(cands) == 0:
                yield int(qi), [], []
                continue
            exact = vecs[cands].astype(np.float64) @ vecs[qi].astype(np.float64)
            ok = exact >= threshold
            yield int(qi), cands[ok].tolist(), [round(float(s), 6) for s in exact[ok]]


def synonym_edges(selections: Selections) -> dict[tuple[str, str], float]:
    """Undirected synonym edges ``(a, b)`` with ``a < b``, weighted by cosine × the number of ends keeping it
    (HippoRAG 2 adds one parallel edge per end)."""
    edges: dict[tuple[str, str], float] = {}
    for a, kept in selections.items():
        for b, score in kept:
            pair = (a, b) if a < b else (b, a)
            edges[pair] = edges.get(pair, 0.0) + score
    return edges
