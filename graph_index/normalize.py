"""Canonical text forms for graph nodes: the same entity written two ways must become one node."""

from __future__ import annotations

import re

_NON_WORD = re.compile(r"[^\w]+|_+", re.UNICODE)


def normalize_phrase(text: str) -> str:
    """Lower-case, punctuation to spaces, whitespace collapsed, a leading "the" dropped.

    Unicode letters are kept (unlike HippoRAG's ASCII-only rule, so "Zürich" stays "zürich"); the article goes so
    that a title ("The Glass Lighthouse") and a mention ("Glass Lighthouse") become one node.
    """
    words = _NON_WORD.sub(" ", text.lower()).split()
    if len(words) > 1 and words[0] == "the":
        words = words[1:]
    return " ".join(words)


def alnum_count(text: str) -> int:
    return sum(ch.isalnum() for ch in text)
