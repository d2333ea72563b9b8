"""Grounded queries (issue #36): whatever a policy writes, the loop searches only the question, a span of it, or a
title, entity or noun chunk of the documents shown so far, and the trace says which."""

from __future__ import annotations

import asyncio

import pytest

from routerag.config import LOOP_DEFAULTS, PolicyConfig
from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.card import resolve_policy
from routerag.policy.grounding import candidates, ground, is_grounded, key, rewrite_search
from routerag.retrieval.types import RetrievalResult, RetrievedDoc
from routerag.vocabulary import MODES, Mode

from .helpers.scripted import CharTokenizer, ScriptedGenerator

pytest.importorskip("spacy")

QUESTION = "Who wrote the libretto of The Glass Lighthouse?"
PAGES = {
    "The Glass Lighthouse": "The Glass Lighthouse is an opera by Marisol Vantreigh with a libretto by Idris Calloway. "
                            "It premiered at the Harbor Opera House in 1931.",
    "Idris Calloway": "Idris Calloway was a poet and librettist who lived in the village of Marrow Point.",
    "Harbor Opera House": "The Harbor Opera House was paid for by the shipping magnate Oskar Brandt.",
}


class CorpusSearch:
    """A tiny lexical search over real-looking pages: the pages sharing the most words with the query first."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Mode, int]] = []

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        self.calls.append((query, mode, k))
        words = set(key(query).split())
        ranked = sorted(PAGES, key=lambda t: -len(words & set(key(f"{t} {PAGES[t]}").split())))
        docs = [RetrievedDoc(f"id-{t}", t, PAGES[t], 1.0) for t in ranked[:k]]
        return RetrievalResult(query, mode, docs, {"dense": 1.0})


JUNK = ["<think>search it</think><search>[graph] What is the answer?</search>",
        "<search>[passage] The answer is in Doc 1.</search>",
        "<search>[graph][passage] In what city is the libretto?</search>",
        "<search>[bogus] zxqv wrtl</search>",
        "<answer> Idris Calloway </answer>"]


def _run(turns, *, query="grounded", tokenizer=None, budget=4, question=QUESTION):
    gen = ScriptedGenerator(turns, tokenizer=tokenizer)
    search = CorpusSearch()
    loop = PolicyLoop(gen, search, LoopConfig(query=query, budget=budget, k=2))
    traj = asyncio.run(loop.run(question))
    return traj, gen, search


def test_adversarial_generations_search_only_allowed_queries() -> None:
    traj, _, search = _run(JUNK)
    assert len(search.calls) == 4 and traj.answer == "Idris Calloway"
    shown: list[RetrievedDoc] = []
    for (query, mode, _), res in zip(search.calls, traj.retrieved):
        assert mode in MODES
        allowed = {key(c.text) for c in candidates(QUESTION, shown)}
        assert key(query) in allowed, query
        shown += res.docs
    steps = [s for s in traj.steps if s.action == "search"]
    assert all(s.query_generated is not None for s in steps)  # every one of them was junk and replaced
    assert steps[0].query == QUESTION and steps[0].query_source == "question"
    assert steps[0].query_generated == "What is the answer?"


def test_the_context_shows_what_was_searched_and_tokens_stay_consistent() -> None:
    tok = CharTokenizer()
    traj, gen, _ = _run(JUNK[:1] + JUNK[-1:], tokenizer=tok)
    second = gen.requests[1]
    assert f"<search>[graph] {QUESTION}</search>" in second.prompt_text
    assert "What is the answer?" not in second.prompt_text
    assert tok.decode(second.prompt_ids) == second.prompt_text
    policy = [s for s in traj.segments if s.kind == "policy"][0]
    assert policy.logprobs is None and tok.decode(policy.token_ids) == policy.text


def test_grounded_queries_pass_unchanged_with_their_source() -> None:
    turns = ["<search>[graph] libretto of The Glass Lighthouse</search>",
             "<search>[passage] Idris Calloway</search>",
             "<search>[graph] Harbor Opera House</search>",
             "<answer> Idris Calloway </answer>"]
    traj, _, search = _run(turns, budget=3)
    assert [q for q, _, _ in search.calls] == ["libretto of The Glass Lighthouse", "Idris Calloway",
                                                "Harbor Opera House"]
    steps = [s for s in traj.steps if s.action == "search"]
    assert [s.query_generated for s in steps] == [None, None, None]
    assert steps[0].query_source == "question_span" and steps[0].query_doc is None
    assert steps[1].query_source in ("title", "entity") and steps[1].query_doc is not None


def test_a_rewritten_question_becomes_its_closest_span() -> None:
    doc = RetrievedDoc("1", "River Tamm", "The River Tamm flows through Oreland for 212 kilometres.", 1.0)
    g = ground("In what city is the River Tamm?", "How long is the River Tamm?", [doc])
    assert g.replaced and key(g.query) == key("River Tamm")
    assert is_grounded("River Tamm", "How long is the River Tamm?", [])  # a span of the question
    assert not is_grounded("Oreland", "How long is the River Tamm?", [])  # no document shown yet
    assert not is_grounded("In what year", "In what year was the River Tamm bridged by the Venn Company?", [])
    assert is_grounded("Oreland", "How long is the River Tamm?", [doc])


def test_a_choice_questions_options_are_allowed_queries() -> None:
    """What a comparison compares is a search target even when it is not a named entity ("God Can Do It", a film)."""
    question = "Which did earlier, God Can Do It or King Naresuan?"
    assert is_grounded("God Can Do It", question, []) and is_grounded("King Naresuan", question, [])
    assert ground("God Can Do It", question, []).source == "question_span"
    assert [c.text for c in candidates(question, [])][:3] == [question, "God Can Do It", "King Naresuan"]


def test_free_queries_are_searched_as_written() -> None:
    traj, _, search = _run(JUNK[:1] + JUNK[-1:], query="free")
    assert search.calls[0][0] == "What is the answer?"
    assert traj.steps[0].query_source is None


def test_rewrite_keeps_the_mode_tags() -> None:
    assert rewrite_search("<think>x</think><search>[graph][passage]junk</search>", "Q") == \
        "<think>x</think><search>[graph][passage] Q</search>"


def test_the_embedded_router_grounds_and_other_models_do_not_by_default() -> None:
    assert LOOP_DEFAULTS["query"] == "free"
    assert resolve_policy(PolicyConfig()).loop["query"] == "grounded"
    assert resolve_policy(PolicyConfig(query="free")).loop["query"] == "free"
    assert resolve_policy(PolicyConfig.model_validate({"generator": {"model": "smollm2"}})).loop["query"] == "free"
