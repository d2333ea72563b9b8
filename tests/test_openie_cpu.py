"""The CPU (spaCy) extractor: exact entities and triples on sentences whose parse is unambiguous."""

from __future__ import annotations

from graph_index.corpus import Passage


def extract(extractor, title: str, text: str):
    return next(iter(extractor.extract([Passage(id="x", title=title, text=text)])))


def test_subject_relation_object_with_prepositions(spacy_extractor) -> None:
    r = extract(spacy_extractor, "", "Marie Curie was born in Warsaw.")
    assert r.ok
    assert ("Marie Curie", "born in", "Warsaw") in r.triples
    assert {"Marie Curie", "Warsaw"} <= set(r.entities)


def test_pronoun_subject_resolves_to_title(spacy_extractor) -> None:
    r = extract(spacy_extractor, "Marie Curie", "She discovered polonium.")
    assert r.triples == [("Marie Curie", "discover", "polonium")]


def test_copula_conjuncts_give_one_fact_each_and_dates_are_never_subjects(spacy_extractor) -> None:
    r = extract(spacy_extractor, "George Rankin",
                "George James Rankin (1 May 1887 – 28 December 1957) was an Australian soldier and politician.")
    assert ("George James Rankin", "is", "soldier") in r.triples
    assert ("George James Rankin", "is", "politician") in r.triples
    assert not [t for t in r.triples if "1957" in t[0] or "1887" in t[0]]
    # numbers and dates are not entity nodes of their own
    assert not [e for e in r.entities if "1957" in e]


def test_compound_nouns_keep_their_compounds_but_not_adjectives(spacy_extractor) -> None:
    r = extract(spacy_extractor, "", "Anna Berg is a Swedish film director.")
    assert ("Anna Berg", "is", "film director") in r.triples


def test_passive_agent(spacy_extractor) -> None:
    r = extract(spacy_extractor, "", "The magazine was published by Walter Ruddiman.")
    assert ("magazine", "published by", "Walter Ruddiman") in r.triples


def test_extract_streams_in_order(spacy_extractor) -> None:
    ps = [Passage(id=str(i), title=t, text=f"{t} lives in Paris.") for i, t in enumerate(["Ann Lee", "Bob Stone"])]
    out = list(spacy_extractor.extract(ps))
    assert [r.triples[0][0] for r in out] == ["Ann Lee", "Bob Stone"]


def test_a_passage_over_spacys_limit_fails_alone_instead_of_sinking_the_build(spacy_extractor) -> None:
    """spaCy raises E088 inside its pipe for a text over ``nlp.max_length`` (possible only when
    corpus.max_passage_chars is raised past it): that passage gets a failed result, its neighbours are extracted."""
    from graph_index.corpus import Passage

    saved = spacy_extractor.nlp.max_length
    spacy_extractor.nlp.max_length = 60
    try:
        passages = [Passage("a", "Marie Curie", "Marie Curie was born in Warsaw."),
                    Passage("b", "Ledger", "The ledger lists every ship that entered the harbour in 1901 and 1902."),
                    Passage("c", "Chicago", "Chicago is a city in Illinois.")]
        results = list(spacy_extractor.extract(passages))
    finally:
        spacy_extractor.nlp.max_length = saved
    assert [r.ok for r in results] == [True, False, True]
    assert "over spaCy's max_length (60)" in results[1].error
    assert ("Marie Curie", "born in", "Warsaw") in results[0].triples
