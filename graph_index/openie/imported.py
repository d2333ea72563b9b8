"""Import OpenIE that was already paid for: HippoRAG's results files.

Accepted layouts: ``{"docs": [...]}`` or a bare list, each doc with ``extracted_entities`` and
``extracted_triples`` (JSON lists, or Python-literal strings as HippoRAG v1 wrote them) and either ``title`` +
``text`` or a ``passage`` string (HippoRAG 2, "title\\ntext"). Docs are matched to corpus passages by content.
"""

from __future__ import annotations

import ast
import json
import logging
import threading
from pathlib import Path

from ..corpus import content_hash

from .base import OpenIEResult, clean_entities, clean_triples

log = logging.getLogger(__name__)
_LITERAL_EVAL_LOCK = threading.Lock()
"""CPython 3.11's AST conversion keeps its recursion depth in interpreter-wide state: two threads in
``ast.literal_eval`` at once raise ``SystemError: AST constructor recursion depth mismatch`` (seen when two
writers add to one index with HippoRAG v1 results at the same time, tests/test_index_writes.py)."""


class OpenIEImportError(ValueError):
    pass


def load_openie_results(path: Path) -> dict[str, OpenIEResult]:
    """Map passage content hash → imported result. Malformed docs are skipped with a warning."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise OpenIEImportError(f"{path}: cannot read OpenIE results ({exc})") from exc
    docs = data.get("docs") if isinstance(data, dict) else data
    if not isinstance(docs, list):
        raise OpenIEImportError(f"{path}: expected a list of docs or an object with 'docs'")
    source = f"imported:{path.name}"
    out: dict[str, OpenIEResult] = {}
    bad = 0
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            bad += 1
            continue
        try:
            entities = clean_entities(_as_list(doc.get("extracted_entities", [])))
            triples = clean_triples(_as_list(doc.get("extracted_triples", [])))
        except (ValueError, SyntaxError) as exc:
            log.warning("%s: doc %d: unreadable extraction (%s); skipped", path, i, exc)
            bad += 1
            continue
        result = OpenIEResult(entities=entities, triples=triples, source=source)
        for key in _keys(doc):
            out.setdefault(key, result)
    if bad:
        log.warning("%s: %d of %d docs skipped as malformed", path, bad, len(docs))
    if not out:
        raise OpenIEImportError(f"{path}: no usable docs")
    return out


def _as_list(value: object) -> object:
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return []
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            with _LITERAL_EVAL_LOCK:  # not thread-safe on 3.11 (see the lock)
                return ast.literal_eval(value)  # HippoRAG v1 stored Python reprs; literal_eval runs no code
    return value


def _keys(doc: dict) -> list[str]:
    keys = []
    title, text = doc.get("title"), doc.get("text")
    if isinstance(text, str):
        keys.append(content_hash(" ".join(str(title or "").split()), text.strip()))
    passage = doc.get("passage")
    if isinstance(passage, str):
        head, sep, rest = passage.partition("\n")
        if sep:
            keys.append(content_hash(" ".join(head.split()), rest.strip()))
        keys.append(content_hash("", passage.strip()))
    return keys
