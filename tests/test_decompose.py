"""Bridge questions read in two steps (issue #36): the description of the entity a question does not name is asked
first, and the question is then asked of the name the reader found (``decompose_bridges``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from routerag.config import LoopSettings
from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.decompose import decompose, is_bridged, names_bridge
from routerag.policy.extractive import ExtractiveReader, ReaderAnswer, shipped_reader_path
from routerag.policy.grounding import is_grounded
from routerag.retrieval.types import RetrievedDoc

from .helpers.scripted import PagesSearch, ScriptedGenerator

pytest.importorskip("spacy")

SPLIT = [
    ("In which town was the founder of the Orvell Tramway born?",
     "Who was the founder of the Orvell Tramway?", "In which town was {} born?"),
    ("Who was the mayor of the town where the Pellham Viaduct stands?",
     "What is the town where the Pellham Viaduct stands?", "Who was the mayor of {}?"),
    ("In what year was the railway chaired by Oswin Tarle established?",
     "What is the railway chaired by Oswin Tarle?", "In what year was {} established?"),
    ("Who founded the company that operated the Grisdale Colliery?",
     "What is the company that operated the Grisdale Colliery?", "Who founded {}?"),
    ("In what year did the first director of the Pellham Academy die?",
     "Who was the first director of the Pellham Academy?", "In what year did {} die?"),
]
NOT_SPLIT = [
    "Who was the founder of the Orvell Tramway?",  # one hop: it asks what the description is
    "In which town was Oswin Tarle born?",  # names its subject
    "What is the name of the river that flows through Pellham?",
    "What was the population of Pellham in 1901?",  # "population" is not a person noun
    "Which opened first, the Orvell Tramway or the Pellham Viaduct?",
    "The league includes the team that was formed in what year?",  # the asking word is inside the description
]


@pytest.mark.parametrize(("question", "inner", "template"), SPLIT)
def test_a_described_entity_is_split_off_as_a_question_of_its_own(question: str, inner: str, template: str) -> None:
    parts = decompose(question)
    assert parts is not None and (parts.inner, parts.template) == (inner, template)
    assert parts.outer("Oswin Tarle") == template.replace("{}", "Oswin Tarle")


@pytest.mark.parametrize("question", NOT_SPLIT)
def test_a_question_without_a_description_to_split_is_left_whole(question: str) -> None:
    assert decompose(question) is None


@pytest.mark.parametrize(("answer", "expected"), [
    ("Oswin Tarle", True), ("Grisdale Ore Company", True),
    ("poet and librettist", False),  # a role noun, not a name
    ("1872", False), ("", False),
    ("Orvell Tramway", False),  # the question's own words
    ("Portugal in ten of the eleven Olympiads it entered", False),  # a sentence fragment
])
def test_only_a_name_stands_in_for_the_description(answer: str, expected: bool) -> None:
    assert names_bridge(answer, "In which town was the founder of the Orvell Tramway born?") is expected


QUESTION = "In which town was the founder of the Orvell Tramway born?"
TRAMWAY = ("Orvell Tramway", "The Orvell Tramway opened in 1872. It was founded by Oswin Tarle, a brewer.")
TARLE = ("Oswin Tarle", "Oswin Tarle (1831-1899) was a brewer. He was born in Hessing and moved to Orvell in 1860.")


PAGES = {"Orvell Tramway": [TRAMWAY], "In which town was Oswin Tarle born?": [TARLE, TRAMWAY]}
SCRIPT = ["<search>[graph] Orvell Tramway</search>", "<answer>somewhere</answer>"]


def test_is_bridged_accepts_the_question_with_a_documents_name_in_place_of_its_description() -> None:
    docs = [RetrievedDoc("t", *TRAMWAY, 1.0)]
    assert is_bridged("In which town was Oswin Tarle born?", QUESTION, docs)
    assert is_grounded("In which town was Oswin Tarle born?", QUESTION, docs)
    assert not is_bridged("In which town was Idris Moll born?", QUESTION, docs)  # no document names him
    assert not is_grounded("In which town was Idris Moll born?", QUESTION, docs)
    assert not is_bridged("Where was Oswin Tarle born?", QUESTION, docs)  # not the question's own words around it


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_the_shipped_reader_answers_a_bridge_in_two_steps_and_the_trace_says_how() -> None:
    cfg = LoopConfig(extractive_reader=ExtractiveReader(), budget=2, k=2, decompose_bridges=True)
    search = PagesSearch(PAGES)
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(SCRIPT), search, cfg).run(QUESTION))
    assert traj.answer == "Hessing" and traj.searches == 2
    assert search.calls[-1] == ("In which town was Oswin Tarle born?", "graph", 2)  # the first search's mode
    hop = traj.steps[-1]
    assert (hop.by_loop, hop.query_source, hop.query_doc) == (True, "bridged_question", "id-Orvell Tramway")
    assert hop.asked == "Who was the founder of the Orvell Tramway?"
    off = asyncio.run(PolicyLoop(ScriptedGenerator(SCRIPT), PagesSearch(PAGES),
                                 replace(cfg, decompose_bridges=False)).run(QUESTION))
    assert off.searches == 1 and off.answer != "Hessing"  # read whole, the question gets the tramway's page only


class Reads:
    """A reader that answers each question from a table (None: abstains), recording what it was asked."""

    def __init__(self, answers: dict[str, str | None]) -> None:
        self.answers, self.asked = answers, []

    async def read(self, question: str, docs: list[RetrievedDoc]) -> ReaderAnswer:
        self.asked.append(question)
        answer = self.answers.get(question)
        return ReaderAnswer(answer, 0.5 if answer else 0.0)


@pytest.mark.parametrize("inner", [None, "brewer"])  # the first read abstains, or gives no name
def test_without_a_name_for_the_description_the_question_is_read_whole(inner: str | None) -> None:
    reader = Reads({"Who was the founder of the Orvell Tramway?": inner, QUESTION: "Oswin Tarle"})
    cfg = LoopConfig(extractive_reader=reader, budget=2, k=2, decompose_bridges=True)
    search = PagesSearch(PAGES)
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(SCRIPT), search, cfg).run(QUESTION))
    assert len(search.calls) == 1 and traj.answer == "Oswin Tarle"
    assert reader.asked == ["Who was the founder of the Orvell Tramway?", QUESTION]


def test_the_bridged_question_refuses_when_its_documents_do_not_say() -> None:
    """The second read is the bridged question's own: its abstention is the answer, not the whole question's read."""
    reader = Reads({"Who was the founder of the Orvell Tramway?": "Oswin Tarle", QUESTION: "Oswin Tarle"})
    cfg = LoopConfig(extractive_reader=reader, budget=2, k=2, decompose_bridges=True)
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(SCRIPT), PagesSearch(PAGES), cfg).run(QUESTION))
    assert traj.finish == "refused" and reader.asked[-1] == "In which town was Oswin Tarle born?"
    no_room = asyncio.run(PolicyLoop(ScriptedGenerator(SCRIPT), PagesSearch(PAGES), replace(cfg, budget=1))
                          .run(QUESTION))
    assert no_room.searches == 1 and no_room.answer == "Oswin Tarle"  # no search left: read whole


def test_the_setting_resolves_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from routerag.config import Settings

    monkeypatch.setenv("ROUTERAG_POLICY__DECOMPOSE_BRIDGES", "true")
    assert Settings().policy.decompose_bridges is True
    assert LoopSettings().resolve().decompose_bridges is False  # off unless a card or a setting turns it on


class CitingReads(Reads):
    """A :class:`Reads` that cites the first document it reads."""

    async def read(self, question: str, docs: list[RetrievedDoc]) -> ReaderAnswer:
        from routerag.policy.citations import Citation

        read = await super().read(question, docs)
        doc = docs[0]
        return ReaderAnswer(read.answer, read.score, Citation(doc.id, doc.title, doc.text) if read.answer else None)


def test_an_answer_read_off_a_page_that_does_not_name_the_bridge_falls_back_to_the_whole_question() -> None:
    """The bridged search found another man's page: its birthplace is no answer about the bridge entity."""
    moll = ("Idris Moll", "Idris Moll was a violinist. He was born in Varn.")
    pages = {"Orvell Tramway": [TRAMWAY], "In which town was Oswin Tarle born?": [moll]}
    reader = CitingReads({"Who was the founder of the Orvell Tramway?": "Oswin Tarle",
                          "In which town was Oswin Tarle born?": "Varn", QUESTION: "Orvell"})
    cfg = LoopConfig(extractive_reader=reader, budget=2, k=2, decompose_bridges=True)
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(SCRIPT), PagesSearch(pages), cfg).run(QUESTION))
    assert traj.searches == 2 and traj.answer == "Orvell"  # read whole, from the first search's documents
    assert reader.asked[-1] == QUESTION
    pages["In which town was Oswin Tarle born?"] = [TARLE]  # his own page: the bridged answer stands
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(SCRIPT), PagesSearch(pages), cfg).run(QUESTION))
    assert traj.answer == "Varn" and reader.asked[-1] == "In which town was Oswin Tarle born?"
