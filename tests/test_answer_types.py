"""The reader's answer-type rule: which questions ask for a number, and how a measure's answer is cut."""

import pytest

from routerag.policy.answer_types import (NUMBER_TYPES, answer_type, asks_dimension, before_clause, counted_numbers,
                                         leading_name, month_names, names_common_noun, number_phrase,
                                         numbers_with_units, proper_words, states_number, whole_name)


@pytest.mark.parametrize("question", [
    "How many people does the Halvard Opera House seat?", "How tall is the Osterby Light?",
    "When did the Halvard Line get sold?", "In what year was Hyperwerks founded?",
    "Holm Jølsen established when?", "The breeds were developed during which century?",
    "Jean Vander Pyl voiced Rosie on the sitcom that premiered on which date?"])
def test_questions_asking_for_a_number_or_a_date(question: str) -> None:
    assert answer_type(question) in NUMBER_TYPES


@pytest.mark.parametrize("question", [
    "Who was king when the Halvard Opera House opened?", "Where was Teodor Brask born?",
    "What is the longest river of Oreland?", "How did the Halvard Line end?", "How often does the ferry sail?",
    "Which came first, the bridge or the railway?", "Name the composer of The Glass Lighthouse."])
def test_the_first_asking_word_decides_and_other_questions_are_free(question: str) -> None:
    assert answer_type(question) not in NUMBER_TYPES


def test_only_how_questions_are_measures_and_only_how_many_or_much_counts() -> None:
    assert answer_type("How long is the River Venn?") == "measure"
    assert answer_type("how many members does it have") == answer_type("How much did it cost?") == "count"
    assert answer_type("When did the Halvard Line get sold?") == answer_type("What year was it built?") == "date"


@pytest.mark.parametrize(("question", "asked"), [
    ("What is the population of Lerrick?", "count"), ("What is Lerrick's population?", "count"),
    ("What's the population of Sarnow?", "count"), ("What’s Sarnow’s population?", "count"),
    ("According to the 2010 census, what was the population of the village?", "count"),
    ("What was the population, in the 2011 census, of the district?", "count"),
    ("What is the capacity of the Halvard Opera House?", "count"),
    ("What is the height of the tower that resembles the Business Central Towers?", "measure"),
    ("What is the area of the constellation of which Epsilon Arietis is a part?", "measure"),
    ("What was the age of these mountains?", "measure"),
    ("What is the name of the river?", None), ("What is Teodor Brask's occupation?", None),
    ("Which is the longest river of Oreland?", None), ("What population lives there, the Sami?", None)])
def test_a_quantity_asked_by_its_noun(question: str, asked: str | None) -> None:
    """"What is the population / height / area of ..." asks for a number as "how many / how tall" does (RouteRAG's
    HotpotQA training questions have 72 in 10,000): a place's name is no answer to it."""
    assert answer_type(question) == asked


def test_a_count_is_cut_to_its_number_alone() -> None:
    text = "It seats 1,800 people and sold 150 million records."
    start = text.index("800")
    cut = number_phrase(text, start, start + 10, unit=False)
    assert cut is not None and text[cut[0]:cut[1]] == "1,800"
    start = text.index("150")
    cut = number_phrase(text, start, len(text), unit=False)
    assert cut is not None and text[cut[0]:cut[1]] == "150 million"


@pytest.mark.parametrize(("text", "span", "expected"), [
    ("It seats 1,800 people and is the home stage.", "800 people", "1,800 people"),  # a cut number is made whole
    ("Mount Greywater is the highest mountain of Oreland at 2,114 metres. Its summit hosts an observatory.",
     "Oreland at 2,114 metres. Its summit", "2,114 metres"),
    ("It opened in 1902 and was named after him.", "1902 and", "1902"),  # "and" is no unit
    ("He won the 2002 NBA title.", "2002 NBA", "2002"),  # a name is no unit
    ("Rademaker was a historian who wrote a six-volume history.", "historian who wrote a six-volume history",
     "six-volume"),
    ("Its main instrument is a 2.4-metre reflecting telescope.", "2.4-metre reflecting", "2.4-metre"),
    ("Twelve hundred copies were sold.", "Twelve hundred copies", "Twelve hundred copies")])
def test_a_measure_is_cut_to_its_number_and_unit(text: str, span: str, expected: str) -> None:
    start = text.index(span)
    cut = number_phrase(text, start, start + len(span))
    assert cut is not None and text[cut[0]:cut[1]] == expected


def test_a_span_without_a_number_has_no_number_phrase() -> None:
    text = "The keeper of the lighthouse was born in 1850."
    assert number_phrase(text, 0, len("The keeper")) is None


@pytest.mark.parametrize(("piece", "number"), [("1800", True), ("##00", True), ("2nd", True), ("twelve", True),
                                               ("twentieth", True), ("first", False), ("second", False),
                                               ("keeper", False), ("##s", False)])
def test_word_pieces_that_state_a_number(piece: str, number: bool) -> None:
    assert states_number(piece) is number


def test_who_and_where_questions_ask_for_a_name() -> None:
    for question in ["Where was Teodor Brask born?", "Who founded the Halvard Line?",
                     "Marisol Vantreigh was born where?", "To whom was the opera dedicated?"]:
        assert answer_type(question) == "name"
    assert answer_type("What is Teodor Brask's occupation?") is None
    assert answer_type("When was the bridge built?") == "date"


@pytest.mark.parametrize(("title", "text", "common"), [
    ("Violinist", "A violinist is a musician who plays the violin. Violinists play in orchestras.", True),
    ("Composer", "A composer is a person who writes music.", True),
    ("Lindqvist", "Lindqvist is a highland town of Oreland.", False),  # a name, written as one
    ("Kestrel Harbor", "The city of Kestrel Harbor lies on the coast.", False),
    ("Astronomer", "An astronomer studies stars. Astronomer Royal is a title.", False),  # written as a name too
    ("Opera", "Nothing here mentions it.", False),  # no evidence either way
    ("apple", "An apple is a fruit.", False), ("1994", "The year 1994 ...", False)])
def test_a_page_about_a_common_noun_writes_its_title_in_lowercase_only(title: str, text: str, common: bool) -> None:
    assert names_common_noun(title, text) is common


@pytest.mark.parametrize(("question", "dimension"), [
    ("How tall is Mount Feld?", True),
    ("How long is the Saltvik Bridge?", True),
    ("How far from Sydney is the town?", True),
    ("What was the length of the main span of the Venn Bridge?", True),
    ("What is the elevation of Mount Tessik?", True),
    ("How long did Edwin Meese remain in office?", False),  # a duration, often a range of years
    ("How old is the Halvard Opera House?", False),
    ("What is the age of the Tessaly Conservatory?", False),
    ("How many people does the opera house seat?", False),
    ("What is the population of Sarnow?", False),
])
def test_a_dimension_is_asked_by_how_tall_far_long_is_or_its_noun(question: str, dimension: bool) -> None:
    assert asks_dimension(question) is dimension


def test_a_dimension_is_a_number_written_with_its_unit() -> None:
    text = "The Saltvik Bridge was completed in 1879. It is 118 metres long, eight feet wide and 2,114 m high."
    found = [text[s:e] for s, e in numbers_with_units(text)]
    assert found == ["118", "eight", "2,114"]  # "1879." has no unit word: a year, not a length


def test_a_dimensions_unit_measures_something() -> None:
    """A number followed by what it counts ("seven arches") is no length."""
    text = "The Old Mill Bridge is a stone bridge of seven arches. It measures 164 metres."
    assert [text[s:e] for s, e in numbers_with_units(text)] == ["164"]
    s = text.index("seven")
    a, b = number_phrase(text, s, len(text), needs_unit=True)
    assert text[a:b] == "164 metres"


def test_a_count_is_never_a_bare_year() -> None:
    text = "The Royal Vell Theatre opened in 1858. With 420 seats, it had 1500 workers by 1901 and two stages."
    assert [text[s:e] for s, e in counted_numbers(text)] == ["420 seats", "1500 workers", "two stages"]
    start = text.index("1858")
    a, b = number_phrase(text, start, len(text), unit=False, counted=True)
    assert text[a:b] == "420"


@pytest.mark.parametrize(("text", "span", "question", "expected"), [
    ("It was built by the Brackwater Engine Works in 1860.", "Brackwater Engine", "Who built it?",
     "Brackwater Engine Works"),
    ("It was operated by the Vell Steam Packet Company.", "Steam Packet", "Who ran it?", "Vell Steam Packet Company"),
    ("It was founded by Ysolde Carr in 1820.", "Ysolde", "Who founded it?", "Ysolde Carr"),
    ("She studied at the Academy of Aumery in Brackwater.", "Academy", "Where?", "Academy of Aumery"),
    ("Designed by the architect Ivo Castellane, it opened.", "Castellane", "Who?", "Ivo Castellane"),
    ("The Kestrel was built in Tarsk. The yard closed.", "Tarsk", "Where?", "Tarsk"),  # not over a full stop
    ("Tarsk and Ossel", "Tarsk", "Where?", "Tarsk"),                                  # not over "and"
    ("Penrick's bridge", "Penrick", "Who?", "Penrick"),
    ("It was led by Governor Jeff Colyer.", "Jeff Colyer", "It had governor what?", "Jeff Colyer"),  # the role asked
    ("It stands by the Ossel Lighthouse.", "Ossel", "Where is the Ossel Lighthouse?", "Ossel"),  # the question's
    ("a stone bridge of seven arches", "stone bridge", "What?", "stone bridge"),   # no capitalised word at its ends
    ("the Brackwater Engine", "Brackwa", "Who?", "Brackwater Engine"),              # a span ending inside a word
])
def test_a_name_cut_short_is_grown_to_the_whole_name(text: str, span: str, question: str, expected: str) -> None:
    start = text.index(span)
    a, b = whole_name(text, start, start + len(span), question)
    assert text[a:b] == expected


@pytest.mark.parametrize(("span", "expected"), [
    ("Lucan Merrow, with a libretto by Sefton Ayre", "Lucan Merrow"),
    ("France, and was imprisoned in the Bastille", "France"),
    ("October 2011, she married cinematographer Michael Ballhaus", "October 2011"),
    ("Mary Stanley, daughter of Edward Stanley", "Mary Stanley"),
    ("Kim Jong-nam, who was assassinated in February 2017", "Kim Jong-nam"),
    ("Egypt with annual military assistance", "Egypt"),
    ("Paris, France", "Paris, France"),  # a capitalised word after the comma: part of the name
    ("February 2, 1939", "February 2, 1939"),
    ("Gillian Chung, Rachel Ngan, and Cecilia Cheung", "Gillian Chung, Rachel Ngan, and Cecilia Cheung"),
    ("film and television director", "film and television director"),  # "and" joins one phrase's nouns
])
def test_a_span_ends_before_the_clause_it_runs_on_into(span: str, expected: str) -> None:
    assert before_clause(span) == expected


@pytest.mark.parametrize(("question", "asked"), [
    ('The soundtrack with the song "How Far I\'ll Go" on it was released on what date?', "date"),
    ('"When My Blue Moon Turns to Gold Again" was recorded by which artist?', None),
    ("The novel is based on the series “Doctor Who”; when was it published?", "date"),
])
def test_a_quoted_title_does_not_ask(question: str, asked: str | None) -> None:
    assert answer_type(question) == asked


@pytest.mark.parametrize(("question", "asked"), [
    ("Name the architect of the Corvel Exchange.", "name"),  # an imperative asking for a person
    ("Please name the first director of the Corvel Exchange.", "name"),
    ("Name the year the Corvel Exchange opened.", "date"),
    ("Name the river that flows through Corvel.", None),  # a thing: any span
    ("In which month is the Corvel Fair held?", "month"),
    ("What month did the Corvel Exchange open?", "month"),
])
def test_an_imperative_and_a_month_ask_for_their_type(question: str, asked: str | None) -> None:
    assert answer_type(question) == asked


def test_a_month_questions_span_holds_a_month_and_a_names_a_capitalised_word() -> None:
    text = "The fair is held in October. He met Ilse Varga in Corvel."
    assert [text[a:b] for a, b in month_names(text)] == ["October"]
    assert [text[a:b] for a, b in proper_words(text)] == ["October", "Ilse", "Varga", "Corvel"]  # not "The", "He"


@pytest.mark.parametrize(("span", "expected"), [
    ("Ilse Varga and opened in 1858", "Ilse Varga"),
    ("Corvel Engine Works for the Tarn Valley Railway", "Corvel Engine Works"),
    ("Academy of Aumery", "Academy of Aumery"),  # "of" between two capitalised words
    ("Aurel and Tomas Gansell", "Aurel and Tomas Gansell"),
    ("the brothers Aurel and Tomas Gansell", "the brothers Aurel and Tomas Gansell"),  # opens lowercase: as it is
    ("Corvel", "Corvel"),
])
def test_a_proper_name_is_cut_to_the_name_it_opens_with(span: str, expected: str) -> None:
    assert leading_name(span) == expected
