"""Citations: which retrieved passages support an answer, and with which sentence.

Method (measured in docs/benchmarks.md, "Citations"): the answer, normalised as for EM, is looked for as a
whole-token span of each sentence of each retrieved passage, in retrieval order; every passage that has such a
sentence is cited once, with its first such sentence. No model call, and no citation at all when the answer appears
in no retrieved passage, which is itself worth showing: the answer did not come from the evidence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..metrics import normalize_answer
from ..retrieval.types import RetrievedDoc

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def split_sentences(text: str) -> list[str]:
    """Sentences by end punctuation followed by a capital, digit, quote or bracket (abbreviations like "U.S. Army"
    stay whole when a lower-case word follows)."""
    return [" ".join(s.split()) for s in _SENTENCE.split(text) if s.strip()]


@dataclass(frozen=True, slots=True)
class Citation:
    id: str
    title: str
    sentence: str


def cite(answer: str | None, documents: Sequence[RetrievedDoc]) -> list[Citation]:
    """The retrieved passages whose text states the answer, each with its first sentence that does."""
    target = f" {normalize_answer(answer)} "
    if not target.strip():
        return []
    out: list[Citation] = []
    seen: set[str] = set()
    for doc in documents:
        if doc.id in seen:
            continue
        seen.add(doc.id)
        for sentence in split_sentences(doc.text):
            if target in f" {normalize_answer(sentence)} ":
                out.append(Citation(doc.id, doc.title, sentence))
                break
    return out
