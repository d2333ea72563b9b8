"""The pages a one-fact question is read on: those naming its subject (the reader card's ``subject_pages``)."""

from __future__ import annotations

import pytest

from routerag.policy.extractive import ExtractiveReader, shipped_reader_path
from routerag.policy.subjects import asks_of_a_named_subject, subject_names, subject_pages
from routerag.retrieval.types import RetrievedDoc

BRIDGES = [
    RetrievedDoc("p1", "Sable Bridge", "The Sable Bridge over the Tennet was designed by Halvard Penrick in 1861.", 1.0),
    RetrievedDoc("p2", "Old Sable Bridge", "The Old Sable Bridge is a stone footbridge of three arches, 40 metres "
                 "long, downstream of the newer crossing.", 0.9),
    RetrievedDoc("p3", "Halvard Penrick", "Halvard Penrick was an engineer born in Brackwater.", 0.8),
]


@pytest.mark.parametrize("question, names", [
    ("Who designed the Old Sable Bridge?", ("Old Sable Bridge",)),
    ("In what year was Kestrel II withdrawn from service?", ("Kestrel II",)),
    ("How many members did the Guild of Lampmakers have?", ("Guild of Lampmakers",)),
    ("Which company did Linnea Sorrel's son found?", ("Linnea Sorrel",)),  # a possessive ends the name
    ("the guild of lampwrights was founded by whom", ()),  # no proper noun: nothing to hold the pages to
])
def test_a_questions_subject_is_its_run_of_proper_nouns(question: str, names: tuple[str, ...]) -> None:
    assert subject_names(question) == names


@pytest.mark.parametrize("question, one_fact", [
    ("Who designed the Old Sable Bridge?", True),
    ("Was the Old Sable Bridge built before the Sable Bridge?", False),  # yes/no: its sides have their own rule
    ("Which is longer, the Old Sable Bridge or the Sable Bridge?", False),  # a choice
    ("In which town was the designer of the Sable Bridge born?", False),  # a bridge: the answer is a hop away
    ("who designed the bridge over the river", False),  # names nothing
])
def test_only_a_one_fact_question_about_a_named_thing_is_held_to_its_pages(question: str, one_fact: bool) -> None:
    assert asks_of_a_named_subject(question) is one_fact


def test_a_confusables_page_is_not_read_but_every_page_is_when_none_names_the_subject() -> None:
    assert [d.title for d in subject_pages("Who designed the Old Sable Bridge?", BRIDGES)] == ["Old Sable Bridge"]
    assert [d.title for d in subject_pages("Who designed the Sable Bridge?", BRIDGES)] == ["Sable Bridge",
                                                                                         "Old Sable Bridge"]
    assert subject_pages("Who designed the Tamm Viaduct?", BRIDGES) == BRIDGES  # named nowhere: read them all
    assert subject_pages("In which town was the designer of the Sable Bridge born?", BRIDGES) == BRIDGES


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_the_reader_does_not_answer_from_a_confusables_page_when_its_card_says_so() -> None:
    """The Old Sable Bridge's page does not say who designed it; the Sable Bridge's does. Without the rule the span
    head reads the confusable's designer; with it, the subject's own page is read, and it holds no designer."""
    reader = ExtractiveReader()
    question = "Who designed the Old Sable Bridge?"
    reader.card = reader.card.model_copy(update={"subject_pages": False})
    assert reader.read_sync(question, BRIDGES).answer == "Halvard Penrick"
    reader.card = reader.card.model_copy(update={"subject_pages": True})
    read = reader.read_sync(question, BRIDGES)
    assert read.answer is None  # its own page holds no designer: a refusal, not the confusable's
