"""Unanswerable questions in the harness (refusal precision and recall, refusals against the evidence) and the
fixed two-search pipeline (issue #36)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from routerag.config import Settings
from routerag.datasets import DatasetError, load_questions, parse_item
from routerag.engine import Engine
from routerag.evaluation import summarize
from routerag.evaluation.records import score
from routerag.evaluation.strategies import run_strategy
from routerag.policy.types import SearchRecord, Summary
from routerag.prompts import REFUSAL_ANSWER
from routerag.retrieval.types import RetrievedDoc

from .helpers.scripted import PageSearch, ScriptedGenerator

DOC = RetrievedDoc("d1", "Idris Calloway", "Idris Calloway lived in Marrow Point.", 1.0)


def outcome(answer: str | None, *, refused: bool = False, docs=(DOC,)) -> Summary:
    return Summary(REFUSAL_ANSWER if refused else answer, "refused" if refused else "answer",
                   searches=[SearchRecord("graph", "q", 1.0, [d.title for d in docs])], documents=list(docs))


def test_an_explicitly_empty_answer_list_is_unanswerable(tmp_path: Path) -> None:
    item = parse_item({"question": "What is the height of Idris Calloway?", "answers": []})
    assert not item.answerable and item.meta["unanswerable"]
    with pytest.raises(DatasetError, match="no gold answer"):
        parse_item({"question": "Where?", "answer_typo": "x"})
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"question": "Where did Idris Calloway live?", "answers": ["Marrow Point"]}) + "\n"
                 + json.dumps({"question": "When did Idris Calloway die?", "answers": []}) + "\n")
    assert [q.answerable for q in load_questions(p)] == [True, False]


def test_refusal_precision_recall_and_refusals_against_the_evidence() -> None:
    live = parse_item({"id": "a1", "question": "Where did Idris Calloway live?", "answers": ["Marrow Point"]})
    live2 = parse_item({"id": "a2", "question": "Where did Idris Calloway live, again?", "answers": ["Marrow Point"]})
    none = parse_item({"id": "u1", "question": "When did Idris Calloway die?", "answers": []})
    none2 = parse_item({"id": "u2", "question": "How tall was Idris Calloway?", "answers": []})
    recs = [score(live, "learned", outcome(None, refused=True), 1.0),      # refused with the answer in hand
            score(live2, "learned", outcome("Marrow Point"), 1.0),
            score(none, "learned", outcome(None, refused=True), 1.0),      # right: a refusal
            score(none2, "learned", outcome("1.8 m"), 1.0)]                # wrong: a guess
    assert [r["em"] for r in recs] == [0.0, 1.0, 1.0, 0.0]
    assert recs[2]["answer_recall"] is None and recs[0]["answer_recall"] == 1.0
    s = summarize(recs)
    assert s["unanswerable"] == 2
    assert s["refusal_precision"] == 0.5 and s["refusal_recall"] == 0.5
    assert s["refused_with_answer"] == 0.5  # one of the two answerable questions
    plain = summarize([recs[1]])
    assert plain["refusal_precision"] is None and plain["refusal_recall"] is None




def test_two_search_follows_the_top_documents_new_entity() -> None:
    pytest.importorskip("spacy")
    gen = ScriptedGenerator(["<answer> Kestrel Harbor </answer>"])
    search = PageSearch(ms=2.0)
    engine = Engine("unused", Settings(retrieval={"mode": "graph"}), generator=gen, search=search,
                    retriever=SimpleNamespace(passages=[]))  # type: ignore[arg-type]
    question = "In which city was the composer of The Glass Lighthouse born?"
    summ = asyncio.run(run_strategy(engine, question, "two-search", k=2))
    assert search.calls == [(question, "graph", 2), ("Marisol Vantreigh", "graph", 4)]
    assert [s.query for s in summ.searches] == [question, "Marisol Vantreigh"]
    # the second search shows only documents not shown yet
    assert [d.title for d in summ.documents] == ["The Glass Lighthouse", "Opera", "Marisol Vantreigh",
                                                 "Kestrel Harbor"]
    assert summ.retrieval_ms == 4.0 and summ.answer == "Kestrel Harbor"
