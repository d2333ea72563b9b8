"""Question sets with gold answers and gold supporting passages, in the formats RAG papers ship them.

* RouteRAG / HippoRAG PopQA: ``possible_answers`` (a JSON-encoded list), ``paragraphs`` with ``is_supporting``;
* HotpotQA / 2WikiMultihopQA (original layout): ``answer``, ``supporting_facts`` = [[title, sentence]],
  ``context`` = [[title, [sentences]]];
* MuSiQue: ``answer`` + ``answer_aliases``, ``paragraphs`` with ``paragraph_text`` and ``is_supporting``;
* JSONL: ``{"question", "answers", "supporting"?}`` with supporting titles or ``{"title", "text"}`` objects.

A question with an explicitly empty answer list (``"answers": []``) is *unanswerable* (the corpus does not say):
the right response is a refusal (``QAItem.answerable`` is False). A question with no answer field at all is an error,
so a typo in a key is not read as "unanswerable".

Gold passages with text are matched to retrieved passages by content hash (exact); title-only gold by title.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graph_index.corpus import content_hash


class DatasetError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class GoldPassage:
    title: str
    text: str | None = None

    @property
    def hash(self) -> str | None:
        return content_hash(" ".join(self.title.split()), self.text) if self.text is not None else None


@dataclass(slots=True)
class QAItem:
    id: str
    question: str
    answers: list[str]
    supporting: list[GoldPassage] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def answerable(self) -> bool:
        """Whether the question has a gold answer (an unanswerable one is answered right by a refusal)."""
        return bool(self.answers)

    def support_recall(self, retrieved: Sequence[tuple[str, str]], k: int) -> float | None:
        """Share of gold passages among the first ``k`` retrieved (title, content hash) pairs; ``None`` when the
        item has no gold passages."""
        if not self.supporting:
            return None
        top = retrieved[:k]
        hashes = {h for _, h in top}
        titles = {title_key(t) for t, _ in top}
        found = 0
        for g in self.supporting:
            h = g.hash
            found += (h in hashes) if h is not None else (title_key(g.title) in titles)
        return found / len(self.supporting)


def title_key(title: str) -> str:
    """A title as gold passages are matched by it: whitespace collapsed, case folded."""
    return " ".join(title.split()).lower()


def load_questions(path: str | Path, *, limit: int | None = None) -> list[QAItem]:
    """Read a question file in any of the supported formats."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    rows: list[Any]
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{n}: invalid JSON ({exc.msg})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        rows = data if isinstance(data, list) else data.get("data", data.get("questions", []))
    items = []
    for n, row in enumerate(rows):
        if limit is not None and len(items) >= limit:
            break
        try:
            items.append(parse_item(row, default_id=f"{path.stem}-{n}"))
        except DatasetError as exc:
            raise DatasetError(f"{path}: item {n}: {exc}") from None
    if not items:
        raise DatasetError(f"{path}: no questions")
    return items


def parse_item(row: Any, default_id: str = "") -> QAItem:
    if not isinstance(row, dict):
        raise DatasetError("expected an object")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError("missing 'question'")
    answers = _answers(row)
    if not answers and not _explicitly_unanswerable(row):
        raise DatasetError("no gold answer ('answers', 'answer' or 'possible_answers'; an unanswerable question "
                           "has \"answers\": [])")
    qid = str(row.get("id", row.get("_id", default_id)))
    meta = {k: row[k] for k in ("type", "level", "prop") if k in row}
    if not answers:
        meta["unanswerable"] = True
    if isinstance(row.get("supporting_facts"), list) or "question_decomposition" in row:
        meta["multi_hop"] = True  # every supporting passage is needed (unlike PopQA's subject and object pages)
    return QAItem(id=qid, question=question.strip(), answers=answers, supporting=_supporting(row), meta=meta)


def _explicitly_unanswerable(row: dict) -> bool:
    return row.get("answers") == [] or row.get("answerable") is False


def _answers(row: dict) -> list[str]:
    out: list[str] = []

    def add(v: Any) -> None:
        if isinstance(v, str):
            s = v.strip()
            if s.startswith("[") and s.endswith("]"):
                try:
                    add(json.loads(s))  # PopQA's JSON-encoded alias list
                    return
                except json.JSONDecodeError:
                    pass
            if s and s not in out:
                out.append(s)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            add(str(v))
        elif isinstance(v, dict):
            add(v.get("target", v.get("answers", v.get("text"))))
        elif isinstance(v, Iterable):
            for x in v:
                add(x)

    for key in ("answers", "answer", "possible_answers", "golden_answers", "answer_aliases", "aliases"):
        if key in row:
            add(row[key])
    return out


def _supporting(row: dict) -> list[GoldPassage]:
    gold: list[GoldPassage] = []
    if isinstance(row.get("paragraphs"), list):  # PopQA, MuSiQue, 2Wiki (HippoRAG layout)
        for p in row["paragraphs"]:
            if isinstance(p, dict) and p.get("is_supporting"):
                body = p.get("text", p.get("paragraph_text"))
                gold.append(GoldPassage(str(p.get("title", "")), body if isinstance(body, str) else None))
        return gold
    if isinstance(row.get("supporting_facts"), list):  # HotpotQA / 2Wiki original
        titles = list(dict.fromkeys(str(f[0]) for f in row["supporting_facts"] if f))
        texts = {}
        for entry in row.get("context", []) or []:
            if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], list):
                texts[str(entry[0])] = "".join(entry[1])
        return [GoldPassage(t, texts.get(t)) for t in titles]
    sup = row.get("supporting", row.get("supporting_titles"))
    if isinstance(sup, list):
        for s in sup:
            if isinstance(s, str):
                gold.append(GoldPassage(s))
            elif isinstance(s, dict) and "title" in s:
                gold.append(GoldPassage(str(s["title"]), s.get("text")))
    return gold
