"""Warm-start labels from measured outcomes (issue #36, ``routerag plan-outcomes`` → ``train-sft --plans-from``): the
candidate plans, their outcomes with one read per set of documents, the label (the cheapest plan with the best
outcome) and the trajectory it becomes."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from routerag.cli import app
from routerag.config import Settings
from routerag.datasets import parse_item
from routerag.engine import Engine
from routerag.policy import parse_turn
from routerag.policy.types import GenerationRequest
from routerag.prompts import REFUSAL_INSTRUCTION, REFUSE_MARKER
from training.outcomes import (best_plan, candidate_plans, headroom, labelled_plans, labels, measure_all,
                               plan_means, read_outcomes)
from training.sft import build_example

from .helpers.scripted import PAGES, CharTokenizer, PageSearch, ScriptedGenerator
from .helpers.scripted import TWO_HOP_QUESTION as QUESTION



def reads_the_birthplace(request: GenerationRequest) -> str:
    """A reader that answers right only when the composer's page is among its documents."""
    return "<answer> Kestrel Harbor </answer>" if "born in Kestrel Harbor" in request.prompt_text \
        else "<answer> Opera </answer>"


def test_candidate_plans_are_one_search_per_mode_bridges_and_a_search_per_compared_entity() -> None:
    pytest.importorskip("spacy")
    one = candidate_plans("What is Edward Corser's occupation?")
    assert [p.name for p in one if p.kind == "single"] == ["passage", "graph", "hybrid"]
    assert len([p for p in one if p.kind == "bridge"]) == 9 and not [p for p in one if p.kind == "entities"]
    assert all(p.steps[1][1] is None for p in one if p.kind == "bridge")  # the bridge: taken from the documents
    two = candidate_plans("Were Scott Derrickson and Ed Wood of the same nationality?", second_modes=["passage"])
    assert [p.name for p in two if p.kind == "bridge"] == ["passage>passage", "graph>passage", "hybrid>passage"]
    ents = [p for p in two if p.kind == "entities"]
    assert [p.name for p in ents] == ["entities:passage", "entities:graph", "entities:hybrid"]
    assert ents[1].steps == (("graph", "Scott Derrickson"), ("graph", "Ed Wood"))


def test_measured_outcomes_read_each_set_of_documents_once_and_label_the_cheapest_best_plan(tmp_path: Path) -> None:
    pytest.importorskip("spacy")
    n_plans = len(candidate_plans(QUESTION))
    gen = ScriptedGenerator([reads_the_birthplace] * n_plans)
    search = PageSearch()
    engine = Engine("unused", Settings(), generator=gen, search=search,
                    retriever=SimpleNamespace(passages=[]))  # type: ignore[arg-type]
    item = parse_item({"id": "q1", "question": QUESTION, "answers": ["Kestrel Harbor"], "type": "bridge"})
    out = tmp_path / "outcomes.jsonl"
    rows = asyncio.run(measure_all(engine, [item], out, k=2))
    plans = {p["name"]: p for p in rows[0]["plans"]}
    # one search shows the opera's page and "Opera": the answer is not there; the bridge finds the composer's page
    assert plans["graph"]["em"] == 0.0 and plans["graph"]["answer_recall"] == 0.0
    assert plans["graph>passage"]["steps"] == [["graph", QUESTION], ["passage", "Marisol Vantreigh"]]
    assert plans["graph>passage"]["docs"] == [["id-The Glass Lighthouse", "id-Opera"],
                                              ["id-Marisol Vantreigh", "id-Kestrel Harbor"]]
    assert plans["graph>passage"]["em"] == 1.0 and plans["graph>passage"]["answer_recall"] == 1.0
    # every plan showed one of two sets of documents: the reader ran twice, not once per plan
    assert len(gen.requests) == 2
    label = labels(read_outcomes(out))[("q1", QUESTION)]
    assert label["name"] == "passage>passage"  # the best outcome at the cheapest modes
    table = {r["type"]: r for r in headroom(rows)}
    assert table["bridge"]["fixed_em"] == 0.0 and table["bridge"]["oracle_plan_em"] == 100.0
    assert table["bridge"]["labels"] == {"single": 0, "bridge": 1, "entities": 0}
    # a rerun resumes: nothing is measured again
    assert asyncio.run(measure_all(engine, [item], out, k=2)) == rows and len(gen.requests) == 2


def plan(name: str, kind: str, steps: list[list[str]], em: float, recall: float = 0.0) -> dict:
    return {"name": name, "kind": kind, "steps": steps, "docs": [["d"]] * len(steps), "em": em, "f1": em,
            "answer_recall": recall}


def test_ties_go_to_fewer_searches_then_to_what_works_for_the_type_then_to_cheaper_modes() -> None:
    q = [["passage", "q"]]
    row = {"id": "1", "question": "q", "type": "t", "plans": [
        plan("passage", "single", q, 1.0, 1.0), plan("graph", "single", [["graph", "q"]], 1.0, 1.0),
        plan("passage>passage", "bridge", q * 2, 1.0, 1.0)]}
    other = {"id": "2", "question": "r", "type": "t", "plans": [
        plan("passage", "single", q, 0.0), plan("graph", "single", [["graph", "q"]], 1.0, 1.0),
        plan("passage>passage", "bridge", q * 2, 0.0)]}
    means = plan_means([row, other])
    assert best_plan(row, means)["name"] == "graph"  # one search; graph does better over the type
    assert best_plan(row, plan_means([row]))["name"] == "passage"  # no difference over the type: the cheaper mode
    nothing = {"id": "3", "question": "s", "type": "t", "plans": [
        plan("passage", "single", q, 0.0), plan("graph", "single", [["graph", "q"]], 0.0),
        plan("passage>passage", "bridge", q * 2, 0.0)]}
    assert best_plan(nothing, plan_means([row, other, nothing]))["name"] == "graph"
    # a bridge plan whose top document named no new entity searched once: it is not a second kind of plan
    cut = {"id": "4", "question": "u", "type": "u", "plans": [
        plan("graph", "single", [["graph", "q"]], 1.0, 1.0), plan("passage>graph", "bridge", q, 1.0, 1.0)]}
    assert best_plan(cut, plan_means([cut]))["name"] == "graph"


def test_labelled_plans_become_trajectories_with_their_documents_and_unanswerable_ones_refuse() -> None:
    tok = CharTokenizer()
    tok.apply_chat_template = lambda m, **kw: f"<user>{m[0]['content']}</user>"  # type: ignore[attr-defined]
    passages = [SimpleNamespace(id=f"id-{t}", title=t, text=text) for t, text in PAGES.items()]
    rows = [{"id": "q1", "question": QUESTION, "type": "bridge", "plans": [
        plan("passage", "single", [["passage", QUESTION]], 0.0),
        {**plan("graph>passage", "bridge", [["graph", QUESTION], ["passage", "Marisol Vantreigh"]], 1.0, 1.0),
         "docs": [["id-The Glass Lighthouse", "id-Opera"], ["id-Marisol Vantreigh", "id-Kestrel Harbor"]]}]},
        {"id": "u1", "question": "How tall is Marisol Vantreigh?", "type": "unanswerable", "plans": [
            {**plan("graph", "single", [["graph", "How tall is Marisol Vantreigh?"]], 1.0),
             "docs": [["id-Marisol Vantreigh"]]}]}]
    items = [parse_item({"id": "q1", "question": QUESTION, "answers": ["Kestrel Harbor"]}),
             parse_item({"id": "u1", "question": "How tall is Marisol Vantreigh?", "answers": []}),
             parse_item({"id": "x", "question": "Never measured?", "answers": ["x"]})]
    plans = labelled_plans(items, rows, passages)
    assert [[(s.mode, s.query) for s in p] for p in plans] == [
        [("graph", QUESTION), ("passage", "Marisol Vantreigh")], [("graph", "How tall is Marisol Vantreigh?")], []]
    assert [d.title for d in plans[0][1].docs] == ["Marisol Vantreigh", "Kestrel Harbor"]
    rng = random.Random(0)
    ex = build_example(items[0], plans[0], tok, rng, template=REFUSAL_INSTRUCTION, refuse=True)
    policy = "".join(ch for ch, m in zip(tok.decode(ex.ids), ex.mask) if m)
    turns = policy.split("</search>")
    assert "<search>[graph] " + QUESTION in turns[0] and turns[1].endswith("<search>[passage] Marisol Vantreigh")
    assert policy.endswith("<answer> Kestrel Harbor </answer>") and parse_turn(turns[-1]).kind == "answer"
    refusal = build_example(items[1], plans[1], tok, rng, template=REFUSAL_INSTRUCTION, refuse=True)
    text = tok.decode(refusal.ids)
    assert text.endswith(f"<answer> {REFUSE_MARKER} </answer>") and "Marisol Vantreigh was born" in text
    assert build_example(items[1], plans[1], tok, rng) is None  # without refusals it has nothing to teach
    assert build_example(items[2], plans[2], tok, rng) is None


def test_train_sft_plans_from_builds_the_measured_trajectories(tmp_path: Path, monkeypatch, minilm,
                                                               spacy_extractor) -> None:
    """``routerag train-sft --plans-from`` over a real index: the labelled plans' documents read back by id."""
    from graph_index.store import IndexData

    from .helpers.server_helpers import build_small_index

    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    index = build_small_index(tmp_path / "idx", minilm, spacy_extractor)
    with IndexData(index) as data:
        by_title = {p.title: p.id for p in data.passages}
    qs = tmp_path / "qs.jsonl"
    qs.write_text("\n".join(json.dumps(q) for q in [
        {"id": "a", "question": "Where was Joran Veld born?", "answers": ["Tarsk"]},
        {"id": "b", "question": "Which waterway does Tarsk sit astride?", "answers": ["Ossel waterway"]},
    ]) + "\n")
    outcomes = tmp_path / "outcomes.jsonl"
    outcomes.write_text(json.dumps({"id": "a", "question": "Where was Joran Veld born?", "type": None, "plans": [
        {**plan("hybrid>graph", "bridge", [["hybrid", "Where was Joran Veld born?"], ["graph", "Tarsk"]], 1.0, 1.0),
         "docs": [[by_title["Joran Veld"]], [by_title["Tarsk"]]]}]}) + "\n")
    out = tmp_path / "sft"
    res = CliRunner().invoke(app, ["train-sft", "--index", str(index), "--questions", str(qs), "--model",
                                   "tiny-random", "--plans-from", str(outcomes), "--out", str(out), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "1 warm-start examples from 2 questions" in res.output and "1 measured plans" in res.output
    ex = [json.loads(x) for x in (out / "warm_start_examples.jsonl").read_text().splitlines()]
    assert ex[0]["searches"] == [["hybrid", "Where was Joran Veld born?"], ["graph", "Tarsk"]]
