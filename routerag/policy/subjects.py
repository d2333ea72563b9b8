"""The pages a one-fact question may be answered from: those that name the thing it asks about.

Why: every hand-written corpus puts confusable names side by side ("Sable Bridge" and "Old Sable Bridge", "Guild of
Lampwrights" and "Guild of Lampmakers"), retrieval brings both pages, and the span head reads the asked relation off
whichever page states it. On an unanswerable question (the named thing's page lacks the fact) that is a confident
wrong answer instead of a refusal; on an answerable one, the confusable's value. Reading only the pages that name
the subject won 57 records and lost 7 on three development sets, every row 4.6 to 5.8 points up, refusal precision
0.37 → 0.49 (docs/research/2026-12-03-reading-the-pages-that-name-the-subject.md).

A question is left alone (all its pages read) when it has no proper-noun run, when it is a yes/no or choice question
(its sides have their own rules), when it describes its subject instead of naming it (a bridge: the answer is on a
page one hop from the name), and when no page names the subject (a name written in another form than the page's).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ..metrics import normalize_answer
from ..retrieval.types import RetrievedDoc
from .answer_types import NAME_JOINS
from .choices import choice_options, is_yes_no
from .decompose import decompose
from .nesting import is_nested

def _is_name_part(token: object, running: bool) -> bool:
    """A capitalised proper noun, or inside a name a short all-capitals word ("Kestrel II")."""
    text = token.text  # type: ignore[attr-defined]
    if text[:1].isupper() and token.pos_ == "PROPN":  # type: ignore[attr-defined]
        return True
    return running and text.isalpha() and text.isupper() and len(text) <= 4


@functools.lru_cache(maxsize=4096)
def subject_names(question: str) -> tuple[str, ...]:
    """The runs of proper nouns the question writes, by the shared spaCy pipeline's tags ("Who designed the Old
    Sable Bridge?" → "Old Sable Bridge"), a joining word kept between two of them; a possessive ends a run."""
    from .short_answer import parse

    tokens = list(parse(question))
    runs: list[str] = []
    run: list[str] = []
    for i, token in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if _is_name_part(token, bool(run)):
            run.append(token.text)
        elif run and token.lower_ in NAME_JOINS and nxt is not None and _is_name_part(nxt, False):
            run.append(token.text)
        elif run:
            runs.append(" ".join(run))
            run = []
    if run:
        runs.append(" ".join(run))
    return tuple(runs)


def asks_of_a_named_subject(question: str) -> bool:
    """Whether the question names its subject and asks one fact of it: a proper-noun run, not yes/no, no options,
    not nested, and nothing to decompose."""
    if not subject_names(question) or is_yes_no(question) or choice_options(question):
        return False
    return not is_nested(question) and decompose(question) is None


def _names_any(names: Sequence[str], doc: RetrievedDoc) -> bool:
    """Whether the page's title or text holds one of the whole names (SQuAD-normalised, whole tokens); the page is
    normalised once."""
    text = normalize_answer(f"{doc.title or ''} {doc.text}")
    page = f" {text} "
    return any(f" {normalize_answer(n)} " in page for n in names)


def subject_pages(question: str, docs: Sequence[RetrievedDoc]) -> Sequence[RetrievedDoc]:
    """The documents to read for ``question``: those naming one of its subject's names when it asks one fact of a
    named subject and at least one does; otherwise all of them."""
    if not asks_of_a_named_subject(question):
        return docs
    names = subject_names(question)
    naming = [d for d in docs if _names_any(names, d)]
    return naming or docs
