"""Canonical text forms for graph nodes: the same entity written two ways must become one node."""

from __future__ import annotations

import re
from functools import lru_cache

_NON_WORD = re.compile(r"[^\w]+|_+", re.UNICODE)
_POSSESSIVE = re.compile(r"(?<=\w)['’]s\b", re.IGNORECASE)


def normalize_phrase(text: str) -> str:
    """Lower-case, punctuation to spaces, whitespace collapsed, a leading "the" dropped.

    Unicode letters are kept (unlike HippoRAG's ASCII-only rule, so "Zürich" stays "zürich"); the article goes so
    that a title ("The Glass Lighthouse") and a mention ("Glass Lighthouse") become one node, and a possessive
    "'s" goes so that "Arthur's Magazine" does not become "arthur s magazine".
    """
    words = _NON_WORD.sub(" ", _POSSESSIVE.sub("", text.lower())).split()
    if len(words) > 1 and words[0] == "the" and not all(w in _stop_words() for w in words[1:]):
        words = words[1:]
    return " ".join(words)


def alnum_count(text: str) -> int:
    return sum(ch.isalnum() for ch in text)


def is_stopword_phrase(phrase: str) -> bool:
    """True for a normalised phrase made only of function words ("a", "one", "the first"): never a useful node."""
    stop = _stop_words()
    return all(w in stop for w in phrase.split())


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS  # spaCy's list: well kept, and already a dependency

    return frozenset(STOP_WORDS)
