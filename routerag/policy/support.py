"""Whether the sentence an answer was read from says what the question asks: one of the question's own words for
the asked relation ("appointed", "designed", "population"), by lemma or shared stem.

Why: the extractive reader, unsure of a span, still picks one of the right type: "In which place did Veljko Bulajić
bury?" read as "Buenos Aires" off "He died of cancer in his native Buenos Aires in 1978". A question whose relation
the documents never state is unanswerable there, and a low-scoring span from a sentence that does not state it is no
answer. Measured on training draws (docs/research/2026-11-28-unsupported-answers.md): below a span score of 0.03
this check turned 47 wrong answers into right refusals for one right answer lost; above it, paraphrases ("What is
X's occupation?" answered by "X is an American actor") cost right answers.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..retrieval.types import RetrievedDoc
    from .citations import Citation

_ASKS_NOTHING = frozenset("""be do have get make know describe call name kind type thing sort one other according
accord document documents year time date day place way what which who whom whose when where why how also""".split())
"""Lemmas a question uses to ask, not to name the relation it asks for ("According to the documents, ..." is
lemmatized "accord")."""
_RELATION_POS = frozenset({"VERB", "NOUN", "ADJ", "ADV"})
_STEM = 4


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> Any:
    """``text`` parsed and lemmatized (the shared pipeline lemmatizes only when asked)."""
    from .short_answer import parse

    return parse(text, lemmas=True)


def relation_words(question: str, named: str = "") -> set[tuple[str, str]]:
    """(lemma, word) of the question's words that say what it asks: verbs, nouns, adjectives and adverbs outside
    its named entities, not asking words, and not in ``named`` (the answer and its page's title). spaCy's stop words
    are kept: "move", "become" and "give" name relations."""
    doc = _parsed(question)
    in_entity = {t.i for e in doc.ents for t in e}
    skip = {w.lower() for w in named.split()}
    return {(t.lemma_.lower(), t.text.lower()) for t in doc
            if t.i not in in_entity and t.pos_ in _RELATION_POS and t.is_alpha
            and t.lemma_.lower() not in _ASKS_NOTHING and t.text.lower() not in skip}


def states_asked(question: str, sentence: str, *, named: str = "") -> bool:
    """Whether ``sentence`` holds one of the question's relation words (same lemma or word, or the same first four
    letters: "moved" / "move", "studied" / "student"); True when the question has none to look for."""
    wanted = relation_words(question, named)
    if not wanted:
        return True
    forms = {f for t in _parsed(sentence) for f in (t.lemma_.lower(), t.text.lower())}
    stems = {f[:_STEM] for f in forms if len(f) >= _STEM}
    return any(lemma in forms or word in forms or (len(lemma) >= _STEM and lemma[:_STEM] in stems)
               for lemma, word in wanted)


def answer_supported(question: str, answer: str, citation: Citation | None) -> bool:
    """Whether the sentence an answer is cited from states what the question asks (True without a citation: nothing
    to check); the answer and its page's title are names, not relation words."""
    if citation is None:
        return True
    return states_asked(question, citation.sentence, named=f"{citation.title} {answer}")


def documents_state_asked(question: str, docs: Sequence[RetrievedDoc]) -> bool:
    """Whether any document read states what the question asks (one of its relation words, outside the document's
    title); False when the question names no relation (nothing to find).

    Why: an unanswerable question asks a relation its subject's pages never state, while an unsure span on
    documents that do state it is most often a hard read or a missed hop, not a missing fact. On training draws
    (docs/research/2026-11-29-refusals-where-no-document-states-the-relation.md) refusing only where no document
    states it kept 84 of 99 right refusals and 1 of 38 wrong ones (graph reads of 787 questions)."""
    if not relation_words(question):
        return False
    return any(states_asked(question, d.text, named=d.title or "") for d in docs if d.text)
