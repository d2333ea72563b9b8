"""The synthetic graph alone: the edges of an index with a real index's shape, numpy only.

Split out of :mod:`growth_synth` so that a machine without the index's stack (FAISS, igraph, the index writer), such as
a lent GPU machine, can build the very graph that ``growth.py build`` writes (same seed, same draws) and run the
PageRank on it (``benchmarks/ppr_devices.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class SyntheticGraph:
    """Vertices are passages ``[0, n)`` then entities ``[n, n + n_ent)``; edges are undirected, each once."""

    n: int
    n_ent: int
    src: np.ndarray
    dst: np.ndarray
    weights: np.ndarray
    pe_p: np.ndarray
    """Passage of each passage-entity (mention) edge; the mention edges are the first ``len(pe_p)`` edges."""
    pe_e: np.ndarray
    offsets: np.ndarray
    """The mention edges of passage i are ``offsets[i]:offsets[i+1]``."""
    entity_passages: np.ndarray
    fact_p: np.ndarray
    fs: np.ndarray
    fo: np.ndarray
    ee_fact: np.ndarray
    ee_syn: np.ndarray
    """Per entity-entity edge (in ``uk`` order): carries a fact, carries a synonym."""
    syn: tuple[np.ndarray, np.ndarray, np.ndarray]
    """Synonym edges: (entity a, entity b, weight)."""
    titled: np.ndarray
    n_synonym_pairs: int

    @property
    def vertices(self) -> int:
        return self.n + self.n_ent


def _deal(slots: np.ndarray, want: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``want`` slot owners: a random subset of ``slots``, or all of them plus random owners in ``[0, n)``."""
    if len(slots) >= want:
        return np.sort(slots[rng.choice(len(slots), want, replace=False)])
    return np.concatenate([slots, rng.integers(0, n, want - len(slots))])


def _mentions(n: int, n_ent: int, prof: dict[str, Any], rng: np.random.Generator):
    """Passage-entity pairs by a configuration model: the entities' stubs dealt to the passages' link slots."""
    entity_passages = rng.choice(np.asarray(prof["passages_per_entity"]), n_ent)
    stubs = np.repeat(np.arange(n_ent, dtype=np.int64), entity_passages)
    rng.shuffle(stubs)
    slots = np.repeat(np.arange(n, dtype=np.int64), rng.choice(np.asarray(prof["links_per_passage"]), n))
    if len(stubs) < len(slots):
        stubs = np.concatenate([stubs, rng.integers(0, n_ent, len(slots) - len(stubs))])
    key = np.unique(slots * n_ent + stubs[: len(slots)])
    del slots, stubs
    return entity_passages, key // n_ent, key % n_ent


def _facts(n: int, prof: dict[str, Any], scale: float, per_passage: np.ndarray, offsets: np.ndarray,
           pe_e: np.ndarray, rng: np.random.Generator):
    """Facts: each joins two different entities of its passage (where it has two)."""
    n_fact = round(prof["facts"] * scale)
    fslots = np.repeat(np.arange(n, dtype=np.int64), rng.choice(np.asarray(prof["facts_per_passage"]), n))
    fslots = fslots[per_passage[fslots] > 0]
    fact_p = _deal(fslots, n_fact, n, rng)
    del fslots
    fact_p = np.sort(fact_p[per_passage[fact_p] > 0])
    n_fact = len(fact_p)
    cnt = per_passage[fact_p]
    i_s = (rng.random(n_fact) * cnt).astype(np.int64)
    i_o = np.where(cnt > 1, (i_s + 1 + (rng.random(n_fact) * (cnt - 1)).astype(np.int64)) % cnt, i_s)
    return fact_p, pe_e[offsets[fact_p] + i_s], pe_e[offsets[fact_p] + i_o]


def synthetic_graph(n: int, prof: dict[str, Any], *, seed: int = 0,
                    rng: np.random.Generator | None = None) -> SyntheticGraph:
    """The graph of an ``n``-passage index shaped like ``prof`` (see ``growth_synth.measure_profile``), drawn from
    ``rng`` (default: a generator seeded with ``seed``, as ``growth.py build`` seeds each size with ``n``)."""
    rng = rng if rng is not None else np.random.default_rng(seed)
    scale = n / prof["passages"]
    n_ent = max(2, round(prof["entities"] * scale))
    entity_passages, pe_p, pe_e = _mentions(n, n_ent, prof, rng)
    per_passage = np.bincount(pe_p, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(per_passage)])
    fact_p, fs, fo = _facts(n, prof, scale, per_passage, offsets, pe_e, rng)
    n_syn = round(prof["synonym_edges"] * scale)
    sa, sb = rng.integers(0, n_ent, n_syn), rng.integers(0, n_ent, n_syn)
    # entity-entity edges: facts and synonyms merged per pair
    lo, hi = np.minimum(fs, fo), np.maximum(fs, fo)
    fkey = (lo * n_ent + hi)[lo != hi]
    slo, shi = np.minimum(sa, sb), np.maximum(sa, sb)
    skey = np.unique((slo * n_ent + shi)[slo != shi])
    del lo, hi, slo, shi, sa, sb
    is_fact = np.concatenate([np.ones(len(fkey), bool), np.zeros(len(skey), bool)])
    syn_w = rng.choice(np.asarray(prof["synonym_edge_weights"]), len(skey))
    w_in = np.concatenate([np.full(len(fkey), 2.0), syn_w])
    uk, inv = np.unique(np.concatenate([fkey, skey]), return_inverse=True)
    ee_w = np.bincount(inv, weights=w_in, minlength=len(uk))
    ee_fact = np.bincount(inv, weights=is_fact, minlength=len(uk)) > 0
    ee_syn = np.bincount(inv, weights=~is_fact, minlength=len(uk)) > 0
    del inv, w_in, is_fact
    pe_w = rng.choice(np.asarray(prof["passage_edge_weights"]), len(pe_p))
    titled = (per_passage > 0) & (rng.random(n) < prof["title_share"])
    return SyntheticGraph(
        n=n, n_ent=n_ent, src=np.concatenate([pe_p, n + uk // n_ent]), dst=np.concatenate([n + pe_e, n + uk % n_ent]),
        weights=np.concatenate([pe_w, ee_w]), pe_p=pe_p, pe_e=pe_e, offsets=offsets, entity_passages=entity_passages,
        fact_p=fact_p, fs=fs, fo=fo, ee_fact=ee_fact, ee_syn=ee_syn,
        syn=(uk[ee_syn] // n_ent, uk[ee_syn] % n_ent, ee_w[ee_syn]), titled=titled, n_synonym_pairs=len(skey))
