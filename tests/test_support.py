"""The unsupported-answer rule: a sentence states what a question asks, by lemma or shared stem; the reader abstains
on an unsure span from a sentence that does not (routerag.policy.support)."""

from __future__ import annotations

from routerag.policy.extractive import ExtractiveReader
from routerag.policy.support import relation_words, states_asked
from routerag.retrieval.types import RetrievedDoc

QUESTION = "When was Karin Vollan appointed to the University of Hessel faculty?"


def test_relation_words_leave_out_names_asking_words_and_the_answer() -> None:
    assert {lemma for lemma, _ in relation_words(QUESTION)} == {"appoint", "faculty"}
    assert relation_words("What is the name of Karin Vollan?") == set()  # nothing asked beyond the name
    assert relation_words("According to the documents, who is Karin Vollan?") == set()  # spaCy's lemma: "accord"
    assert {w for _, w in relation_words("Where did Eleanor of Brittany move?", named="Fontevrault")} == {"move"}


def test_a_sentence_states_the_asked_relation_by_lemma_or_stem() -> None:
    assert states_asked(QUESTION, "Karin Vollan was appointed professor in 1853.")
    assert not states_asked(QUESTION, "Karin Vollan joined the university in 1853.")
    assert states_asked("When did Eleanor of Brittany move?", "In 1290 she moved to Fontevrault Abbey.")
    assert states_asked("What did Chardon study?", "He was a student of law.")  # study / student: one stem
    assert states_asked("Who is Karin Vollan?", "Anything at all.")  # no relation word to look for


def test_the_reader_abstains_on_an_unsure_span_its_sentence_does_not_support() -> None:
    reader = ExtractiveReader()
    joined = [RetrievedDoc("k", "Karin Vollan", "Karin Vollan joined the University of Hessel in 1853.", 1.0)]
    appointed = [RetrievedDoc("k", "Karin Vollan", "Karin Vollan was appointed to the faculty in 1853.", 1.0)]
    reader.card = reader.card.model_copy(update={"abstain_unsupported_below": 1.0, "abstain_unstated_below": 0.0})
    assert reader.read_sync(QUESTION, joined).abstained
    assert reader.read_sync(QUESTION, appointed).answer == "1853"
    reader.card = reader.card.model_copy(update={"abstain_below": 0.0})  # abstaining off: the rule too
    assert reader.read_sync(QUESTION, joined).answer == "1853"
    reader.card = reader.card.model_copy(update={"abstain_below": 0.01, "abstain_unsupported_below": 0.0})
    assert reader.read_sync(QUESTION, joined).answer == "1853"  # 0: the rule off


def test_the_shared_pipeline_lemmatizes_only_when_asked() -> None:
    from routerag.policy.short_answer import _nlp, parse

    assert "lemmatizer" not in _nlp().pipe_names  # grounding's and the short answer's parses stay as fast as before
    assert [t.lemma_ for t in parse("She moved", lemmas=True)] == ["she", "move"]


def test_documents_state_the_asked_relation_when_any_of_them_holds_its_word() -> None:
    from routerag.policy.support import documents_state_asked

    other = RetrievedDoc("o", "Hessel", "Hessel is a town on the coast.", 1.0)
    stating = RetrievedDoc("v", "Karin Vollan", "Karin Vollan was appointed professor in 1853.", 1.0)
    assert documents_state_asked(QUESTION, [other, stating])
    assert not documents_state_asked(QUESTION, [other])
    assert not documents_state_asked("Who is Karin Vollan?", [stating])  # nothing asked: no evidence either way
    titled = RetrievedDoc("f", "Faculty", "The Faculty has ten members.", 1.0)  # its own title is a name there
    assert not documents_state_asked("Who teaches on the faculty of Hessel?", [titled])


def test_the_reader_abstains_on_an_unsure_span_only_where_no_document_states_the_asked_relation() -> None:
    reader = ExtractiveReader()
    joined = [RetrievedDoc("k", "Karin Vollan", "Karin Vollan joined the University of Hessel in 1853.", 1.0)]
    stating = joined + [RetrievedDoc("o", "Emil Vask", "Emil Vask was appointed rector in 1860.", 1.0)]
    unsure = {"abstain_below": 1e-9, "abstain_unsupported_below": 0.0, "abstain_unstated_below": 1.0,
              "subject_pages": False}  # every span counts as unsure; every page is read
    reader.card = reader.card.model_copy(update=unsure)
    assert reader.read_sync(QUESTION, joined).abstained  # no document says who was appointed when
    assert reader.read_sync(QUESTION, stating).answer in {"1853", "1860"}
    assert reader.read_sync("Who is Karin Vollan?", joined).abstained  # names no relation: nothing can state it
    reader.card = reader.card.model_copy(update={"subject_pages": True})  # another man's page is not read
    assert reader.read_sync(QUESTION, stating).abstained
    reader.card = reader.card.model_copy(update={"subject_pages": False})
    reader.card = reader.card.model_copy(update={"abstain_below": 0.0})  # abstaining off: this rule too
    assert reader.read_sync(QUESTION, joined).answer == "1853"
