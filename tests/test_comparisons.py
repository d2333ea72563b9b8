"""Comparison questions answered by each side's value (routerag.policy.comparisons), and the loop searching the side
whose value is missing."""

from __future__ import annotations

import asyncio

import pytest

from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.comparisons import compare, named_sides, parse_comparison, side_value, undecided_sides
from routerag.policy.extractive import ExtractiveReader, ReaderAnswer, shipped_reader_path
from routerag.retrieval.types import RetrievedDoc

from .helpers.scripted import PagesSearch, ScriptedGenerator


def _doc(title: str, text: str) -> RetrievedDoc:
    return RetrievedDoc(f"id-{title}", title, text, 1.0)


MILLS = [
    _doc("Quell Mill", "Quell Mill is a cotton mill on the Sallow. It was founded in 1791 by Orrin Quell. In 1850 it "
                       "held 400 looms, and its chimney is 41 metres tall."),
    _doc("Lantern Mill", "Lantern Mill opened in 1802 and was founded in 1804 by Harriet Dole. Its chimney rises "
                         "to 56 metres, and it held twelve hundred spindles."),
    _doc("Aldous Fenwright", "Aldous Fenwright (1781–1852) was a nurseryman born in Lindhollow. He founded the "
                             "Fenwright Nursery in 1808."),
    _doc("Serena Pellow", "Serena Pellow (1810–1889) was a seed merchant. She was born in the village of Lindhollow "
                          "on the Orris, and trained at the Carrow School."),
    _doc("Pell Haskard", "Pell Haskard was born in 1889 in Dunmarle."),
    _doc("Jory Haskard", "Jory Haskard was born in 1905 at Vessick."),
]


@pytest.mark.parametrize(("question", "answer"), [
    ("Was Quell Mill founded before Lantern Mill?", "yes"),  # 1791 against 1804, not Lantern Mill's 1802 opening
    ("Did Lantern Mill open earlier than Quell Mill?", "no"),
    ("Which was founded first, Lantern Mill or Quell Mill?", "Quell Mill"),
    ("Which has the taller chimney, Quell Mill or Lantern Mill?", "Lantern Mill"),
    ("Is Quell Mill's chimney taller than Lantern Mill's?", "no"),
    ("Was Aldous Fenwright born earlier than Serena Pellow?", "yes"),  # life dates: the birth, not 1852
    ("Did Serena Pellow outlive Aldous Fenwright?", "yes"),  # died 1889 against 1852
    ("Who lived longer, Aldous Fenwright or Serena Pellow?", "Serena Pellow"),  # 79 years against 71
    ("Were Aldous Fenwright and Serena Pellow born in the same town?", "yes"),  # Lindhollow, not the school
    ("Were Pell Haskard and Jory Haskard born in the same town?", "no"),
    ("Which of the two Haskards was born first, Pell or Jory?", "Pell Haskard"),  # the page's whole name
])
def test_a_comparison_is_decided_by_each_sides_value(question: str, answer: str) -> None:
    cmp = parse_comparison(question, question.split()[0] in ("Was", "Did", "Is", "Were"))
    assert cmp is not None
    assert compare(cmp, MILLS)[0] == answer


def test_what_is_not_a_comparison_or_has_no_value_is_left_to_the_heads() -> None:
    assert parse_comparison("Was Quell Mill founded by Orrin Quell?", True) is None  # no comparative word
    assert parse_comparison("Did the First Tazarine Expedition reach Ossory?", True) is None  # "First" is a name
    assert parse_comparison("Which is a film, A or B?", False) is None
    unknown = parse_comparison("Was Quell Mill founded before Ferrow Mill?", True)
    assert unknown is not None and compare(unknown, MILLS) is None  # Ferrow Mill has no page and no mention
    assert undecided_sides("Was Quell Mill founded before Ferrow Mill?", MILLS, True) == ["Ferrow Mill"]
    assert undecided_sides("Was Quell Mill founded before Ferrow Mill?", MILLS, False) == []  # not a choice


def test_the_names_a_yes_no_comparison_compares() -> None:
    assert named_sides("Is the clock tower of the Gullgate Museum taller than the Tidewater Light?") == [
        "Gullgate Museum", "Tidewater Light"]
    assert named_sides("Is the Orrin Halcyra's wingspan larger than the Varlo Merl 4's?") == [
        "Orrin Halcyra", "Varlo Merl 4"]
    assert named_sides("Were Benedek Sarrow and Rhoswen Tal both born on Vell Island?") is None  # three names


def test_a_sides_own_name_and_years_are_not_its_measure() -> None:
    merl = [_doc("Varlo Merl 4", "The Varlo Merl 4 of 1931 had a wingspan of 17.2 metres."),
            _doc("Orrin Halcyra", "The Orrin Halcyra had a wingspan of 31 metres.")]
    cmp = parse_comparison("Is the Varlo Merl 4's wingspan larger than the Orrin Halcyra's?", True)
    assert side_value("Varlo Merl 4", cmp, merl)[0] == 17.2  # not the 4 of its name, nor 1931
    assert compare(cmp, merl)[0] == "no"


class _ValuesOnlyReader:
    """A reader whose answer needs both sides' pages; it compares values, so the loop searches the missing side."""

    compare_values = True

    def __init__(self) -> None:
        self.reads = 0

    async def read(self, question: str, docs: list[RetrievedDoc]) -> ReaderAnswer:
        self.reads += 1
        cmp = parse_comparison(question, True)
        decided = compare(cmp, docs) if cmp else None
        return ReaderAnswer(decided[0] if decided else None, 1.0)


def test_the_loop_searches_the_side_of_a_yes_no_comparison_its_documents_give_no_value() -> None:
    question = "Was Quell Mill founded before Lantern Mill?"
    search = PagesSearch({d.title: [(d.title, d.text)] for d in MILLS[:2]})
    script = ["<search>[graph] Quell Mill</search>", "<answer>yes</answer>"]
    reader = _ValuesOnlyReader()
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, LoopConfig(
        extractive_reader=reader, budget=2, search_options=True)).run(question))
    assert search.calls[-1][:2] == ("Lantern Mill", "graph") and traj.answer == "yes"
    assert traj.steps[-1].query_source == "question_span" and traj.steps[-1].by_loop


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_the_reader_compares_values_when_its_card_says_so() -> None:
    reader = ExtractiveReader()
    question = "Was Aldous Fenwright born earlier than Serena Pellow?"
    reader.card = reader.card.model_copy(update={"compare_values": True})
    read = reader.read_sync(question, MILLS[2:4])
    assert (read.answer, read.kind) == ("yes", "compared") and read.citation.title == "Aldous Fenwright"
    reader.card = reader.card.model_copy(update={"compare_values": False})
    assert reader.read_sync(question, MILLS[2:4]).kind == "yes_no"  # the yes/no head, as before
