"""The names of an index directory's files and the errors about them (shared by the store, its versions and its
integrity checks, so none of them imports another just for a constant)."""

from __future__ import annotations

from pathlib import Path

FORMAT = "routerag-index"
FORMAT_VERSION = 1

MANIFEST = "manifest.json"
PASSAGES = "passages.jsonl"
OPENIE = "openie.jsonl"
ENTITIES = "entities.jsonl"
FACTS = "facts.jsonl"
SYNONYMS = "synonyms.jsonl"
PASSAGE_EMB = "passage_embeddings.npy"
ENTITY_EMB = "entity_embeddings.npy"
FACT_EMB = "fact_embeddings.npy"
DENSE = "passages.faiss"
GRAPH = "graph.graphml"
FACT_EMB_F16 = "fact_embeddings.f16.npy"
"""The float16 copy of the fact rows that exact fact matching screens with (derived from FACT_EMB): written by the
build so that a loaded index maps it instead of converting 2 bytes per value into anonymous memory. Optional: an
index written before it existed gets it on first load (:meth:`graph_index.store.IndexData.fact_emb_f16`)."""
INDPTR, INDICES, WEIGHTS, KINDS = "graph.indptr.npy", "graph.indices.npy", "graph.weights.npy", "graph.kinds.npy"
NAMES, NAME_OFFSETS = "vertex_names.bin", "vertex_names.offsets.npy"
NAME_HASHES, NAME_ORDER = "vertex_names.hashes.npy", "vertex_names.order.npy"
PASSAGE_COUNTS, FACT_ENDS = "vertex_passage_counts.npy", "fact_ends.npy"
CSR_FILES = (INDICES, WEIGHTS, KINDS, NAMES, NAME_OFFSETS, NAME_HASHES, NAME_ORDER, PASSAGE_COUNTS, FACT_ENDS, INDPTR)
"""The compact serving graph (:mod:`graph_index.csr`), derived from GRAPH, ENTITIES and FACTS: written by the build,
or on an older index's first load. In this order, ``graph.indptr.npy`` last, so that its presence (with the others')
marks a complete set."""
PASSAGE_ANN = "passages.ann.faiss"
FACT_ANN = "facts.ann.faiss"
"""The scale profile's approximate indexes of the passage and fact rows (``graph_index/ann.py``; derived from
PASSAGE_EMB and FACT_EMB): written by the build from ``ann.from_passages`` passages, else on first use."""
ANN_FILES = {"passages": PASSAGE_ANN, "facts": FACT_ANN}
DATA_FILES = (PASSAGES, OPENIE, ENTITIES, FACTS, SYNONYMS, PASSAGE_EMB, ENTITY_EMB, FACT_EMB, DENSE, GRAPH)
ALL_FILES = (MANIFEST, *DATA_FILES)
DERIVED_FILES = (FACT_EMB_F16, *CSR_FILES, PASSAGE_ANN, FACT_ANN)
"""Files computed from a data file: checked like one when the manifest records them, never required."""

#: Which manifest count gives the number of rows of a file (synonyms.jsonl has no count of its own).
ROWS_FROM_COUNT = {PASSAGES: "passages", OPENIE: "passages", ENTITIES: "entities", FACTS: "facts",
                   PASSAGE_EMB: "passages", ENTITY_EMB: "entities", FACT_EMB: "facts", FACT_EMB_F16: "facts"}

REBUILD_HINT = "restore the index or rebuild it with `routerag build-graph --force`"


class IndexFormatError(RuntimeError):
    """The directory is not a (complete, compatible, intact) RouteRAG index. The message starts with the path of
    the file (or directory) at fault, so a user knows what to restore."""

    def __init__(self, message: str, path: Path | str | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class IndexNotFoundError(IndexFormatError):
    """The path names no index at all (no such directory, or one without a manifest): the caller pointed at the wrong
    place, nothing on disk is damaged."""
