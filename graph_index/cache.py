"""A small persistent key-value cache (SQLite) for results that are expensive to recompute.

OpenIE output and embeddings are stored per content hash as soon as each batch finishes, so a killed build
resumes where it stopped and a re-run over the same corpus recomputes nothing. SQLite gives atomic commits and
safe concurrent readers without a server; each namespace (``openie:<extractor>``, ``emb:<model>``) keeps results
of different models apart.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

_SCHEMA = "CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ns, key))"
_CHUNK = 500  # SQLite's default limit on bound parameters is 999 in old builds


class DiskCache:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as conn:
            conn.execute(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def get_many(self, ns: str, keys: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        conn = self._conn()
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _CHUNK):
            part = unique[start : start + _CHUNK]
            marks = ",".join("?" * len(part))
            rows = conn.execute(f"SELECT key, value FROM kv WHERE ns = ? AND key IN ({marks})", (ns, *part))
            out.update(rows)
        return out

    def put_many(self, ns: str, items: Iterable[tuple[str, bytes]]) -> None:
        conn = self._conn()
        with conn:
            conn.executemany("INSERT OR REPLACE INTO kv (ns, key, value) VALUES (?, ?, ?)",
                             ((ns, k, v) for k, v in items))

    def count(self, ns: str) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM kv WHERE ns = ?", (ns,)).fetchone()[0])

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
