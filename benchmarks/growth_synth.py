"""Synthetic RouteRAG indexes with a real index's shape, for benchmarks/growth.py.

The real index gives the distributions (sampled with replacement, so a 1M index has the 7.6k index's shape at every
passage, not a larger corpus's heavier tails): links per passage (mentions and title), passages per entity, facts
per passage, synonym edges per entity, edge weights, passage text lengths. Entities are attached to passages by a
configuration model (each entity's stubs dealt to the passages' link slots), a fact joins two entities of its passage,
synonym pairs are random. Vectors are random unit rows. Everything is generated vectorised and the matrices are
written in chunks straight into their ``.npy`` files, so the generator's memory stays well below their size.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import faiss
import igraph as ig
import numpy as np

from graph_index import csr, integrity, store, versions
from graph_index.config import IndexConfig
from graph_index.corpus import write_jsonl
from graph_index.embedders.base import Embedder
from graph_index.graph import FACT, MENTION, SYNONYM, TITLE
from graph_index.layout import (ALL_FILES, CSR_FILES, DENSE, ENTITIES, ENTITY_EMB, FACT_EMB, FACT_EMB_F16, FACTS, GRAPH, OPENIE,
                                PASSAGE_EMB, PASSAGES, SYNONYMS)
from synth_graph import synthetic_graph

DIM = 384
IDENTITY = "synthetic:random-unit-384"
CHUNK = 131_072
_FILLER = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore " * 200)


class StubEmbedder(Embedder):
    """The synthetic index's "embedder": random unit vectors (the benchmark passes query vectors itself)."""

    identity = IDENTITY

    @property
    def dim(self) -> int:
        return DIM

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        return np.random.default_rng(len(texts)).standard_normal((len(texts), DIM), dtype=np.float32)


def measure_profile(index: Path) -> dict[str, Any]:
    """The distributions of a real index (lists of per-item values, sampled from later)."""
    data = store.IndexData(index)
    g = data.graph
    p0 = int(data.manifest["counts"]["passages"])
    edges = np.asarray(g.get_edgelist(), dtype=np.int64)
    kinds = np.asarray(g.es["kinds"], dtype=np.int64)
    weights = np.asarray(g.es["weight"], dtype=np.float64)
    passage_edge = edges[:, 0] < p0  # passages are the first vertices, so the smaller end tells
    links = np.bincount(edges[passage_edge, 0], minlength=p0)
    ee = ~passage_edge
    rng = np.random.default_rng(0)

    def sample(x: np.ndarray, k: int = 20_000) -> list[float]:
        return [round(float(v), 6) for v in (rng.choice(x, k) if len(x) > k else x)]

    return {
        "index": str(index), "passages": p0, "entities": len(data.entities), "facts": len(data.facts),
        "fact_edges": int(((kinds & FACT) > 0).sum()), "synonym_edges": int(((kinds & SYNONYM) > 0).sum()),
        "title_share": float(((kinds[passage_edge] & TITLE) > 0).sum() / p0),
        "links_per_passage": links.tolist(),
        "passages_per_entity": data.entity_passage_counts.tolist(),
        "facts_per_passage": [len(r.triples) for r in data.openie],
        "text_len": [len(p.text) for p in data.passages],
        "passage_edge_weights": sample(weights[passage_edge]),
        "synonym_edge_weights": sample(weights[ee & ((kinds & SYNONYM) > 0) & ((kinds & FACT) == 0)]),
    }


def _write_unit_rows(path: Path, rows: int, rng: np.random.Generator, f16: Path | None = None,
                     dense: faiss.Index | None = None) -> None:
    """Random unit float32 rows written chunk by chunk with plain writes, not through a mapping (whose dirty pages
    would count in this process's RSS), and their float16 copy, and into a FAISS index."""
    files = [(path, np.float32)] + ([(f16, np.float16)] if f16 else [])
    handles = []
    for p, dtype in files:
        f = open(p, "wb")
        store.write_npy_header(f, dtype, (rows, DIM))
        handles.append((f, dtype))
    for lo in range(0, rows, CHUNK):
        x = rng.standard_normal((min(CHUNK, rows - lo), DIM), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        for f, dtype in handles:
            f.write(x.astype(dtype, copy=False).tobytes())
        if dense is not None:
            dense.add(x)
    for f, _ in handles:
        f.close()


def _edge_kinds(sg: Any) -> np.ndarray:
    """Each edge's kinds bitmask: passage–entity edges first (mentions, the title's), then entity–entity."""
    pe_kinds = np.full(len(sg.pe_p), MENTION, dtype=np.int64)
    pe_kinds[sg.offsets[:-1][sg.titled]] |= TITLE
    return np.concatenate([pe_kinds, np.where(sg.ee_fact, FACT, 0) | np.where(sg.ee_syn, SYNONYM, 0)])


def _vertex_names(n: int, ent_names: list[str]) -> list[str]:
    return [f"p:{i:016x}" for i in range(n)] + ["e:" + e for e in ent_names]


def _compact(n: int, sg: Any, kinds: np.ndarray, vertex_names: list[str]) -> dict[str, np.ndarray]:
    """The compact graph's arrays (graph_index.csr) of the synthetic graph; fact ends are known, not looked up."""
    return csr.compact_arrays(n=n + sg.n_ent, sources=sg.src, targets=sg.dst, weights=sg.weights, kinds=kinds,
                              names=vertex_names,
                              vertex_passage_counts=np.concatenate([np.zeros(n), sg.entity_passages]),
                              fact_ends=np.column_stack([sg.fs, sg.fo]) + n)


def add_compact(out: Path, n: int, prof: dict[str, Any], *, seed: int) -> None:
    """Write the compact graph files into an index :func:`write_synthetic` wrote before they existed, from the same
    seed's graph (the generator is deterministic), instead of converting its GraphML (which takes as long as the
    load it replaces); unrecorded, as a conversion on load leaves them."""
    sg = synthetic_graph(n, prof, rng=np.random.default_rng(seed))
    names = _vertex_names(n, [f"ent{j:09d}" for j in range(sg.n_ent)])
    csr.write_compact_graph(versions.resolve(Path(out)), _compact(n, sg, _edge_kinds(sg), names))


def write_synthetic(out: Path, n: int, prof: dict[str, Any], *, seed: int = 0, f16: bool = True,
                    ann_write: str = "never", ivf_from_rows: int | None = None) -> dict[str, Any]:
    """Write an index of ``n`` synthetic passages at ``out`` (published atomically); returns counts and timings.

    ``f16=False`` leaves out the float16 fact copy (derived, optional: the exact profile makes it on first load; at
    1M passages it is 6.8 GB the scale profile never reads). ``ann_write`` is ``ann.write`` for this index
    (``auto``: from ``ann.from_passages``): the scale profile's approximate indexes, written as the build writes
    them; ``ivf_from_rows`` their ``ann.ivf_from_rows`` (None: the default)."""
    rng = np.random.default_rng(seed)
    ann = {"write": ann_write} | ({} if ivf_from_rows is None else {"ivf_from_rows": ivf_from_rows})
    cfg = IndexConfig(ann=ann)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.perf_counter() - t0 - sum(timings.values()), 1)
        print(f"  [{n}] {name} {timings[name]} s", flush=True)

    sg = synthetic_graph(n, prof, rng=rng)  # the same generator draws the text lengths and vectors next
    n_ent, pe_p, pe_e, offsets = sg.n_ent, sg.pe_p, sg.pe_e, sg.offsets
    entity_passages, fact_p, fs, fo, titled = sg.entity_passages, sg.fact_p, sg.fs, sg.fo, sg.titled
    n_fact = len(fact_p)
    syn_a, syn_b, syn_w = sg.syn
    lap("sample")
    src, dst, weights, kinds = sg.src, sg.dst, sg.weights, _edge_kinds(sg)
    counts = {"passages": n, "entities": n_ent, "facts": n_fact, "synonymy_edges": sg.n_synonym_pairs,
              "nodes": n + n_ent, "edges": int(len(src)), "fact_edges": int(sg.ee_fact.sum()),
              "mention_edges": int(len(pe_p)), "title_edges": int(titled.sum()), "synonym_edges": int(sg.ee_syn.sum())}
    lap("edges")

    ent_names = [f"ent{j:09d}" for j in range(n_ent)]
    vertex_names = _vertex_names(n, ent_names)
    compact = _compact(n, sg, kinds, vertex_names)
    del sg
    g = ig.Graph(n=n + n_ent)
    g.add_edges(np.column_stack([src, dst]))
    del src, dst
    g.vs["name"] = vertex_names
    g.vs["kind"] = ["passage"] * n + ["entity"] * n_ent
    g.es["weight"] = weights.tolist()
    g.es["kinds"] = kinds.tolist()
    del weights, kinds, vertex_names
    lap("graph")

    out = Path(out)
    with store.write_lock(out, create=True), store.atomic_directory(out, force=True) as d:
        text_len = rng.choice(np.asarray(prof["text_len"]), n)
        write_jsonl(d / PASSAGES, ({"id": f"{i:016x}", "title": f"Synthetic passage {i}",
                                    "text": _FILLER[: int(text_len[i])]} for i in range(n)))
        fstart = np.searchsorted(fact_p, np.arange(n + 1))

        def openie_rows():
            for i in range(n):
                ents = pe_e[offsets[i]:offsets[i + 1]]
                triples = [[ent_names[fs[j]], f"r{j}", ent_names[fo[j]]] for j in range(fstart[i], fstart[i + 1])]
                yield {"id": f"{i:016x}", "entities": [ent_names[e] for e in ents], "triples": triples,
                       "source": "synthetic"}

        write_jsonl(d / OPENIE, openie_rows())
        write_jsonl(d / ENTITIES, ({"name": ent_names[j], "passages": int(entity_passages[j])} for j in range(n_ent)))
        write_jsonl(d / FACTS, ([ent_names[fs[j]], f"r{j}", ent_names[fo[j]]] for j in range(n_fact)))
        # each end of a synonym pair keeps the other
        sa2, sb2, sw = np.concatenate([syn_a, syn_b]), np.concatenate([syn_b, syn_a]), np.concatenate([syn_w, syn_w])
        order = np.argsort(sa2, kind="stable")
        sa2, sb2, sw = sa2[order], sb2[order], sw[order]
        bounds = np.flatnonzero(np.diff(sa2)) + 1
        starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [len(sa2)]])
        write_jsonl(d / SYNONYMS, ({"entity": ent_names[sa2[a]],
                                    "keeps": [[ent_names[sb2[k]], round(float(sw[k]), 6)] for k in range(a, b)]}
                                   for a, b in zip(starts, ends)))
        n_syn_rows = len(starts)
        lap("jsonl")
        g.write_graphml(str(d / GRAPH))
        del g
        csr.write_compact_graph(d, compact)
        del compact
        lap("graphml")
        dense = faiss.IndexFlatIP(DIM)
        _write_unit_rows(d / PASSAGE_EMB, n, rng, dense=dense)
        faiss.write_index(dense, str(d / DENSE))
        del dense
        _write_unit_rows(d / ENTITY_EMB, n_ent, rng)
        _write_unit_rows(d / FACT_EMB, n_fact, rng, f16=d / FACT_EMB_F16 if f16 else None)
        lap("matrices")
        rows = {PASSAGES: n, OPENIE: n, ENTITIES: n_ent, FACTS: n_fact, SYNONYMS: n_syn_rows}
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        manifest: dict[str, Any] = {
            "format": store.FORMAT, "format_version": store.FORMAT_VERSION, "created": now, "updated": now,
            "embedder": {"identity": IDENTITY, "dim": DIM}, "extractor": {"identity": "synthetic"},
            "dense_index": "IndexFlatIP", "config": cfg.recorded(), "counts": counts,
            "synthetic": {"profile": prof["index"], "seed": seed},
            "files": {name: integrity.file_record(d / name, rows.get(name))
                      for name in (*ALL_FILES[1:], *([FACT_EMB_F16] if f16 else []), *CSR_FILES)},
        }
        lap("checksums")
        store.write_ann_files(d, manifest, cfg.ann)
        if cfg.ann.wanted(n):
            lap("ann")
        store.write_manifest(d, manifest)
    disk = sum(f.stat().st_size for f in versions.resolve(out).iterdir())
    return {"passages": n, "counts": counts, "timings_s": timings, "disk_mb": round(disk / 2**20, 1)}

