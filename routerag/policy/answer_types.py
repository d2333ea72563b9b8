"""What kind of answer a question asks for, as the extractive reader checks it: a number (a quantity or a date) or
a name (who, where).

Why: the extractive reader, trained on few quantity questions, picks a span of the wrong type on forms it has not
seen: "How high is Mount Greywater?" read as "Oreland", "How many volumes does Piet Rademaker's history have?" as
"Historian" (0.74) though "a six-volume history" was in the same sentence. A span with no digit and no number word
cannot answer "how many", "how tall", "what year" or "when"; documents with no such span do not answer the
question, so the reader abstains. A measure is answered with its number as the documents write it, and its unit
unless it is a count ("2,114 metres", but "1,800" for "how many people"): a reader trained on names cuts numbers
badly ("800 people", "Oreland at 2,114 metres. Its summit ..."). And graph search brings an occupation's page
along with a person's ("Violinist"): its title is no answer to "Where was Teodor Brask born?", though the reader
gave it (0.84). A dimension ("how tall", "how long is", "the height of") needs a number written with its unit:
"1879" (the year the bridge was completed) does not answer "How long is the Saltvik Bridge?". Measured:
docs/research/2026-11-28-quantity-questions.md.
"""

from __future__ import annotations

import re
from typing import Literal

from spacy.lang.en.stop_words import STOP_WORDS

_WH_WORD = re.compile(r"\b(who|whom|whose|what|which|where|when|why|how)\b", re.IGNORECASE)
_QUANTITY_AFTER_HOW = frozenset("many much tall long old high big far large wide deep heavy".split())
_DATE_AFTER_WHAT = frozenset("year years decade century date".split())
_MONTH_WORDS = frozenset({"month"})
MONTH = re.compile(r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December)\b")
_NAME_THE = re.compile(r"^\W*(?:please\s*,?\s*)?name\s+(?:the\s+|a\s+|an\s+)?(?P<nouns>[\w-]+(?:\s+[\w-]+)?)",
                       re.IGNORECASE)
"""An imperative naming what it asks for: "Name the architect ...", "Name the first director ..."."""
PERSON_NOUNS = frozenset("""founder mayor architect designer director master wife husband son daughter painter builder
engineer owner captain composer author woman man person writer poet chairman chair president king queen leader
manager teacher student pupil mason sculptor curator librettist conductor singer actor actress inventor brother
sister father mother partner head principal headmaster editor publisher surgeon physician minister governor bishop
abbot priest merchant banker brewer keeper driver pilot chemist scientist dean rector warden successor predecessor
apprentice clerk secretary treasurer organiser organizer benefactor patron commander general officer explorer
navigator surveyor artist player coach""".split())
"""Nouns for a person: "the founder of X" describes someone (a bridge, :mod:`.decompose`), and "Name the architect of
X" asks for a name; "the population of X" does neither."""
_COUNT_NOUNS = frozenset("population attendance capacity number".split())
_MEASURE_NOUNS = frozenset("height length area elevation altitude depth width diameter distance weight age size"
                           .split())
_WHAT_IS_THE = re.compile(r"^(?:is|was|are|were|['’]s)\s+(?:the\s+)?(?:[\w-]+['’]s\s+)?(?P<noun>\w+)\b",
                          re.IGNORECASE)
""""What is the population of ...", "What was the height of ...", "Which is X's elevation": a quantity asked by
its noun after the copula (0.7% of RouteRAG's HotpotQA training questions, answered "165,521", "318.9 m")."""
NUMBER_WORDS = frozenset("""zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand
million billion trillion dozen dozens hundreds thousands millions billions twice third fourth fifth sixth seventh
eighth ninth tenth eleventh twelfth thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth
twentieth twenty-first""".split())
"""Words that state a number without digits ("three decades", "twice", "the early twentieth century"); not "first"
and "second": they are in too many sentences ("first described in 1834") to mark a span as a number."""


_DIGITS = r"\d(?:[\d,.]*\d)?"
_WORDS = "|".join(sorted(NUMBER_WORDS, key=len, reverse=True))
_NUMBER_PHRASE = re.compile(rf"(?:{_DIGITS}|\b(?:{_WORDS})\b)(?:[\s-]+(?:{_WORDS})\b)*(?:[\s-](?P<unit>(?-i:[a-z]+)))?",
                            re.IGNORECASE)
"""A number in digits or words, and the lowercase word after it: its unit, unless a stop word ("1902 and ...");
not a name ("2002 NBA")."""


AnswerType = Literal["count", "measure", "date", "month", "name"]
"""What a question asks for: a count ("how many / much", "what is the population of": the number alone, "1,800"), a
measure ("how tall / long / old / ...", "what is the height / area / age of": the number and its unit, "2,114
metres"), a date ("when", "what year / decade / century / date": a span holding a number, not cut), a month ("in
which month": a span holding a month's name) or a name ("who", "whom", "where", and "Name the architect of ...", an
imperative asking for a person)."""


_QUOTED = re.compile(r'"[^"]*"|“[^”]*”')


def _asking_word(question: str) -> tuple[str, str, str] | None:
    """The question's first asking word outside quotation marks (lowercase), the word after it and the text after it;
    None without one. A quoted title asks nothing ("The song "How Far I'll Go" was released on what date?" asks for
    a date, not a measure)."""
    match = _WH_WORD.search(_QUOTED.sub(lambda m: " " * len(m.group(0)), question))
    if match is None:
        return None
    rest = question[match.end():]
    after = rest.split()
    return match.group(1).lower(), after[0].lower().strip("?,.") if after else "", rest.lstrip()


def answer_type(question: str) -> AnswerType | None:
    """What the question's first asking word asks for (None: any span): the first one decides, so "Who was king when
    the bridge opened?" asks for a name. A question without one may be an imperative ("Name the architect of X.")."""
    asking = _asking_word(question)
    if asking is None:
        return _named_type(question)
    word, following, rest = asking
    if word in ("what", "which") and following in _MONTH_WORDS:
        return "month"
    if word == "how" and following in ("many", "much"):
        return "count"
    if word == "how" and following in _QUANTITY_AFTER_HOW:
        return "measure"
    if word == "when" or (word in ("what", "which") and following in _DATE_AFTER_WHAT):
        return "date"
    if word in ("what", "which") and (noun := _asked_quantity(rest)):
        return "count" if noun in _COUNT_NOUNS else "measure"
    return "name" if word in ("who", "whom", "where") else None


def _named_type(question: str) -> AnswerType | None:
    """What an imperative "Name the NOUN ..." asks for, by its first or second word ("Name the first director"): a
    person's name for a person noun ("Name the architect of X"), a date for "year" or "date"; None otherwise (any
    span)."""
    match = _NAME_THE.match(question)
    for noun in match.group("nouns").lower().split() if match else []:
        if noun in _DATE_AFTER_WHAT:
            return "date"
        if is_person_noun(noun):
            return "name"
    return None


def is_person_noun(word: str) -> bool:
    """Whether a lowercase noun, singular or plural, names a person (:data:`PERSON_NOUNS`)."""
    return word in PERSON_NOUNS or word.removesuffix("s") in PERSON_NOUNS


def month_names(text: str) -> list[tuple[int, int]]:
    """Where ``text`` names a month ("in October"): the character ranges a month question's span must hold."""
    return [(m.start(), m.end()) for m in MONTH.finditer(text)]


def _asked_quantity(after_what: str) -> str | None:
    """The quantity noun a "what is the NOUN of ..." question asks for (None: it asks no quantity)."""
    match = _WHAT_IS_THE.match(after_what)
    noun = match.group("noun").lower() if match else ""
    return noun if noun in _COUNT_NOUNS or noun in _MEASURE_NOUNS else None


NUMBER_TYPES: frozenset[AnswerType] = frozenset({"count", "measure", "date"})
"""The answer types whose span must hold a number."""
QUANTITY_TYPES: frozenset[AnswerType] = frozenset({"count", "measure"})
"""The answer types whose span is cut to its number phrase, and that a card may hold to their own abstention
threshold (``abstain_number_below``); not a date, which is read whole."""

_DIMENSION_AFTER_HOW = frozenset("tall high wide deep far heavy".split())
_DIMENSION_NOUNS = _MEASURE_NOUNS - {"age", "size"}
_HOW_LONG_IS = re.compile(r"\bhow\s+long\s+(?:is|are|was|were)\b", re.IGNORECASE)


def asks_dimension(question: str) -> bool:
    """Whether a measure question asks for a dimension ("how tall / high / wide / deep / far / heavy", "how long is
    X", "what is the height / length / area ... of"), whose answer is a number with its unit: a bare number ("1879")
    is a year, not a length. Not "how old", "how big", an age or a size, and not "how long did ..." (a duration,
    often written "from 1969 to 1974")."""
    asking = _asking_word(question)
    if asking is None or answer_type(question) != "measure":
        return False
    word, following, rest = asking
    if word == "how":
        return following in _DIMENSION_AFTER_HOW or bool(_HOW_LONG_IS.search(question))
    return _asked_quantity(rest) in _DIMENSION_NOUNS


def numbers_with_units(text: str) -> list[tuple[int, int]]:
    """Where ``text`` writes a number followed by its unit word ("2,114 metres", "eight feet"): the character range
    of the number, for the reader's spans that must hold one (:func:`asks_dimension`)."""
    return [(m.start(), m.start("unit") - 1) for m in _NUMBER_PHRASE.finditer(text) if _has_dimension_unit(m)]


_YEAR = re.compile(r"(?:1\d{3}|20\d{2})")


def is_bare_year(match: re.Match[str]) -> bool:
    """Whether a number phrase is a year: four digits from 1000 to 2099 not followed by a word it counts ("in
    1858", "1858 and"; but "1500 workers" counts). Why: a count question's span went to the year on the same page
    ("How many seats does the Royal Vell Theatre have?" answered "1858", the year it opened)."""
    return bool(_YEAR.fullmatch(match.group(0).split()[0])) and not _has_unit(match)


def counted_numbers(text: str) -> list[tuple[int, int]]:
    """Where ``text`` writes a number that can answer a count: every number phrase but a bare year
    (:func:`is_bare_year`), as character ranges."""
    return [(m.start(), m.end()) for m in _NUMBER_PHRASE.finditer(text) if not is_bare_year(m)]


def _has_unit(match: re.Match[str]) -> bool:
    word = match.group("unit")
    return bool(word) and word.lower() not in STOP_WORDS


DIMENSION_UNITS = frozenset("""m km cm mm metre metres meter meters kilometre kilometres kilometer kilometers
centimetre centimetres centimeter centimeters millimetre millimetres ft foot feet mi mile miles yard yards yd inch
inches in kg g t tonne tonnes ton tons kilogram kilograms gram grams pound pounds lb lbs ha hectare hectares acre
acres sq square cubic nautical fathom fathoms""".split())
"""Words that measure a length, a height, an area or a weight: a dimension's unit. "Seven arches" counts arches; it
is no length, though "arches" follows a number ("How long is the Old Mill Bridge?" was answered "seven arches")."""


def _has_dimension_unit(match: re.Match[str]) -> bool:
    word = match.group("unit")
    return bool(word) and word.lower().rstrip(".") in DIMENSION_UNITS


_NAME_PARTICLES = frozenset("de da di del della der den des du dos das van von ter ten la le al el bin ibn ben"
                            .split())
"""Lowercase words that belong to a name ("Charles de Gaulle", "Vincent van Gogh"), never trimmed off it."""


def person_name(question: str, span: str) -> str:
    """A "who" / "whom" question's answer without the lowercase words before the name ("astronomer Helga Arvidsen",
    "collector Augustin Merle" → the name): the reader's span often takes the role noun the text puts before a
    name, which no answer key holds. Other questions, and spans with no capitalised word after the lowercase
    ones, are returned as they are."""
    match = _WH_WORD.search(question)
    if match is None or match.group(1).lower() not in ("who", "whom"):
        return span
    words = span.split()
    lead = next((i for i, w in enumerate(words) if not w[:1].islower()), len(words))
    while lead > 0 and words[lead - 1] in _NAME_PARTICLES:  # "de Gaulle", "painter van Gogh" → "van Gogh"
        lead -= 1
    return " ".join(words[lead:]) if 0 < lead < len(words) and words[lead][:1].isalpha() else span


_NEXT_NAME_WORD = re.compile(r"(?: of)? (?P<word>[A-Z][\w-]*)(?![\w'’])")
_PREVIOUS_NAME_WORD = re.compile(r"(?<![\w'’])(?P<word>[A-Z][\w-]*) $")


def whole_name(text: str, start: int, end: int, question: str) -> tuple[int, int]:
    """Where in ``text`` the name that ``text[start:end]`` cuts short lies: the span grown over the capitalised
    words next to it on its line ("Brackwater Engine" → "Brackwater Engine Works", "Steam Packet" → "Vell Steam
    Packet Company"), over "of" only between two of them ("Academy of Aumery"), never over a stop word ("The") or
    punctuation, nor leftwards over a word of the question ("Governor Jeff Colyer" for "... had governor what?");
    unchanged unless the span starts (to grow left) or ends (to grow right) with a capitalised word, or
    when the grown name is the question's own words. Why: the span head, trained mostly on short names, stops a
    long name early; no answer key holds the cut ("Ysolde" for "Ysolde Carr")."""
    a, b = start, end
    while b < len(text) and (text[b].isalnum() or text[b] == "-"):  # a span ending inside a word
        b += 1
    words = text[a:b].split()
    if not words:
        return start, end
    grows_right = words[-1][:1].isupper()  # every word grown on is capitalised too
    while grows_right and (m := _NEXT_NAME_WORD.match(text, b)) and _joins(m.group("word")):
        b = m.end()
    asked = {w.lower() for w in re.findall(r"[\w-]+", question)}
    while (text[a:b][:1].isupper() and (m := _PREVIOUS_NAME_WORD.search(text, 0, a)) and _joins(m.group("word"))
           and m.group("word").lower() not in asked):  # not the role the question names ("governor")
        a = m.start()
    if (a, b) != (start, end) and text[a:b].lower() in question.lower():
        return start, end
    return a, b


def _joins(word: str) -> bool:
    """Whether a capitalised word can be part of a name (not "The", "In", "It": stop words)."""
    return word.lower() not in STOP_WORDS


_CLAUSE_BREAK = re.compile(r",\s+(?!(?:and|or)\s+[A-Z])(?=[a-z])|\s+(?:with|but|which|who|where|while)\s+(?=[a-z])")
"""Where a span runs on into a clause: a comma, or "with", "but", "which", "who", "where" or "while", before a
lowercase word; not ", and Name" (a list of names)."""


def before_clause(span: str) -> str:
    """A free span without the clause it runs on into ("Kim Jong-nam, who was assassinated in February 2017" → "Kim
    Jong-nam", "France, and was imprisoned in the Bastille" → "France"): the reader's span often takes the rest of
    the sentence, which no answer key holds. Not at " and " (it joins the nouns of one phrase: "film and television
    director"). Measured: docs/research/2026-11-28-quantity-questions.md (addendum of 2026-11-29)."""
    match = _CLAUSE_BREAK.search(span)
    return span[: match.start()].rstrip() if match and match.start() > 0 else span


_CAPITALISED = re.compile(r"(?<![\w'’-])[A-Z][\w'’-]*")


def proper_words(text: str) -> list[tuple[int, int]]:
    """Where ``text`` writes a capitalised word that is not a stop word ("Marrow", not "The" or "He"): what a proper
    name's span must hold."""
    return [(m.start(), m.end()) for m in _CAPITALISED.finditer(text) if _joins(m.group(0))]


NAME_JOINS = frozenset({"of", "and", "&", "de", "von", "van", "der", "du", "la", "le"})


def leading_name(span: str) -> str:
    """A name's span without the lowercase words it runs on into ("Odile Marrow and opened in 1858" → "Odile
    Marrow", "Brackwater Engine Works for the Fenwold Valley Railway" → "Brackwater Engine Works"): kept are the
    capitalised words it opens with, and "of" or "and" between two of them ("Academy of Aumery", "Aurel and Tomas
    Gansell"). Unchanged when it opens with a lowercase word or holds nothing after the name. Why: a "who" or
    "where" answer is a name, and the span head often runs past it to the end of the clause; no answer key holds
    the rest."""
    words = span.split()
    if not words or not words[0][:1].isupper():
        return span
    keep = 1
    while keep < len(words):
        word = words[keep]
        joins = word.lower() in NAME_JOINS and keep + 1 < len(words) and words[keep + 1][:1].isupper()
        if not (word[:1].isupper() or word[:1].isdigit() or joins):
            break
        keep += 2 if joins else 1
    return " ".join(words[:keep]) if keep < len(words) else span


def names_common_noun(title: str, text: str) -> bool:
    """Whether a page is about a common noun: its own text writes its title in lowercase only ("Violinist": "A
    violinist is a musician who ..."), never as a name."""
    title = " ".join(title.split())
    if not title or title.lower() == title or any(c.isdigit() for c in title):
        return False
    word = re.compile(rf"(?<!\w){re.escape(title)}(?!\w)", re.IGNORECASE)
    found = [m.group(0) for m in word.finditer(text)]
    return bool(found) and all(f == f.lower() for f in found)


def number_phrase(text: str, start: int, end: int, *, unit: bool = True, needs_unit: bool = False,
                  counted: bool = False) -> tuple[int, int] | None:
    """Where, in ``text``, the first number phrase overlapping ``text[start:end]`` lies, with its unit word when
    ``unit``: a measure's answer cut as the documents write it; None when the span holds no number. With
    ``needs_unit`` (a dimension, :func:`asks_dimension`), the first one written with a unit: a span "1879. It is 118
    metres" answers "118 metres"."""
    for match in _NUMBER_PHRASE.finditer(text):
        if needs_unit and not _has_dimension_unit(match) or counted and is_bare_year(match):
            continue
        if match.start() < end and match.end() > start:
            if match.group("unit") and (not unit or not _has_unit(match)):  # a stop word, or a unit not wanted
                return match.start(), match.start("unit") - 1
            return match.start(), match.end()
        if match.start() >= end:
            return None
    return None


def states_number(token: str) -> bool:
    """Whether a word piece holds a digit or is a number word (``##`` continuation marks ignored)."""
    piece = token.removeprefix("##").lower()
    return any(c.isdigit() for c in piece) or piece in NUMBER_WORDS
