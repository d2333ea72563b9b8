"""Reading corpora: JSONL, HippoRAG/RouteRAG JSON lists, and HotpotQA's title → sentences objects.

Every passage gets a stable id from a hash of its content, so the same text always maps to the same id across
builds, incremental updates and caches. Malformed records are reported as ``file:line: reason``; with
``skip_bad`` every kind of bad record (invalid JSON or UTF-8, wrong fields, clashing ids, oversize) is skipped and
counted per kind instead.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO


class CorpusError(ValueError):
    """A corpus problem the user must fix; the message names the file and line.

    ``kind`` says which sort of problem (``invalid_json``, ``invalid_utf8``, ``oversize``, ...), so that records
    skipped under ``skip_bad`` are counted per kind."""

    def __init__(self, message: str, kind: str = "invalid_record") -> None:
        super().__init__(message)
        self.kind = kind


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
    """Passages dropped as exact duplicates: of an earlier record, or of a passage already indexed."""
    already_indexed: int = 0
    """Of those, the duplicates of a passage the index already holds (``known_hashes``): an update that finds only
    these has nothing to do, which is not an empty corpus."""
    skipped: list[str] = field(default_factory=list)
    """``file:line: reason`` for each record skipped (under ``skip_bad``, or oversize with ``oversize="skip"``)."""
    skipped_by_kind: Counter[str] = field(default_factory=Counter)
    """How many records were skipped, per :attr:`CorpusError.kind`."""
    split: int = 0
    """Oversize passages split into several (``oversize="split"``)."""

    def skip(self, err: CorpusError) -> None:
        self.skipped.append(str(err))
        self.skipped_by_kind[err.kind] += 1


@dataclass(slots=True)
class _Raw:
    where: str
    value: Any


DEFAULT_MAX_PASSAGE_CHARS = 100_000
MAX_LINE_BYTES = 64 * 2**20
"""A JSONL line longer than this is a located error (skipped under ``skip_bad``) and is never held whole: a file
without newlines must not be read into memory as one line. 64 MiB is far above any passage the default
``max_passage_chars`` lets through, even with every character escaped."""
Oversize = Literal["error", "skip", "split"]


def load_corpus(
    paths: Iterable[str | Path],
    *,
    skip_bad: bool = False,
    known_hashes: Iterable[str] = (),
    max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS,
    oversize: Oversize = "error",
) -> tuple[list[Passage], LoadReport]:
    """Load passages from one or more files, dropping exact duplicates (by content hash).

    ``known_hashes`` are treated as already present (incremental adds count them as duplicates, and as
    ``already_indexed``). Raises :class:`CorpusError` with ``file:line: reason`` on the first malformed record unless
    ``skip_bad``, and on an empty result (no passages, and none dropped as already indexed: an add of passages the
    index holds gets an empty list and a report that counts them). A passage longer than ``max_passage_chars``
    (title + text) is, by ``oversize``: an error (skipped under ``skip_bad``), skipped and counted, or split into
    passages under the limit. Nothing that long reaches an extractor: spaCy refuses texts over 1,000,000 characters
    and needs about 1 GB of memory per 100,000.

    The list holds every passage (what an update and the Ray build's driver take). :func:`iter_corpus` is the
    same reading without the list, and :func:`count_corpus` its counting pass.
    """
    report = LoadReport()
    passages = list(iter_corpus(paths, report, skip_bad=skip_bad, known_hashes=known_hashes,
                                max_passage_chars=max_passage_chars, oversize=oversize))
    _check_not_empty(len(passages), report)
    return passages, report


def count_corpus(paths: Iterable[str | Path], **options: Any) -> tuple[int, LoadReport]:
    """How many passages :func:`iter_corpus` yields with ``options``, holding none of them: the streaming build's
    first pass, which sizes its files and progress bars and stops at a bad record before any model runs. Raises
    what :func:`load_corpus` raises (a located bad record, an empty corpus)."""
    report = LoadReport()
    n = sum(1 for _ in iter_corpus(paths, report, **options))
    _check_not_empty(n, report)
    return n, report


def _check_not_empty(n: int, report: LoadReport) -> None:
    if not n and not report.already_indexed:
        names = ", ".join(report.files) or "(no files)"
        detail = f" ({len(report.skipped)} malformed records skipped)" if report.skipped else ""
        raise CorpusError(f"empty corpus: no passages in {names}{detail}", "empty")


def iter_corpus(
    paths: Iterable[str | Path],
    report: LoadReport,
    *,
    skip_bad: bool = False,
    known_hashes: Iterable[str] = (),
    max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS,
    oversize: Oversize = "error",
) -> Iterator[Passage]:
    """The passages of :func:`load_corpus`, one at a time, as they are read (``report`` is filled as it goes).

    A JSONL file is read line by line, so memory is bounded by the longest line (at most :data:`MAX_LINE_BYTES`)
    plus the duplicate check's hashes and ids (about 150 bytes per passage), not by the file. A JSON array or
    object file is read whole first (its elements are then parsed one by one).
    """
    known = set(known_hashes)
    seen_hashes: set[str] = set()
    seen_ids: dict[str, str] = {}
    for path in paths:
        p = Path(path)
        report.files.append(str(p))
        for raw in _records(p):
            report.records += 1
            try:
                passage = _to_passage(raw)
                pieces = _fit(passage, raw.where, max_passage_chars, oversize)
            except CorpusError as exc:
                if not (skip_bad or (exc.kind == "oversize" and oversize == "skip")):
                    raise
                report.skip(exc)
                continue
            report.split += len(pieces) > 1
            for piece in pieces:
                if piece.hash in known or piece.hash in seen_hashes:
                    report.duplicates += 1
                    report.already_indexed += piece.hash in known
                    continue
                other = seen_ids.get(piece.id)
                if other is not None:
                    err = CorpusError(f"{raw.where}: id {piece.id!r} already used by a different passage at {other}",
                                      "duplicate_id")
                    if not skip_bad:
                        raise err
                    report.skip(err)
                    continue
                seen_hashes.add(piece.hash)
                seen_ids[piece.id] = raw.where
                yield piece


def _fit(passage: Passage, where: str, limit: int, oversize: Oversize) -> list[Passage]:
    """``[passage]`` when it is within ``limit`` characters, else what ``oversize`` says."""
    size = len(passage.title) + len(passage.text)
    if size <= limit:
        return [passage]
    room = limit - len(passage.title) - 1
    if oversize != "split" or room < min(limit // 2, 1000):
        why = "its title alone nearly fills" if oversize == "split" else "over"
        raise CorpusError(
            f"{where}: passage of {size:,} characters, {why} corpus.max_passage_chars ({limit:,}); split it, raise "
            "the limit, or set corpus.oversize to \"split\" or \"skip\" (--oversize, ROUTERAG_CORPUS__OVERSIZE)",
            "oversize")
    chunks = split_text(passage.text, room)
    given = passage.id != content_hash(passage.title, passage.text)
    return [Passage(id=f"{passage.id}#{k}" if given else content_hash(passage.title, chunk), title=passage.title,
                    text=chunk) for k, chunk in enumerate(chunks, start=1)]


def split_text(text: str, room: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``room`` characters, at a paragraph, sentence or word break in the
    second half of each piece where there is one."""
    pieces = []
    while len(text) > room:
        window = text[: room + 1]
        cut = -1
        for sep in ("\n\n", "\n", ". ", " "):
            at = window.rfind(sep, room // 2)
            if at > 0:
                cut = at + len(sep) if sep != " " else at
                break
        if cut <= 0 or cut > room:
            cut = room
        piece, text = text[:cut].strip(), text[cut:].lstrip()
        if piece:
            pieces.append(piece)
    if text.strip():
        pieces.append(text.strip())
    return pieces


def _records(path: Path) -> Iterator[_Raw]:
    if not path.exists():
        raise CorpusError(f"{path}: no such file", "missing_file")
    if path.is_dir():
        raise CorpusError(f"{path}: is a directory, expected a .json or .jsonl file", "missing_file")
    with open(path, "rb") as f:
        head = f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
    if path.suffix.lower() in (".jsonl", ".ndjson") or not head[:1] or head[:1] not in b"[{":
        # Anything but a JSON document is read as JSONL, which also reports the first bad line precisely.
        yield from _jsonl_records(path)
        return
    if head.startswith(b"{") and path.suffix.lower() != ".json":
        yield from _jsonl_records(path)
        return
    # A whole JSON document: bytes that are not UTF-8 are carried as lone surrogates ("surrogateescape") and
    # reported on the record that holds them, so one bad record does not sink the file.
    text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    if head.startswith(b"["):
        yield from _json_array_records(path, text)
    else:
        yield from _json_object_records(path, text)


def _jsonl_records(path: Path) -> Iterator[_Raw]:
    """One record per line, decoded line by line: a line that is not UTF-8 is one bad record, not a bad file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(_lines(f), start=1):
            where = f"{path}:{lineno}"
            if raw is None:
                yield _Raw(where, CorpusError(f"{where}: line longer than {MAX_LINE_BYTES:,} bytes (a file without "
                                              "line breaks, or one huge record); split it", "oversize"))
                continue
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield _Raw(where, CorpusError(
                    f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
                    "re-encode the file as UTF-8", "invalid_utf8"))
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                yield _Raw(where, CorpusError(f"{where}: invalid JSON ({_json_message(exc)} at column {exc.colno})",
                                              "invalid_json"))
                continue
            yield _Raw(where, value)


def _lines(f: BinaryIO) -> Iterator[bytes | None]:
    """The file's lines; ``None`` for a line over :data:`MAX_LINE_BYTES`, whose rest is read past in pieces."""
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = f.readline(MAX_LINE_BYTES)
        yield None


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
            raise CorpusError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg}; a JSON list cannot be read past a "
                              "syntax error: fix it, or convert the file to JSONL)", "invalid_json") from None
        yield _Raw(where, value)
        pos = skip_ws(end)
        if pos >= n:
            raise CorpusError(f"{path}:{line_of(n)}: invalid JSON (unterminated array)", "invalid_json")
        if text[pos] == ",":
            pos += 1
            continue
        if text[pos] == "]":
            if text[pos + 1 :].strip():
                raise CorpusError(f"{path}:{line_of(pos + 1)}: invalid JSON (extra data after the array)",
                                  "invalid_json")
            return
        raise CorpusError(f"{path}:{line_of(pos)}: invalid JSON (expected ',' or ']' between elements)",
                          "invalid_json")


def _json_object_records(path: Path, text: str) -> Iterator[_Raw]:
    """HotpotQA's corpus layout: ``{title: [sentence, ...]}`` (or ``{title: text}``)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})", "invalid_json") from None
    if not isinstance(obj, dict):
        raise CorpusError(f"{path}:1: expected an object of title -> sentences", "not_an_object")
    if _looks_like_one_record(obj):
        raise CorpusError(f"{path}:1: one passage object ({', '.join(map(repr, obj))}), not HotpotQA's "
                          "{title: sentences} layout: send passages as a JSON list ([{...}, ...]) or as JSONL, one "
                          "object per line", "not_a_list")
    for title, body in obj.items():
        where = f"{path}: key {title!r}"
        if isinstance(body, list) and all(isinstance(s, str) for s in body):
            yield _Raw(where, {"title": title, "text": "".join(body)})
        elif isinstance(body, str):
            yield _Raw(where, {"title": title, "text": body})
        else:
            yield _Raw(where, CorpusError(f"{where}: expected a list of sentences or a string", "not_an_object"))


RECORD_FIELDS = frozenset({"id", "title", "text", "contents"})


def _looks_like_one_record(obj: dict[str, Any]) -> bool:
    """A lone passage record (``{"title": "a", "text": "b"}``), which read as HotpotQA's layout would become one
    passage per field: only record fields, with a text among them."""
    return bool(obj) and set(obj) <= RECORD_FIELDS and bool({"text", "contents"} & set(obj))


def _json_message(exc: json.JSONDecodeError) -> str:
    """The decoder's message without its dangling "at" (``Invalid control character at``), since the caller says
    where."""
    return exc.msg.removesuffix(" at")


def _to_passage(raw: _Raw) -> Passage:
    value = raw.value
    if isinstance(value, CorpusError):
        raise value
    if not isinstance(value, dict):
        raise CorpusError(f"{raw.where}: expected an object with 'title' and 'text', got {type(value).__name__}",
                          "not_an_object")
    text = value.get("text")
    if text is None:
        text = value.get("contents")  # Search-R1 / pyserini style records
    if not isinstance(text, str):
        raise CorpusError(f"{raw.where}: missing 'text' (a string)", "missing_text")
    title = value.get("title", "")
    if title is None:
        title = ""
    if not isinstance(title, str):
        raise CorpusError(f"{raw.where}: 'title' must be a string", "bad_field")
    title, text = " ".join(title.split()), text.strip()
    if not text:
        raise CorpusError(f"{raw.where}: empty 'text'", "empty_text")
    given = value.get("id")
    if given is not None and not isinstance(given, (str, int)):
        raise CorpusError(f"{raw.where}: 'id' must be a string or an integer", "bad_field")
    for name, s in (("title", title), ("text", text), ("id", str(given) if given is not None else "")):
        if not _encodable(s):
            # bytes that were not UTF-8 (carried as lone surrogates), or a "\udXXX" escape: no UTF-8 file,
            # tokenizer or hash can take them
            raise CorpusError(f"{raw.where}: {name!r} is not valid UTF-8 (undecodable bytes or a lone surrogate "
                              "escape)", "invalid_utf8")
    pid = str(given) if given is not None and str(given).strip() else content_hash(title, text)
    return Passage(id=pid, title=title, text=text)


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def write_jsonl(path: Path, rows: Iterable[Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        append_jsonl(f, rows)


def append_jsonl(f: TextIO, rows: Iterable[Any]) -> None:
    """Write ``rows`` to the open text file ``f``, one JSON document per line."""
    for row in rows:
        f.write(json.dumps(row, ensure_ascii=False))
        f.write("\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
