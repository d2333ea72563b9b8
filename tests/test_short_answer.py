"""The short-answer step on replies of the kinds a small reader writes (spaCy's embedded English model)."""

from __future__ import annotations

import pytest

from routerag.policy.short_answer import answer_kinds, shorten
from routerag.retrieval.types import RetrievedDoc

pytestmark = pytest.mark.slow  # loads spaCy

DOCS = [RetrievedDoc("1", "Anne Brusletto", "Anne Brusletto (24 January 1951 – 17 August 1982) was a Norwegian "
                     "alpine skier. She was born in Geilo and competed for Norway.", 1.0),
        RetrievedDoc("2", "Geilo", "Geilo is a village in Hol Municipality in Buskerud county, Norway.", 0.5),
        RetrievedDoc("3", "Pierre Chatenet", "Pierre Chatenet was a French politician and film director.", 0.3)]


@pytest.mark.parametrize("question, reply, expected", [
    # the wh-phrase asks for a place: dates, the subject and the nationality are passed over
    ("In what city was Anne Brusletto born?",
     "Anne Brusletto (24 January 1951 – 17 August 1982) was born in Geilo, Norway.", "Geilo"),
    # any other question: an entity or a noun the reply names, not the subject spelt out in full, not "French"
    ("What is Pierre Chatenet's occupation?", "Pierre Chatenet is a French politician.", "politician"),
    ("What is Pierre Chatenet's occupation?", "The occupation of Pierre Chatenet is film director.", "film director"),
    # a yes/no reply keeps only its verdict
    ("Was Anne Brusletto Norwegian?", "Yes, she was a Norwegian skier.", "yes"),
    # nothing in the documents that the reply names: the reply stays as it was
    ("In what city was Anne Brusletto born?", "She was born in Lisbon.", "She was born in Lisbon."),
])
def test_shorten_keeps_the_document_span_the_reply_names(question: str, reply: str, expected: str) -> None:
    assert shorten(question, reply, DOCS) == expected


def test_answer_kinds_follow_the_wh_phrase() -> None:
    assert answer_kinds("In what city was X born?") == frozenset({"GPE", "LOC", "FAC"})
    assert answer_kinds("Where did X die?") == frozenset({"GPE", "LOC", "FAC"})
    assert "DATE" in answer_kinds("When was X founded?")
    assert "CARDINAL" in answer_kinds("How many albums did X release?")
    assert "PERSON" in answer_kinds("Who directed X?")
    assert answer_kinds("What is X's occupation?") is None
