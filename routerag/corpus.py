"""Reading corpora: JSONL, HippoRAG/RouteRAG JSON lists, and HotpotQA's title → sentences objects.

Every passage gets a stable id from a hash of its content, so the same text always maps to the same id across
builds, incremental updates and caches. Malformed records are reported as ``file:line: reason``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class CorpusError(ValueError):
    """A corpus problem the user must fix; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def content(self) -> str:
        """What gets embedded and extracted from: the title on its own line, then the text."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    @property
    def hash(self) -> str:
        return content_hash(self.title, self.text)

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "text": self.text}


def content_hash(title: str, text: str) -> str:
    """Stable 16-hex-digit id of a passage's content (title and text, whitespace-trimmed)."""
    h = hashlib.sha256()
    h.update(title.strip().encode("utf-8"))
    h.update(b"\x00")
    h.update(text.strip().encode("utf-8"))
    return h.hexdigest()[:16]


def text_hash(text: str) -> str:
    """Cache key of an arbitrary string."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(slots=True)
class LoadReport:
    """What loading saw besides the passages it kept."""

    files: list[str] = field(default_factory=list)
    records: int = 0
    duplicates: int = 0
    skipped: list[str] = field(default_factory=list)
    """``file:line: reason`` for each record skipped under ``skip_bad``."""


@dataclass(slots=True)
class _Raw:
    where: str
    value: Any


def load_corpus(
    paths: Iterable[str | Path],
    *,
    skip_bad: bool = False,
    known_hashes: Iterable[str] = (),
) -> tuple[list[Passage], LoadReport]:
    """Load passages from one or more files, dropping exact duplicates (by content hash).

    ``known_hashes`` are treated as already present (incremental adds count them as duplicates). Raises
    :class:`CorpusError` with ``file:line: reason`` on the first malformed record unless ``skip_bad``, and on an
    empty result.
    """
    report = LoadReport()
    seen_hashes = set(known_hashes)
    seen_ids: dict[str, str] = {}
    passages: list[Passage] = []
    for path in paths:
        p = Path(path)
        report.files.append(str(p))
        for raw in _records(p):
            report.records += 1
            try:
                passage = _to_passage(raw)
            except CorpusError as exc:
                if not skip_bad:
                    raise
                report.skipped.append(str(exc))
                continue
            if passage.hash in seen_hashes:
                report.duplicates += 1
                continue
            other = seen_ids.get(passage.id)
            if other is not None:
                err = CorpusError(f"{raw.where}: id {passage.id!r} already used by a different passage at {other}")
                if not skip_bad:
                    raise err
                report.skipped.append(str(err))
                continue
            seen_hashes.add(passage.hash)
            seen_ids[passage.id] = raw.where
            passages.append(passage)
    if not passages:
        names = ", ".join(report.files) or "(no files)"
        detail = f" ({len(report.skipped)} malformed records skipped)" if report.skipped else ""
        raise CorpusError(f"empty corpus: no passages in {names}{detail}")
    return passages, report


def _records(path: Path) -> Iterator[_Raw]:
    if not path.exists():
        raise CorpusError(f"{path}: no such file")
    if path.is_dir():
        raise CorpusError(f"{path}: is a directory, expected a .json or .jsonl file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise CorpusError(f"{path}:{line}: not valid UTF-8") from exc
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        yield from _jsonl_records(path, text)
        return
    stripped = text.lstrip()
    if stripped.startswith("["):
        yield from _json_array_records(path, text)
    elif stripped.startswith("{") and path.suffix.lower() == ".json":
        yield from _json_object_records(path, text)
    elif not stripped:
        return
    else:
        # Anything else is read as JSONL, which also reports the first bad line precisely.
        yield from _jsonl_records(path, text)


def _jsonl_records(path: Path, text: str) -> Iterator[_Raw]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            yield _Raw(where, CorpusError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})"))
            continue
        yield _Raw(where, value)


def _json_array_records(path: Path, text: str) -> Iterator[_Raw]:
    """Yield each element of a top-level JSON array with the line it starts on.

    ``json.load`` gives no positions, so the array is walked element by element with ``raw_decode``.
    """
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    n = len(text)
    counted = [0, 1]  # offset up to which newlines are counted, and the line number there

    def line_of(offset: int) -> int:
        # elements come in order, so count only the newlines since the last call (linear in the file size)
        if offset < counted[0]:
            return text.count("\n", 0, offset) + 1
        counted[1] += text.count("\n", counted[0], offset)
        counted[0] = offset
        return counted[1]

    def skip_ws(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    pos = skip_ws(pos)
    if pos < n and text[pos] == "]":
        return
    while True:
        pos = skip_ws(pos)
        where = f"{path}:{line_of(pos)}"
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        yield _Raw(where, value)
        pos = skip_ws(end)
        if pos >= n:
            raise CorpusError(f"{path}:{line_of(n)}: invalid JSON (unterminated array)")
        if text[pos] == ",":
            pos += 1
            continue
        if text[pos] == "]":
            if text[pos + 1 :].strip():
                raise CorpusError(f"{path}:{line_of(pos + 1)}: invalid JSON (extra data after the array)")
            return
        raise CorpusError(f"{path}:{line_of(pos)}: invalid JSON (expected ',' or ']' between elements)")


def _json_object_records(path: Path, text: str) -> Iterator[_Raw]:
    """HotpotQA's corpus layout: ``{title: [sentence, ...]}`` (or ``{title: text}``)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    for title, body in obj.items():
        where = f"{path}: key {title!r}"
        if isinstance(body, list) and all(isinstance(s, str) for s in body):
            yield _Raw(where, {"title": title, "text": "".join(body)})
        elif isinstance(body, str):
            yield _Raw(where, {"title": title, "text": body})
        else:
            yield _Raw(where, CorpusError(f"{where}: expected a list of sentences or a string"))


def _to_passage(raw: _Raw) -> Passage:
    value = raw.value
    if isinstance(value, CorpusError):
        raise value
    if not isinstance(value, dict):
        raise CorpusError(f"{raw.where}: expected an object with 'title' and 'text', got {type(value).__name__}")
    text = value.get("text")
    if text is None:
        text = value.get("contents")  # Search-R1 / pyserini style records
    if not isinstance(text, str):
        raise CorpusError(f"{raw.where}: missing 'text' (a string)")
    title = value.get("title", "")
    if title is None:
        title = ""
    if not isinstance(title, str):
        raise CorpusError(f"{raw.where}: 'title' must be a string")
    title, text = " ".join(title.split()), text.strip()
    if not text:
        raise CorpusError(f"{raw.where}: empty 'text'")
    given = value.get("id")
    if given is not None and not isinstance(given, (str, int)):
        raise CorpusError(f"{raw.where}: 'id' must be a string or an integer")
    pid = str(given) if given is not None and str(given).strip() else content_hash(title, text)
    return Passage(id=pid, title=title, text=text)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False))
            f.write("\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
