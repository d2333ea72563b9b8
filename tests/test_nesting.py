"""Nested questions (issue #36): a question that describes what it asks about without naming it is read as a
bridge, and with ``graph_for_nested`` its first search goes to the graph, whatever mode the policy wrote."""

from __future__ import annotations

import asyncio

import pytest

from routerag.config import LoopSettings
from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.nesting import is_nested

from .helpers.scripted import CharTokenizer, ScriptedGenerator
from .test_grounding import CorpusSearch

pytest.importorskip("spacy")

NESTED = [
    "Who paid for the opera house where The Glass Lighthouse premiered?",
    "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?",
    "What is the name of the pop band founded by one of the stars of Aisa Yeh Jahaan?",
    "When did the one that Cry Over Me was written by rise?",
    "In what year was the historian that Maha Nawrahta called by appointed?",
]
NAMED = [
    "Who wrote the libretto of The Glass Lighthouse?",
    "In what city was Vera Dua born?",
    "What is Henry Caldwell Cook known as?",
    "Who was Robin Lynn Macy executed by?",  # a passive single-hop question: the participle hangs on a bare name
    "What is it that Pearl Jam comprised?",  # a cleft: "it" is the question's own asking word
    "Which band was formed first, The Exies or Circus Diablo?",
    "How long is the River Tamm?",
]


@pytest.mark.parametrize("question", NESTED)
def test_a_described_entity_is_nested(question: str) -> None:
    assert is_nested(question)


@pytest.mark.parametrize("question", NAMED)
def test_a_named_entity_is_not_nested(question: str) -> None:
    assert not is_nested(question)


BRIDGE = "Who paid for the opera house where The Glass Lighthouse premiered?"


def _run(turns: list[str], question: str, *, graph_for_nested: bool, tokenizer=None):
    gen = ScriptedGenerator(turns, tokenizer=tokenizer)
    search = CorpusSearch()
    cfg = LoopConfig(query="grounded", budget=2, k=2, graph_for_nested=graph_for_nested)
    traj = asyncio.run(PolicyLoop(gen, search, cfg).run(question))
    return traj, gen, search


def test_a_nested_questions_first_search_goes_to_the_graph_and_the_context_says_so() -> None:
    tok = CharTokenizer()
    turns = [f"<search>[passage] {BRIDGE}</search>", "<search>[passage] Harbor Opera House</search>",
             "<answer> Oskar Brandt </answer>"]
    traj, gen, search = _run(turns, BRIDGE, graph_for_nested=True, tokenizer=tok)
    assert [m for _, m, _ in search.calls] == ["graph", "passage"]  # only the first search is the loop's choice
    first, second = [s for s in traj.steps if s.action == "search"]
    assert (first.mode, first.mode_tags, first.mode_generated) == ("graph", ["graph"], "passage")
    assert (second.mode, second.mode_generated) == ("passage", None)
    prompt = gen.requests[1].prompt_text
    assert f"<search>[graph] {BRIDGE}</search>" in prompt and f"[passage] {BRIDGE}" not in prompt
    assert tok.decode(gen.requests[1].prompt_ids) == prompt


@pytest.mark.parametrize(("question", "on", "expected"), [
    (BRIDGE, False, "passage"),  # the setting off: the policy's mode
    ("Who wrote the libretto of The Glass Lighthouse?", True, "passage"),  # a named entity: the policy's mode
])
def test_the_policys_mode_stands_otherwise(question: str, on: bool, expected: str) -> None:
    traj, _, search = _run([f"<search>[passage] {question}</search>", "<answer> x </answer>"], question,
                           graph_for_nested=on)
    assert [m for _, m, _ in search.calls] == [expected]
    assert traj.steps[0].mode_generated is None


def test_the_setting_resolves_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from routerag.config import Settings

    monkeypatch.setenv("ROUTERAG_POLICY__GRAPH_FOR_NESTED", "true")
    assert Settings().policy.graph_for_nested is True
    assert LoopSettings().resolve().graph_for_nested is False  # off unless a card or a setting turns it on
