"""Cloze-translated reader questions (training/cloze.py): each wh-phrase matches the kind of span it asks for, the
answer is cut from the question and found in its passage, and the rows are make-questions rows the reader's data
builder reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

spacy = pytest.importorskip("spacy")

from training.cloze import cloze_rows, main, translate  # noqa: E402
from training.reader_data import corpus_question_examples, read_question_file  # noqa: E402

PASSAGES = [{"title": "Osterby Light", "text": "The Osterby Light is a lighthouse at the entrance of Osterby harbour. "
             "It was first lit in 1866 and is 31 metres tall. Its last keeper, Nils Arvik, retired in 1978."},
            {"title": "Ida Somme", "text": "Ida Somme was a painter born in Lindmark. She is known for her seascapes "
             "of the Varn Strait. Her painting Winter Ferry hangs in the National Gallery of Hessel."}]


@pytest.fixture(scope="module")
def nlp():
    from routerag.policy.short_answer import SPACY_MODEL

    return spacy.load(SPACY_MODEL, disable=["lemmatizer"])


def _ask(nlp, text: str, span_text: str, title: str = "") -> str:
    sentence = next(iter(nlp(text).sents))
    ent = next(e for e in sentence.ents if e.text == span_text)
    return translate(sentence, ent, ent.label_, title)


def test_the_wh_phrase_asks_for_the_kind_of_span_it_cut(nlp) -> None:
    assert _ask(nlp, "The Osterby Light is 31 metres tall.", "31 metres") == "How tall the Osterby Light is?"
    assert _ask(nlp, "Ida Somme was born in Lindmark.", "Lindmark") == "Where Ida Somme was born?"
    assert _ask(nlp, "Ida Somme was born in Lindmark.", "Ida Somme") == "Who was born in Lindmark?"
    assert _ask(nlp, "It was first lit in 1866.", "1866", "Osterby Light").startswith("In what year Osterby Light")


def test_rows_hold_their_answer_in_the_passage_not_in_the_question(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES), encoding="utf-8")
    out = tmp_path / "cloze.jsonl"
    main([str(corpus), "--out", str(out), "--per-passage", "2"])
    rows = read_question_file(out)
    assert 2 <= len(rows) <= 4 and len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        answer, passage = row["answers"][0], row["supporting"][0]
        assert answer in passage["text"] and answer.lower() not in row["question"].lower()
        assert row["question"].endswith("?") and row["type"].startswith("cloze-")
    examples = corpus_question_examples(rows, "cloze")
    assert sum(ex.answer is not None for ex in examples) == len(rows)  # each is a span on its own passage


def test_the_same_seed_makes_the_same_questions() -> None:
    assert list(cloze_rows(PASSAGES, seed=3)) == list(cloze_rows(PASSAGES, seed=3))


def test_numeric_only_keeps_numbers_and_dates() -> None:
    from training.cloze import NUMERIC_LABELS

    rows = list(cloze_rows(PASSAGES, per_passage=3, labels=NUMERIC_LABELS))
    assert rows and {r["type"] for r in rows} <= {f"cloze-{label.lower()}" for label in NUMERIC_LABELS}
    assert all(any(ch.isdigit() for ch in r["answers"][0]) for r in rows)


def test_heads_cut_answers_to_a_head_noun_or_an_entity_without_the(nlp) -> None:
    from training.cloze import answer_head

    sentence = next(iter(nlp("Nils Arvik became the famous lighthouse keeper of the Osterby Light.").sents))
    chunk = next(c for c in sentence.noun_chunks if c.root.text == "keeper")
    assert answer_head(chunk, "NOUN") == "lighthouse keeper"  # the adjective and article go, the compound stays
    ent = next(e for e in sentence.ents if "Osterby" in e.text)
    assert answer_head(ent, ent.label_) == ent.text.removeprefix("the ")
    rows = list(cloze_rows(PASSAGES, per_passage=3, heads=True))
    assert rows and all(r["answers"][0] in r["supporting"][0]["text"] for r in rows)
    assert not any(r["answers"][0].lower().startswith("the ") for r in rows)
