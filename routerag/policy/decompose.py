"""A bridge question split in two: the description of the entity it does not name, asked as a question of its own,
and the rest of the question, to ask again once that entity is known.

"In which town was the founder of the Fenwold Valley Railway born?" describes a person without naming them. Its
first search finds the railway's page, and the extractive reader, asked the whole question, answers with the name
on that page (the founder), not the town: the question's answer is on a page the first search did not reach. Split,
it becomes "Who was the founder of the Fenwold Valley Railway?" (read from the first documents: "Halvard Penrick")
and "In which town was Halvard Penrick born?", a single-hop question to search and read. The loop setting
``decompose_bridges`` runs this plan (:mod:`routerag.policy.loop`); measured in
docs/research/2026-12-02-bridge-questions-read-in-two-steps.md.

A description is a common noun an article introduces ("the", "a", "an") with a relative clause or participle phrase
("the company that operated X", "the town where X stands", "the railway chaired by Y"), or a person noun ("founder",
"designer", "first director") with an "of" and a name ("the founder of the Fenwold Valley Railway"). The innermost
one is split off. Not split: a question that only asks what the description is ("Who was the founder of X?" is one
hop), a description holding the asking word ("the team that was formed in what year"), or one with a comma.
The parse is spaCy's (the pipeline the short-answer step loads).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..metrics import normalize_answer
from ..retrieval.types import RetrievedDoc
from .answer_types import is_person_noun
from .grounding import content_words

_CLAUSES = frozenset({"relcl", "acl"})
_ARTICLES = frozenset({"the", "a", "an"})
_ONE_HOP = re.compile(r"\s*(?:(?:who|what|which\s+\w+)\s+(?:is|was|are|were)\s+(?:the\s+name\s+of\s+)?\{\}"
                      r"(?:\s+in\s+\d{4})?|name\s+\{\})\s*[?.]?\s*", re.IGNORECASE)
"""The rest of a question that asks only what the description is: nothing left to ask after it."""
_ASKING = re.compile(r"\b(?:who|whom|whose|what|which|when|where|how)\b", re.IGNORECASE)
_MAX_BRIDGE_WORDS = 6


@dataclass(frozen=True, slots=True)
class Decomposition:
    """A bridge question in two parts: ``inner`` asks for the described entity; ``template`` is the question with
    the description replaced by ``{}``."""

    description: str
    inner: str
    template: str

    def outer(self, bridge: str) -> str:
        """The question asked of the entity the inner question found."""
        return self.template.replace("{}", bridge, 1)


def _bare_participle(token: Any) -> bool:
    """"born" in "was the founder of X born?": the parse hangs the question's own verb on the noun."""
    return token.dep_ in _CLAUSES and token.tag_ == "VBN" and len(list(token.subtree)) == 1


def _describes(token: Any) -> bool:
    """Whether ``token`` heads a description (see the module's docstring)."""
    if token.pos_ != "NOUN" or token.lower_ == "one" \
            or not any(c.dep_ == "det" and c.lower_ in _ARTICLES for c in token.children):
        return False  # "the one that X was represented": no question to ask of it ("What is the one that ...?")
    for child in token.children:
        if child.dep_ in _CLAUSES and not _bare_participle(child):
            return True
        if child.dep_ == "prep" and child.lower_ == "of" and is_person_noun(token.lower_):
            objects = [g for g in child.children if g.dep_ == "pobj"]
            if objects and any(t.pos_ == "PROPN" for t in objects[0].subtree):
                return True
    return False


def _description_span(doc: Any, head: Any) -> Any:
    """The description's words: the head's subtree without a trailing verb of the question ("born", "die")."""
    last = head.right_edge.i
    while last > head.i and doc[last].pos_ in ("VERB", "AUX") and not list(doc[last].children) \
            and all(t.is_punct for t in doc[last + 1:]):
        last -= 1
    return doc[head.left_edge.i: last + 1]


@functools.lru_cache(maxsize=4096)
def decompose(question: str) -> Decomposition | None:
    """The question split at its innermost description, or None when it has none to split (see the module's
    docstring)."""
    from .short_answer import parse

    doc = parse(question)
    heads = [t for t in doc if _describes(t)]
    inner = [t for t in heads if not any(o.i != t.i and o.i in {x.i for x in t.subtree} for o in heads)]
    if not inner:
        return None
    head = inner[0]
    span = _description_span(doc, head)
    text = span.text.rstrip(" ?")
    template = question[:span.start_char] + "{}" + question[span.start_char + len(text):]
    if "," in text or _ONE_HOP.fullmatch(template) or re.search(r"\b(?:what|how)\b", text, re.IGNORECASE) \
            or not _ASKING.search(template.replace("{}", "")):
        return None
    asked = "Who was" if is_person_noun(head.lower_) else "What is"
    return Decomposition(text, f"{asked} {text}?", template)


def names_bridge(answer: str, question: str) -> bool:
    """Whether the inner question's answer can stand for the description: a name (it opens with a capital letter,
    and is short) that the question does not already hold. A role noun ("poet and librettist"), a number or a
    sentence fragment read as the answer would make the outer question nonsense."""
    words = answer.split()
    if not words or not words[0][:1].isupper() or not words[0][:1].isalpha() or len(words) > _MAX_BRIDGE_WORDS:
        return False
    return not content_words(answer) <= content_words(question)


def is_bridged(query: str, question: str, docs: Sequence[RetrievedDoc]) -> bool:
    """Whether ``query`` is the question with its description replaced by a span of a document's title or text:
    the loop's ``bridged_question``, grounded by construction (what a report counts)."""
    parts = decompose(question)
    if parts is None:
        return False
    before, after = parts.template.split("{}", 1)
    if not (query.startswith(before) and query.endswith(after)) or len(query) <= len(before) + len(after):
        return False
    name = query[len(before): len(query) - len(after)]
    return any(name == d.title or name in d.text for d in docs)


def names_bridge_entity(read: Any, docs: Sequence[RetrievedDoc], bridge: str) -> bool:
    """Whether the document an answer was read from names the bridge entity, wholly or by one of its words of three
    letters or more ("Wren" for "Tobias Wren"). Why: the bridged question's documents may not say what it asks, and
    the reader then answers from another entity's page ("born in Lindqvist", on the concertmaster's page, for the
    librettist's birthplace)."""
    cited = next((d for d in docs if read.citation is not None and d.id == read.citation.id), None)
    if cited is None:
        return False
    page = f" {normalize_answer(f'{cited.title} {cited.text}')} "
    return any(f" {word} " in page for word in normalize_answer(bridge).split() if len(word) >= 3)
