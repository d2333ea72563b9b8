"""``routerag make-questions`` on the sample corpus: questions of every type from the index's own facts, answers in
their gold passages and not in the question, no near-duplicates, readable by the harness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graph_index.builder import Components, build_index
from routerag.cli import app
from routerag.config import Settings
from routerag.datasets import load_questions
from routerag.metrics import normalize_answer
from training.questions import Descriptions, Fact, key, named_alone, past, phrasings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, minilm, spacy_extractor) -> Path:
    out = tmp_path_factory.mktemp("sample") / "idx"
    cfg = Settings(cache_dir=out.parent / "cache")
    build_index([ROOT / "routerag" / "samples" / "corpus.jsonl"], out, cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return out


def test_questions_from_the_sample_index(sample_index: Path, tmp_path: Path) -> None:
    out = tmp_path / "new folder" / "q.jsonl"  # made for the user, before the work
    r = CliRunner().invoke(app, ["make-questions", str(sample_index), "--out", str(out), "--per-type", "40"])
    assert r.exit_code == 0, r.output
    counts = json.loads(r.output)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert counts["total"] == len(rows) and counts["single-hop"] >= 20 and counts["unanswerable"] >= 5
    assert counts["bridge"] >= 1
    seen = set()
    for row in rows:
        words = frozenset(normalize_answer(row["question"]).split())
        assert words not in seen, row["question"]
        seen.add(words)
        gold = " ".join(normalize_answer(f"{p['title']} {p['text']}") for p in row["supporting"])
        if row["type"] == "unanswerable":
            assert row["answers"] == [] and row["supporting"]
            continue
        assert any(f" {normalize_answer(a)} " in f" {gold} " for a in row["answers"]), row
        assert not any(f" {normalize_answer(a)} " in f" {normalize_answer(row['question'])} "
                       for a in row["answers"]), row
    bridges = [r for r in rows if r["type"] == "bridge"]
    assert all(normalize_answer(r["bridge"]) not in normalize_answer(r["question"]) for r in bridges)
    assert len(bridges[0]["supporting"]) == 2
    assert all(normalize_answer(r["supporting"][-1]["title"]) == normalize_answer(r["bridge"]) for r in bridges)
    items = load_questions(out)  # the harness reads them, unanswerable ones included
    assert sum(not it.answerable for it in items) == counts["unanswerable"]
    assert {it.meta["type"] for it in items} >= {"single-hop", "bridge", "unanswerable"}


def test_a_draw_beside_a_held_out_one_repeats_none_of_its_questions_or_facts(sample_index: Path,
                                                                           tmp_path: Path) -> None:
    """``--exclude``: two seeds over one corpus can draw the same question (5 of a 2Wiki draw's 347 were in another
    seed's 100); a training draw made with ``--exclude HELD_OUT`` shares no question and no fact with it."""
    held, train = tmp_path / "held.jsonl", tmp_path / "train.jsonl"
    run = CliRunner().invoke
    assert run(app, ["make-questions", str(sample_index), "--out", str(held), "--per-type", "15"]).exit_code == 0
    r = run(app, ["make-questions", str(sample_index), "--out", str(train), "--per-type", "40", "--seed", "1",
                  "--exclude", str(held)])
    assert r.exit_code == 0, r.output

    def facts(path: Path) -> set:
        return {(frozenset(normalize_answer(g.title) for g in it.supporting), frozenset(map(normalize_answer,
                it.answers))) for it in load_questions(path) if it.answers}

    held_items, train_items = load_questions(held), load_questions(train)
    assert train_items and not {it.question for it in held_items} & {it.question for it in train_items}
    assert not facts(held) & facts(train)
    again = run(app, ["make-questions", str(sample_index), "--out", str(tmp_path / "t2.jsonl"), "--per-type", "40",
                      "--seed", "1"])
    assert {it.question for it in held_items} & {it.question for it in load_questions(tmp_path / "t2.jsonl")}, \
        again.output  # without --exclude the two draws do overlap here, so the test has teeth
    bad = run(app, ["make-questions", str(sample_index), "--out", str(tmp_path / "t3.jsonl"),
                    "--exclude", str(tmp_path / "missing.jsonl")])
    assert bad.exit_code != 0 and "missing.jsonl" in bad.output and not (tmp_path / "t3.jsonl").exists()


def test_phrasings_vary_per_relation() -> None:
    for rel, answer in (("born in", "Kestrel Harbor"), ("premier in", "1994"), ("teach at", "University of Sarnow"),
                        ("founded in", "1873"), ("is", "composer")):
        forms = phrasings("Marisol Vantreigh", rel, answer)
        assert len(set(forms)) >= 3, rel
    assert [past(v) for v in ("write", "premiere", "study", "direct", "found")] == \
        ["wrote", "premiered", "studied", "directed", "founded"]  # to found: founded
    assert [past(v) for v in ("runs", "includes", "hosted", "was born")] == ["ran", "included", "hosted", "was born"]


def test_a_bridge_is_described_by_a_fact_that_picks_it_out_alone() -> None:
    titles = frozenset(key(t) for t in ("Tessaly Conservatory", "Marisol Vantreigh", "Teodor Brask", "William"))
    assert named_alone("Tessaly Conservatory", titles) and named_alone("Kestrel Harbor", titles)
    assert not named_alone("Henry", titles) and not named_alone("John I", titles)  # a lone first name, a regnal one
    facts = [Fact("Marisol Vantreigh", "study at", "Tessaly Conservatory", 0),
             Fact("Teodor Brask", "study at", "Tessaly Conservatory", 1),
             Fact("Teodor Brask", "study at", "Lindqvist Academy", 1),
             Fact("Anselm Halvard", "die in", "1681", 2), Fact("Ilse Marrow", "die in", "1681", 3),
             Fact("Ada Fennimore", "found", "Venn Bridge Society", 4)]
    d = Descriptions.of(facts, titles)
    assert d.picks_out_one(facts[0], "Tessaly Conservatory")  # Marisol studied at one place
    assert not d.picks_out_one(facts[1], "Tessaly Conservatory")  # Teodor studied at two
    assert not d.picks_out_one(facts[0], "Marisol Vantreigh")  # two people studied at the conservatory
    assert not d.picks_out_one(facts[3], "Anselm Halvard")  # a year picks out nobody
    assert d.picks_out_one(facts[5], "Ada Fennimore")  # the society's only founder
    assert not d.picks_out_one(Fact("Ada Fennimore", "marry", "Henry", 5), "Henry")  # which Henry?
