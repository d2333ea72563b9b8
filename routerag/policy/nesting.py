"""Whether a question names what it asks about only through a description: a noun with a relative clause or a
participle phrase ("the actress **who played** Corliss Archer", "the pop band **founded by** one of the stars of X",
"the one **that** Cry Over Me was written by").

Why: such a question is a bridge. The page that answers it belongs to an entity the question does not name, and
Personalized PageRank reaches that entity from the named one through their shared facts, where a dense search of
the question finds pages that resemble the question. On the training draws it flags 117 of 146 bridge questions
and 4 of 160 unanswerable ones. The loop settings ``graph_for_nested`` and ``bridge_for_nested`` use it; measured,
they are off on the shipped card (docs/research/2026-11-29-nested-questions-as-bridges.md).

The parse is spaCy's (the pipeline the short-answer step loads). A relative clause or participle phrase counts only
on a noun that a determiner introduces ("the", "a", "an"), on "one", or when the clause opens with a relative
pronoun: a bare name followed by a participle ("Who was X directed by?") is a passive single-hop question, not a
description.
"""

from __future__ import annotations

import functools

_CLAUSES = frozenset({"relcl", "acl"})
_HEADS = frozenset({"NOUN", "PROPN", "PRON", "NUM"})
_ASKING = frozenset({"what", "which", "who", "whom", "it"})
"""Heads that are the question's own asking words ("What is it that ..."), not a described entity."""
_ARTICLES = frozenset({"the", "a", "an"})
_RELATIVE_TAGS = frozenset({"WDT", "WP", "WP$"})


@functools.lru_cache(maxsize=4096)
def is_nested(question: str) -> bool:
    """True when the question describes an entity it does not name (a bridge question); see the module's
    docstring."""
    from .short_answer import parse

    for token in parse(question):
        if token.dep_ not in _CLAUSES:
            continue
        head = token.head
        if head.pos_ not in _HEADS or head.lower_ in _ASKING:
            continue
        introduced = head.lower_ == "one" or any(c.dep_ == "det" and c.lower_ in _ARTICLES for c in head.children)
        if introduced or any(c.tag_ in _RELATIVE_TAGS for c in token.children):
            return True
    return False
