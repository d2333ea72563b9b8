"""The graph as a search serves it: CSR arrays and a vertex-name table, memory-mapped from files in the index version.

Why: GraphML read into python-igraph (with its name, kind, weight and kinds attributes) held 7.9 GiB of anonymous
memory at 1M synthetic passages and took 250 s to load (``docs/scaling.md``). These files are written once (by the
build, or converted from an older index's GraphML on first load) and mapped at load, so their pages are the page
cache's, shared by every process serving the index, and loading costs a few header reads.

Files (all ``.npy`` but the name blob):

    graph.indptr.npy          int64 (V+1): row starts of the symmetric adjacency (each undirected edge twice)
    graph.indices.npy         int32 (nnz): neighbours, ascending within each row (canonical CSR)
    graph.weights.npy         float64 (nnz): edge weights (as GraphML stored them)
    graph.kinds.npy           uint8 (nnz): the edge's kinds bitmask (graph_index.graph.FACT | MENTION | …)
    vertex_names.bin          UTF-8 names ("p:<id>", "e:<entity>") back to back, in vertex order
    vertex_names.offsets.npy  int64 (V+1): where each name starts in the blob
    vertex_names.hashes.npy   uint64 (V): FNV-1a 64 of every name, sorted (name → vertex by binary search)
    vertex_names.order.npy    int64 (V): the vertex of each sorted hash
    vertex_passage_counts.npy float64 (V): passages linked to each entity vertex (0 for passages)
    fact_ends.npy             int64 (facts, 2): the vertices of each fact's subject and object (-1: no node)

The adjacency is the one :func:`routerag.retrieval.ppr.undirected_adjacency` builds from the edge list (both
directions, duplicates summed, indices sorted), so PageRank over it is the same computation bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .atomic import atomic_path
from .graph import ENTITY_PREFIX
from .layout import (CSR_FILES, FACT_ENDS, INDICES, INDPTR, KINDS, NAME_HASHES, NAME_OFFSETS, NAME_ORDER, NAMES,
                     PASSAGE_COUNTS, REBUILD_HINT, WEIGHTS, IndexFormatError)
from .openie.base import Triple

_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def name_hashes(blob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """FNV-1a 64 of each name ``blob[offsets[i]:offsets[i+1]]``, vectorised over names: one numpy step per byte
    position, over the names at least that long (longest first), so the work is the blob's length."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")
    starts, neg = offsets[:-1][order], -lengths[order]  # neg ascending
    h = np.full(len(lengths), _FNV_OFFSET, dtype=np.uint64)
    for pos in range(int(-neg[0]) if len(neg) else 0):
        m = int(np.searchsorted(neg, -pos, side="left"))  # names longer than pos
        h[:m] ^= blob[starts[:m] + pos].astype(np.uint64)
        h[:m] *= _FNV_PRIME
    out = np.empty_like(h)
    out[order] = h
    return out


def encode_names(names: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 blob as uint8, int64 offsets) of ``names``."""
    encoded = [n.encode("utf-8") for n in names]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


class NameTable:
    """Vertex names without a Python object per vertex: id → name slices the blob, name → id hashes the name and
    binary-searches the sorted hashes (comparing the bytes of every vertex with that hash)."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray, hashes: np.ndarray, order: np.ndarray) -> None:
        self.blob, self.offsets, self.hashes, self.order = blob, offsets, hashes, order

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def name(self, v: int) -> str:
        return bytes(self.blob[self.offsets[v]:self.offsets[v + 1]]).decode("utf-8")

    def lookup(self, names: Sequence[str]) -> np.ndarray:
        """The vertex of each name, -1 where no vertex has it."""
        out = np.full(len(names), -1, dtype=np.int64)
        if not len(names) or not len(self):
            return out
        blob, offsets = encode_names(names)
        want = name_hashes(blob, offsets)
        lo = np.searchsorted(self.hashes, want, side="left")
        hi = np.searchsorted(self.hashes, want, side="right")
        for i in np.flatnonzero(hi > lo):
            target = bytes(blob[offsets[i]:offsets[i + 1]])
            for v in self.order[lo[i]:hi[i]]:
                if bytes(self.blob[self.offsets[v]:self.offsets[v + 1]]) == target:
                    out[i] = v
                    break
        return out

    def words_per_name(self, start: int, stop: int) -> np.ndarray:
        """Spaces + 1 in the names of vertices ``start`` … ``stop - 1``, read from the blob without decoding."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        spaces = np.concatenate([[0], np.cumsum(self.blob[lo:hi] == 0x20, dtype=np.int64)])
        return np.diff(spaces[np.asarray(self.offsets[start:stop + 1]) - lo]) + 1


class CompactGraph:
    """The mapped graph: adjacency (CSR), edge kinds, vertex names, per-vertex passage counts and fact ends."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.indptr, self.indices = arrays[INDPTR], arrays[INDICES]
        self.weights, self.kinds = arrays[WEIGHTS], arrays[KINDS]
        self.names = NameTable(arrays[NAMES], arrays[NAME_OFFSETS], arrays[NAME_HASHES], arrays[NAME_ORDER])
        self.vertex_passage_counts, self.fact_ends = arrays[PASSAGE_COUNTS], arrays[FACT_ENDS]
        self._ecount: int | None = None

    def vcount(self) -> int:
        return len(self.indptr) - 1

    def ecount(self) -> int:
        """Undirected edges: every stored entry once from each end, a self-loop's once (counted once, then kept)."""
        if self._ecount is not None:
            return self._ecount
        loops = 0
        for lo in range(0, self.vcount(), 1 << 20):  # in chunks: a row index per entry would be a large temporary
            hi = min(lo + (1 << 20), self.vcount())
            rows = np.repeat(np.arange(lo, hi), np.diff(self.indptr[lo:hi + 1]))
            loops += int(np.count_nonzero(self.indices[self.indptr[lo]:self.indptr[hi]] == rows))
        self._ecount = (int(self.indptr[-1]) + loops) // 2
        return self._ecount

    def adjacency(self) -> sp.csr_matrix:
        """The symmetric weighted adjacency over the mapped arrays (no copy)."""
        n = self.vcount()
        a = sp.csr_matrix((self.weights, self.indices, self.indptr), shape=(n, n), copy=False)
        a.has_sorted_indices = True  # written canonical: scipy must not sort the read-only mapping in place
        a.has_canonical_format = True
        return a

    def degree(self) -> np.ndarray:
        """Neighbours per vertex (a self-loop counts once)."""
        return np.diff(self.indptr)

    def neighbours(self, vertices: Iterable[int]) -> set[int]:
        out: set[int] = set()
        for v in vertices:
            out.update(self.indices[self.indptr[v]:self.indptr[v + 1]].tolist())
        return out

    def edges_within(self, vertices: Iterable[int]) -> list[tuple[int, int, float, int]]:
        """Every edge ``(u, v, weight, kinds)`` with ``u <= v`` and both ends in ``vertices`` (ascending)."""
        inside = np.asarray(sorted({int(v) for v in vertices}), dtype=np.int64)
        out = []
        for u in inside.tolist():
            lo, hi = int(self.indptr[u]), int(self.indptr[u + 1])
            nb = np.asarray(self.indices[lo:hi], dtype=np.int64)
            keep = np.flatnonzero((nb >= u) & np.isin(nb, inside))
            out.extend((u, int(nb[j]), float(self.weights[lo + j]), int(self.kinds[lo + j])) for j in keep)
        return out


def symmetric_csr(n: int, sources: np.ndarray, targets: np.ndarray, weights: np.ndarray, kinds: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, indices, weights, kinds) of the undirected edge list, each edge in both directions, rows sorted,
    duplicate pairs merged (weights summed, kinds or-ed): the matrix scipy makes of the same list."""
    src = np.concatenate([sources, targets]).astype(np.int64)
    dst = np.concatenate([targets, sources]).astype(np.int64)
    order = np.argsort(src * max(n, 1) + dst, kind="stable")
    src, dst = src[order], dst[order]
    w = np.concatenate([weights, weights]).astype(np.float64)[order]
    k = np.concatenate([kinds, kinds]).astype(np.uint8)[order]
    del order
    first = np.ones(len(src), dtype=bool)
    first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    if not first.all():
        starts = np.flatnonzero(first)
        w, k = np.add.reduceat(w, starts), np.bitwise_or.reduceat(k, starts)
        src, dst = src[starts], dst[starts]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst.astype(np.int32), w, k


def compact_arrays(*, n: int, sources: np.ndarray, targets: np.ndarray, weights: np.ndarray, kinds: np.ndarray,
                   names: Sequence[str], vertex_passage_counts: np.ndarray, facts: Sequence[Triple] = (),
                   fact_ends: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The arrays of :data:`CSR_FILES` for a graph of ``n`` vertices given by its undirected edge list. The fact
    ends are ``fact_ends`` when the caller knows them, else looked up by name (``facts``' subjects and objects)."""
    if len(names) != n or len(vertex_passage_counts) != n:
        raise ValueError(f"{len(names)} names and {len(vertex_passage_counts)} counts for {n} vertices")
    indptr, indices, w, k = symmetric_csr(n, sources, targets, weights, kinds)
    blob, offsets = encode_names(names)
    hashes = name_hashes(blob, offsets)
    order = np.argsort(hashes, kind="stable")
    arrays = {INDICES: indices, WEIGHTS: w, KINDS: k, NAMES: blob, NAME_OFFSETS: offsets,
              NAME_HASHES: hashes[order], NAME_ORDER: order.astype(np.int64),
              PASSAGE_COUNTS: np.asarray(vertex_passage_counts, dtype=np.float64), INDPTR: indptr}
    if fact_ends is None:
        fact_ends = fact_end_vertices(NameTable(blob, offsets, arrays[NAME_HASHES], arrays[NAME_ORDER]), facts)
    arrays[FACT_ENDS] = np.asarray(fact_ends, dtype=np.int64).reshape(-1, 2)
    return arrays


def fact_end_vertices(names: NameTable, facts: Sequence[Triple], chunk: int = 1 << 20) -> np.ndarray:
    """``(facts, 2)``: the entity vertex of each fact's subject and object (-1 where an end is no node)."""
    ends = np.full((len(facts), 2), -1, dtype=np.int64)
    for lo in range(0, len(facts), chunk):
        part = facts[lo:lo + chunk]
        ends[lo:lo + len(part), 0] = names.lookup([ENTITY_PREFIX + s for s, _, _ in part])
        ends[lo:lo + len(part), 1] = names.lookup([ENTITY_PREFIX + o for _, _, o in part])
    return ends


def write_compact_graph(d: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write :func:`compact_arrays`' arrays into ``d``, each file atomically, ``graph.indptr.npy`` last."""
    for name in CSR_FILES:
        with atomic_path(d / name) as tmp, open(tmp, "wb") as f:
            if name == NAMES:
                f.write(arrays[name].tobytes())
            else:
                np.save(f, arrays[name])
            f.flush()
            os.fsync(f.fileno())


def present(d: Path) -> bool:
    return all((d / name).is_file() for name in CSR_FILES)


def load_compact_graph(d: Path, *, nodes: int, facts: int) -> CompactGraph:
    """Map the files, checking every array's dtype and length against the graph's ``nodes`` and ``facts`` (and the
    edge arrays against ``indptr``); an :class:`IndexFormatError` names the file at fault."""
    arrays: dict[str, np.ndarray] = {}
    for name in CSR_FILES:
        path = d / name
        try:
            if name == NAMES:
                arrays[name] = (np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size
                                else np.zeros(0, dtype=np.uint8))
            else:
                arrays[name] = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{path}: unreadable ({exc}); {REBUILD_HINT}", path) from None
    indptr = arrays[INDPTR]
    nnz = int(indptr[-1]) if len(indptr) else -1
    want = {INDPTR: ((nodes + 1,), np.int64), INDICES: ((nnz,), np.int32), WEIGHTS: ((nnz,), np.float64),
            KINDS: ((nnz,), np.uint8), NAME_OFFSETS: ((nodes + 1,), np.int64), NAME_HASHES: ((nodes,), np.uint64),
            NAME_ORDER: ((nodes,), np.int64), PASSAGE_COUNTS: ((nodes,), np.float64),
            FACT_ENDS: ((facts, 2), np.int64)}
    for name, (shape, dtype) in want.items():
        a = arrays[name]
        if a.shape != shape or a.dtype != dtype:
            raise IndexFormatError(f"{d / name}: array of shape {a.shape} {a.dtype}, expected {shape} "
                                   f"{np.dtype(dtype)}; {REBUILD_HINT}", d / name)
    if len(arrays[NAMES]) != int(arrays[NAME_OFFSETS][-1]):
        raise IndexFormatError(f"{d / NAMES}: {len(arrays[NAMES]):,} bytes, the offsets say "
                               f"{int(arrays[NAME_OFFSETS][-1]):,}; {REBUILD_HINT}", d / NAMES)
    return CompactGraph(arrays)


def arrays_from_igraph(graph, entity_passage_counts: Sequence[int], facts: Sequence[Triple]  # noqa: ANN001
                       ) -> dict[str, np.ndarray]:
    """:func:`compact_arrays` of a graph as :func:`graph_index.graph.build_graph` makes it (and GraphML keeps it):
    vertices named, passages first, then one vertex per entity in ``entity_passage_counts``' order; edges with
    ``weight`` and ``kinds``."""
    n = graph.vcount()
    edges = np.asarray(graph.get_edgelist(), dtype=np.int64).reshape(-1, 2)
    weights = np.asarray(graph.es["weight"] if graph.ecount() else [], dtype=np.float64)
    kinds = np.asarray(graph.es["kinds"] if graph.ecount() else [], dtype=np.int64)
    counts = np.zeros(n, dtype=np.float64)
    counts[n - len(entity_passage_counts):] = entity_passage_counts
    names = graph.vs["name"] if n else []
    return compact_arrays(n=n, sources=edges[:, 0], targets=edges[:, 1], weights=weights, kinds=kinds, names=names,
                          vertex_passage_counts=counts, facts=facts)
