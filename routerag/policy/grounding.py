"""Grounded queries: a small policy's search query must be the question, a span of the question, or a span of the
documents shown so far (a title, a named entity, a noun chunk).

Why: the 135M router, off its two training templates, writes queries such as "What is the answer?" or rewrites
"How long is the River Tamm?" as "In what city is the River Tamm?"; a plain search with the question does better
(issue #36). Grounding keeps what the policy is good at (whether to search, in which mode, which entity next) and
drops what it is bad at (inventing text).

It works with every generator backend, because it runs after the turn is generated: a query outside the allowed set
is replaced by the allowed candidate that shares the most content words with it, and by the question when none
shares any (:func:`ground`). The loop writes the replacement into the context, so the policy reads what was
searched, and the trace records where the query came from (``query_source``, ``query_doc``) and what the policy
wrote (``query_generated``).

Candidates come from spaCy (named entities and noun chunks, the model the short-answer step loads) over the question
and the documents' text, plus the documents' titles: the same for a local index, a remote ``/retrieve`` or a
served model.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..metrics import normalize_answer
from ..retrieval.types import RetrievedDoc
from .choices import choice_options

QuerySource = Literal["question", "question_span", "title", "entity", "noun_chunk", "bridged_question"]
"""Where a grounded query came from; ``bridged_question`` is the loop's own (``decompose_bridges``): the question
with its description replaced by a name the reader read in a document (:mod:`.decompose`)."""

_STOP = frozenset("""a an the of in on at to for from by with and or but is are was were be been being do does did
what which who whom whose when where why how that this these those it its as into than then there their his her
he she they them we you your i me my our us name named""".split())
_WORD = re.compile(r"\w+")
_MAX_CANDIDATE_WORDS = 8
"""Longer noun chunks are sentence fragments, not search targets."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """An allowed query: its text, where it came from, and the document it is a span of (None: the question)."""

    text: str
    source: QuerySource
    doc_id: str | None = None


@dataclass(frozen=True, slots=True)
class Grounding:
    """What the loop searches: ``query`` from ``source``; ``generated`` is what the policy wrote when it differs."""

    query: str
    source: QuerySource
    doc_id: str | None = None
    generated: str | None = None

    @property
    def replaced(self) -> bool:
        return self.generated is not None


def key(text: str) -> str:
    """How queries and candidates are compared: SQuAD normalisation (case, punctuation, articles, spaces)."""
    return normalize_answer(text)


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


@functools.lru_cache(maxsize=4096)
def _labelled_spans(text: str) -> tuple[tuple[str, QuerySource, str], ...]:
    """spaCy's named entities (with their label) and noun chunks (label ``NOUN``, without a leading article) of
    ``text``."""
    from .short_answer import parse

    doc = parse(text)
    out: list[tuple[str, QuerySource, str]] = [(e.text, "entity", e.label_) for e in doc.ents]
    for chunk in doc.noun_chunks:
        words = [t for t in chunk if t.pos_ not in ("DET", "PRON")]
        if words and any(t.pos_ in ("NOUN", "PROPN") for t in words):
            out.append((chunk.doc[words[0].i: chunk.end].text, "noun_chunk", "NOUN"))
    return tuple(x for x in out if content_words(x[0]) and len(x[0].split()) <= _MAX_CANDIDATE_WORDS)


def _spans(text: str) -> list[tuple[str, QuerySource]]:
    return [(s, src) for s, src, _ in _labelled_spans(text)]


_NOT_A_TOPIC = frozenset({"DATE", "TIME", "CARDINAL", "ORDINAL", "QUANTITY", "MONEY", "PERCENT", "NORP"})


def new_entity(question: str, doc: RetrievedDoc) -> str | None:
    """The first entity a document names that the question does not: its title, else its first named entity that is
    not a date, number or nationality (a fixed two-hop pipeline's second query: the bridge to follow)."""
    asked = content_words(question)
    names = ([doc.title] if doc.title else []) + [s for s, src, label in _labelled_spans(doc.text)
                                                  if src == "entity" and label not in _NOT_A_TOPIC]
    return next((n for n in names if not content_words(n) <= asked), None)


def question_entities(question: str) -> list[str]:
    """The named entities of the question that are search targets (not a date, number or nationality), in order,
    without repeats: what a comparison compares ("Which was founded first, X or Y?"), each an allowed query."""
    out: dict[str, str] = {}
    for span, src, label in _labelled_spans(question):
        if src == "entity" and label not in _NOT_A_TOPIC:
            out.setdefault(key(span), span)
    return list(out.values())


def candidates(question: str, docs: Sequence[RetrievedDoc]) -> list[Candidate]:
    """Every allowed query, best first: the question, the options it names when it is a choice ("Which did earlier,
    God Can Do It or King Naresuan?": not always entities), its own entities and noun chunks, then per document (in
    the order shown) its title, entities and noun chunks; no two with the same normalised text."""
    out: dict[str, Candidate] = {}

    def add(text: str, source: QuerySource, doc_id: str | None) -> None:
        text = " ".join(text.split()).strip(" ,.;:")
        if text and content_words(text) and key(text) not in out:
            out[key(text)] = Candidate(text, source, doc_id)

    add(question, "question", None)
    for option in choice_options(question) or []:
        add(option, "question_span", None)
    for span, source in _spans(question):
        add(span, source, None)
    for d in docs:
        if d.title:
            add(d.title, "title", d.id)
        for span, source in _spans(d.text):
            add(span, source, d.id)
    return list(out.values())


def question_span(query: str, question: str) -> bool:
    """Whether ``query`` is a contiguous run of the question's words holding at least half of its content words
    (so "In what year", a span of a HotpotQA question, is not a query; the question's own entities and noun chunks
    are candidates anyway)."""
    q, whole = key(query).split(), key(question).split()
    if not q or 2 * len(content_words(" ".join(q))) < len(content_words(question)):
        return False
    return any(whole[i: i + len(q)] == q for i in range(len(whole) - len(q) + 1))


def overlap(query: str, candidate: str) -> float:
    """Token F1 of the two texts' content words: how much of the policy's query a candidate keeps."""
    a, b = content_words(query), content_words(candidate)
    common = len(a & b)
    if not common:
        return 0.0
    p, r = common / len(a), common / len(b)
    return 2 * p * r / (p + r)


def ground(query: str, question: str, docs: Sequence[RetrievedDoc]) -> Grounding:
    """``query`` when it is allowed (with where it came from), else the allowed candidate closest to it: the one
    whose content words overlap it most, the earlier on a tie (the question first), the question when none does."""
    wanted = key(query)
    if wanted == key(question):  # the usual case: no need to parse the documents for spans
        return Grounding(question, "question")
    pool = candidates(question, docs)
    for cand in pool:
        if key(cand.text) == wanted:
            return Grounding(cand.text, cand.source, cand.doc_id)
    if question_span(query, question):
        return Grounding(query, "question_span")
    best, score = pool[0], 0.0
    for cand in pool:
        s = overlap(query, cand.text)
        if s > score:
            best, score = cand, s
    return Grounding(best.text, best.source, best.doc_id, generated=query)


def is_grounded(query: str, question: str, docs: Sequence[RetrievedDoc]) -> bool:
    """Whether ``query`` is in the allowed set (what a report counts and a test checks): what :func:`ground` keeps,
    or the loop's bridged question (:func:`~routerag.policy.decompose.is_bridged`)."""
    from .decompose import is_bridged  # decompose reads this module's content words

    return not ground(query, question, docs).replaced or is_bridged(query, question, docs)


_SEARCH_BODY = re.compile(r"(<search>)(.*?)(</search>)", re.DOTALL | re.IGNORECASE)
_MODE_TAGS = re.compile(r"^\s*((?:\[(?:passage|graph)\]\s*)*)", re.IGNORECASE)


def rewrite_search(turn: str, query: str, mode_tags: Sequence[str] | None = None) -> str:
    """The turn with its first search's query replaced, and its mode tags too when ``mode_tags`` is given (else
    kept), so the context shows what was searched."""
    m = _SEARCH_BODY.search(turn)
    if m is None:
        return turn
    tags = _MODE_TAGS.match(m.group(2))
    prefix = tags.group(1) if tags else ""
    if mode_tags is not None:
        prefix = "".join(f"[{t}]" for t in mode_tags)
    if prefix and not prefix[-1].isspace():
        prefix += " "
    return f"{turn[: m.start()]}<search>{prefix}{query}</search>{turn[m.end():]}"
