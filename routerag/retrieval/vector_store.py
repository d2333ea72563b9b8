"""Passage and fact vectors in Milvus instead of FAISS (``retrieval.vector_store = "milvus"``), for users whose
vectors live in an engine they already run.

``retrieval.milvus_uri`` names the engine: a local file (``/data/routerag.db``) starts Milvus Lite locally, and
``http://host:19530`` reaches a Milvus server or cluster through the same ``pymilvus`` client (with
``retrieval.milvus_token`` where it needs one). The index stays the source of truth: when a retriever opens an
index it makes sure two collections hold its passage and fact vectors, named by a hash of the index's checksummed
files, so the same content reuses its collections (a replica, a restart) and a new version gets its own; a
collection whose row count is short (an upload cut off) is dropped and uploaded again.

Both collections use an exact (``FLAT``) inner-product index: the same scores as the flat FAISS index and the exact
fact scan, so recall is unchanged and the engine's own ANN indexes stay a deployment choice. HippoRAG 2 min-max
normalises a query's fact scores over all facts; as with the FAISS fact indexes (:class:`~.facts.FaissFactScorer`),
the maximum is the best hit and the minimum the best hit of the negated query (min q·f = −max (−q)·f), and the
facts found are rescored from the index's float32 rows, so every score used is a true score.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np

from .facts import FactMatches

log = logging.getLogger(__name__)

UPLOAD_ROWS = 2048
"""Rows per insert call (Milvus caps one request's size)."""


def missing_client_error() -> ImportError:
    return ImportError("retrieval.vector_store = 'milvus' needs pymilvus (and milvus-lite for a local file URI): "
                       "pip install 'routerag[milvus]'")


class MilvusCollection:
    """One collection of unit vectors (``id`` = row in the index, ``vector``), searched by inner product."""

    def __init__(self, client: Any, name: str, vectors: np.ndarray) -> None:
        self.client = client
        self.name = name
        self.n, self.dim = vectors.shape
        self._ensure(vectors)

    def _ensure(self, vectors: np.ndarray) -> None:
        """Reuse the collection when it holds every row; otherwise (absent, or cut short) upload it again."""
        if self.client.has_collection(self.name):
            self.client.load_collection(self.name)
            rows = int(self.client.get_collection_stats(self.name).get("row_count", -1))
            if rows == self.n:
                return
            log.warning("milvus collection %s holds %d rows, not %d: uploading it again", self.name, rows, self.n)
            self.client.drop_collection(self.name)
        from pymilvus import DataType

        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dim)
        params = self.client.prepare_index_params()
        params.add_index(field_name="vector", index_type="FLAT", metric_type="IP")
        self.client.create_collection(self.name, schema=schema, index_params=params)
        for start in range(0, self.n, UPLOAD_ROWS):
            block = np.asarray(vectors[start:start + UPLOAD_ROWS], dtype=np.float32)
            self.client.insert(self.name, [{"id": start + i, "vector": row.tolist()} for i, row in enumerate(block)])
        self.client.flush(self.name)
        self.client.load_collection(self.name)

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), each b × k best first; ids −1 and scores −inf past the collection's size."""
        k = min(k, self.n)
        b = q.shape[0]
        scores = np.full((b, k), -np.inf, dtype=np.float32)
        ids = np.full((b, k), -1, dtype=np.int64)
        if k == 0 or b == 0:
            return scores, ids
        hits = self.client.search(self.name, data=np.asarray(q, dtype=np.float32).tolist(), limit=k,
                                  search_params={"metric_type": "IP"}, output_fields=["id"])
        for r, row in enumerate(hits):
            for j, hit in enumerate(row[:k]):
                ids[r, j] = int(hit["id"])
                scores[r, j] = float(hit["distance"])
        return scores, ids


class MilvusVectors:
    """The Milvus side of one index: its passage and fact collections, opened (and uploaded when needed) once."""

    def __init__(self, uri: str, token: str | None, content_key: str) -> None:
        try:
            from pymilvus import MilvusClient
        except ImportError as exc:
            raise missing_client_error() from exc
        self.client = MilvusClient(uri, token=token or "")
        self.prefix = f"routerag_{content_key}"

    def collection(self, kind: str, vectors: np.ndarray) -> MilvusCollection:
        return MilvusCollection(self.client, f"{self.prefix}_{kind}", vectors)

    def dense(self, passage_emb: np.ndarray) -> MilvusDense:
        return MilvusDense(self, passage_emb)

    def facts(self, fact_emb: np.ndarray) -> MilvusFactScorer:
        return MilvusFactScorer(self, fact_emb)

    def close(self) -> None:
        self.client.close()


def content_key(manifest: dict[str, Any]) -> str:
    """A name for an index's content: a hash of its files' checksums (equal content, equal collections)."""
    files = manifest.get("files") or {k: manifest.get(k) for k in ("created", "updated", "counts")}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:20]


class MilvusDense:
    """The passage search of a retriever whose vectors are in Milvus: :meth:`search` as the FAISS path gives it."""

    def __init__(self, store: MilvusVectors, passage_emb: np.ndarray) -> None:
        self.collection = store.collection("passages", passage_emb)
        self.ntotal, self.d = passage_emb.shape

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.collection.search(q, k)


class MilvusFactScorer:
    """Fact matching through a Milvus collection (top facts, and HippoRAG 2's min and max over all facts)."""

    def __init__(self, store: MilvusVectors, fact_emb: np.ndarray) -> None:
        self.emb = fact_emb
        self.n, self.dim = fact_emb.shape
        self.collection = store.collection("facts", fact_emb)

    def match(self, q: np.ndarray, k: int) -> FactMatches:
        k = min(k, self.n)
        q = np.ascontiguousarray(q, dtype=np.float32)
        _, top = self.collection.search(q, k)
        _, lowest = self.collection.search(-q, 1)
        tops, scores, lo, hi = [], [], [], []
        for r in range(q.shape[0]):
            cand = top[r][top[r] >= 0]
            exact = self.emb[cand] @ q[r]  # the index's own float32 rows: true scores
            order = np.lexsort((cand, -exact))
            tops.append(cand[order])
            scores.append(exact[order])
            hi.append(float(exact.max()))
            lo.append(float(self.emb[lowest[r][0]] @ q[r]) if lowest[r][0] >= 0 else float(exact.min()))
        return FactMatches(np.stack(tops), np.stack(scores), np.asarray(lo), np.asarray(hi))
