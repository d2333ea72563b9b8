"""Comparison questions answered by comparing what the documents say of each side.

"Was Quell Mill founded before Lantern Mill?", "Which race covers a greater distance, the Coastal Cup or the
Halvessa Trophy?", "Were A and B born in the same town?": the answer is not a span, and neither the yes/no head
(one guess over all the windows) nor the span head's score of each option compares anything. Here each side's value
is read off its own page (a page titled as it, else the sentences that name it): in the sentence that shares the
most words with what the question asks (its words other than the sides and the comparison's), the year, number or
place nearest those words. The values then decide: the earlier or later, larger or smaller, the same or not, or
how long a life was (birth to death). Rules, not a model; where a side has no value the reader's heads decide as
before. Measured in docs/research/2026-12-02-comparisons-by-the-values-of-each-side.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..retrieval.types import RetrievedDoc
from .answer_types import MONTH
from .choices import ARTICLE, YEAR, asks_earlier, choice_options, is_yes_no, name_words, option_forms, undecided_options
from .citations import Citation, split_sentences

Measure = Literal["year", "number", "lifespan", "same"]

_MORE = {"more", "most", "greater", "greatest", "larger", "largest", "longer", "longest", "taller", "tallest",
         "higher", "highest", "bigger", "biggest", "wider", "widest", "deeper", "deepest", "heavier", "heaviest"}
_LESS = {"fewer", "fewest", "less", "least", "smaller", "smallest", "shorter", "shortest", "lower", "lowest",
         "narrower", "narrowest", "lighter", "lightest"}
_COMPARATIVES = _MORE | _LESS
_DIMENSION_WORDS = {"long": ("length", "long"), "tall": ("height", "tall", "high"), "high": ("height", "high", "tall"),
                    "wide": ("width", "wide"), "deep": ("depth", "deep"), "heavi": ("weight", "weigh")}
"""A comparative's own words, for finding the sentence that states the measure ("longer" → "length")."""
_LIFESPAN = re.compile(r"\blived longer\b|\blonger life\b|\blived to be older\b", re.IGNORECASE)
_OUTLIVE = re.compile(r"\boutliv(?:e|ed|es)\b|\bsurvived\b", re.IGNORECASE)
_SAME = re.compile(r"\bsame\b|\bshare[ds]?\b|\bboth\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*|\d[\d,]*(?:\.\d+)?")
_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w])")
_PLACE = re.compile(r"\b(?:in|at|on|near)\s+(?:the\s+)?(?:[a-z-]+\s+){0,3}?(?:of\s+)?"
                    r"([A-Z][\w'-]+(?:\s+[A-Z][\w'-]+)*)")
_LIFE = re.compile(r"\((?:born\s+|b\.\s*)?(1[0-9]{3}|20[0-9]{2})\s*[–—-]\s*(1[0-9]{3}|20[0-9]{2})\)")
_RELATING = frozenset("of by at in on from for to with who which that whose".split())
"""Words that make a side a description of something else ("the founder of X", "the mill designed by Y")."""
_SMALL_NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen " \
                 "sixteen seventeen eighteen nineteen twenty".split()
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(_SMALL_NUMBERS) if i > 1} | {
    "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "hundred": "100"}
"""Number words a count may be written in, with their values; not "one" ("one of the ..."), nor "zero"."""
_NUMBER_WORD = re.compile(r"\b(?:%s)\b" % "|".join(_NUMBER_WORDS), re.IGNORECASE)
_STOP = set("a an the of in on at to for by with and or but from as is are was were be been did do does had has have "
            "which who whom what whose when where how than then that this these those it its his her their first "
            "earlier earliest before older oldest sooner later latest last after younger youngest newer newest recent "
            "same share shared both two one tell me name could you whether".split()) | _COMPARATIVES


@dataclass(frozen=True, slots=True)
class Comparison:
    """What a comparison question compares: its two sides (in the question's order), the measure, whether the
    larger value wins (the later year, the longer life, the higher number), whether it asks yes or no (then: does
    the first side win, or for ``same``, are the two equal), and the stems of the words for what it asks."""

    sides: tuple[str, str]
    measure: Measure
    larger: bool
    yes_no: bool
    about: frozenset[str]
    context: frozenset[str] = frozenset()
    """The stems of all the question's words: which of several pages a short side names."""


_SAME_STEM = {"die": "die", "died": "die", "dies": "die", "death": "die", "dead": "die", "born": "born",
              "birth": "born", "birthplace": "born"}


def _stem(word: str) -> str:
    """A word's stem for matching what is asked to what a sentence says ("seated" and "seats", "died" and "death")."""
    w = word.lower().removesuffix("'s").strip("'")
    if w in _SAME_STEM:
        return _SAME_STEM[w]
    for suffix in ("ing", "ed", "es", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            break
    return w[:5]


def named_sides(question: str) -> list[str] | None:
    """The two names a yes/no comparison compares ("Was the Quell Mill founded before Lantern Mill?"): the runs of
    capitalised words after its opening verb, without a possessive's "'s"; None unless there are exactly two."""
    words = question.replace("?", " ").split()[1:]
    names, i = [], 0
    while i < len(words):
        n = name_words(words[i:]) if words[i][:1].isupper() or words[i][:1].isdigit() else 0
        if n:
            names.append(" ".join(words[i:i + n]).removesuffix("'s").removesuffix("'").strip(",;:"))
            i += n
        else:
            i += 1
    return names if len(names) == 2 else None


def _measure(question: str) -> tuple[Measure, bool] | None:
    """The measure and its direction, from the question's comparative words."""
    words = {w.lower() for w in _WORD.findall(question)}
    if _LIFESPAN.search(question):
        return "lifespan", True
    if _OUTLIVE.search(question):
        return "year", True  # outliving is dying later
    if _SAME.search(question):
        return "same", False
    earlier = asks_earlier(question)
    if earlier is not None:
        return "year", not earlier
    if words & _MORE and not words & _LESS:
        return "number", True
    if words & _LESS and not words & _MORE:
        return "number", False
    return None


def _without(text: str, sides: Sequence[str]) -> str:
    for side in sides:
        text = re.sub(re.escape(side), " ", text, flags=re.IGNORECASE)
    return text


def parse_comparison(question: str, yes_no: bool) -> Comparison | None:
    """The comparison a question asks for, or None: a choice between two options (:func:`.choices.choice_options`)
    or, for a yes/no question, two names, with a comparative word that says how to weigh them."""
    sides = named_sides(question) if yes_no else choice_options(question)
    if not sides or len(sides) != 2:
        return None
    measured = _measure(_without(question, sides))  # "the First Expedition" asks nothing about first
    if measured is None:
        return None
    side_words = {_stem(w) for s in sides for w in _WORD.findall(s)}
    about = {_stem(w) for w in _WORD.findall(question) if w.lower() not in _STOP and not w[0].isdigit()}
    for w in _WORD.findall(question.lower()):
        for base, extra in _DIMENSION_WORDS.items():
            if w in _COMPARATIVES and w.startswith(base):
                about |= {_stem(x) for x in extra}
    context = frozenset(_stem(w) for w in _WORD.findall(question))
    return Comparison((sides[0], sides[1]), measured[0], measured[1], yes_no, frozenset(about - side_words), context)


def _title_words(doc: RetrievedDoc) -> set[str]:
    return set((doc.title or "").lower().replace(",", " ").split())


def own_pages(side: str, docs: Sequence[RetrievedDoc], context: frozenset[str]) -> list[RetrievedDoc]:
    """A side's own pages: titled as it, else with all its words in the title ("Pell" for "Pell Haskard"), those
    sharing most words with the question first ("Which Cobb brother ..., Edric or Alwin?": Edric Cobb)."""
    forms = [ARTICLE.sub("", " ".join(f.lower().split())) for f in option_forms(side)]
    exact = [d for d in docs if ARTICLE.sub("", " ".join((d.title or "").lower().split())) in forms]
    if exact:
        return exact
    words = set(forms[0].split())
    shared = {d.id: len({_stem(w) for w in _title_words(d)} & context)
              for d in docs if words and words <= _title_words(d)}
    best = max(shared.values(), default=0)
    return [d for d in docs if d.id in shared and shared[d.id] == best]


def side_sentences(side: str, docs: Sequence[RetrievedDoc],
                   context: frozenset[str] = frozenset()) -> tuple[list[tuple[RetrievedDoc, str]], str]:
    """Where a side's value is read, and the side's name: the sentences of its own pages (:func:`own_pages`; the
    name: the first one's title), else every sentence that names it; a side described around a name ("his
    daughter Ada", "the aviators Marrowby") that neither finds is looked up by its last name-like words."""
    names = [side]
    words = side.split()
    tail = len(words) - next((i for i in range(len(words) - 1, -1, -1) if not words[i][:1].isupper()), -1) - 1
    described = words[:len(words) - tail]  # "the founder of Quell Mill" is not Quell Mill
    if 0 < tail < len(words) and not any(w.lower() in _RELATING or w.lower().endswith("ed") for w in described):
        names.append(" ".join(words[len(words) - tail:]))
    for name in names:
        own = own_pages(name, docs, context)
        if own:
            return [(d, s) for d in own for s in split_sentences(d.text)], own[0].title or name
        forms = [f.lower() for f in option_forms(name)]
        mentions = [(d, s) for d in docs for s in split_sentences(d.text) if any(f in s.lower() for f in forms)]
        if mentions:
            return mentions, side
    return [], side


def _nearest(sentence: str, about: frozenset[str], pattern: re.Pattern[str]) -> str | None:
    """The match of ``pattern`` in ``sentence`` nearest a word for what is asked (the first when none is there)."""
    found = list(pattern.finditer(sentence))
    if not found:
        return None
    anchors = [m.start() for m in _WORD.finditer(sentence) if _stem(m.group()) in about]
    if not anchors:
        return found[0].group(1)
    return min(found, key=lambda m: min(abs(m.start() - a) for a in anchors)).group(1)


def _masked(sentence: str, side: str, years: bool) -> str:
    """The sentence with the side's own name (and, for a count or measure, every year) blanked, positions kept:
    "Merl 4" is not the Merl 4's wingspan, nor 1931 its length."""
    for form in sorted(option_forms(side), key=len, reverse=True):
        sentence = re.sub(re.escape(form), lambda m: " " * len(m.group()), sentence, flags=re.IGNORECASE)
    return YEAR.sub(lambda m: " " * len(m.group()), sentence) if years else sentence


def _value(sentences: list[tuple[RetrievedDoc, str]], about: frozenset[str], pattern: re.Pattern[str], side: str,
           years: bool = False) -> tuple[str, Citation] | None:
    """The value nearest what is asked in the sentence with a value that shares the most words with it (the first
    such on a tie), cited with that sentence as written."""
    held = [(d, s, m) for d, s in sentences if pattern.search(m := _masked(s, side, years))]
    if not held:
        return None
    doc, sentence, masked = max(held, key=lambda dsm: len({_stem(w) for w in _WORD.findall(dsm[2])} & about))
    value = _nearest(masked, about, pattern)
    return (value, Citation(doc.id, doc.title, sentence)) if value else None


def _life_years(sentences: list[tuple[RetrievedDoc, str]]) -> tuple[str, str, Citation] | None:
    """A page's life dates, "(1781–1852)": the first bracketed range of its sentences."""
    for doc, sentence in sentences:
        m = _LIFE.search(sentence)
        if m:
            return m.group(1), m.group(2), Citation(doc.id, doc.title, sentence)
    return None


def _year(sentences: list[tuple[RetrievedDoc, str]], about: frozenset[str], side: str) -> tuple[str, Citation] | None:
    """The year for what is asked: a birth or death from life dates when they are what is asked, else the year
    nearest the question's words in the sentence that shares most of them."""
    life = _life_years(sentences) if about & {"born", "die", "outli"} else None
    if life is not None:
        return (life[0] if "born" in about else life[1]), life[2]
    return _value(sentences, about, YEAR, side)


def side_value(side: str, cmp: Comparison, docs: Sequence[RetrievedDoc],
               ) -> tuple[float | str, Citation, str] | None:
    """A side's value for the comparison, the sentence it was read from, and the side's name (its page's title when
    it has one); None when its pages do not give one."""
    sentences, name = side_sentences(side, docs, cmp.context)
    if cmp.measure == "lifespan":
        born, died = _year(sentences, frozenset({"born"}), side), _year(sentences, frozenset({"die"}), side)
        if born is None or died is None or born[0] == died[0]:
            return None
        return float(died[0]) - float(born[0]), died[1], name
    if cmp.measure == "same":
        place = _value(sentences, cmp.about, _PLACE, side)
        return (place[0], place[1], name) if place and not MONTH.fullmatch(place[0]) else None
    if cmp.measure == "year":
        year = _year(sentences, cmp.about, side)
        return (float(year[0]), year[1], name) if year else None
    worded = [(d, _NUMBER_WORD.sub(lambda m: _NUMBER_WORDS[m.group().lower()], s)) for d, s in sentences]
    number = _value(worded, cmp.about, _NUMBER, side, years=True)  # a year is not a count or a measure
    return (float(number[0].replace(",", "")), number[1], name) if number else None


def compare(cmp: Comparison, docs: Sequence[RetrievedDoc]) -> tuple[str, Citation] | None:
    """The answer the two values give (an option, or "yes"/"no"), with the winning side's sentence; None when a side
    has no value or the values tie (for a yes/no "same", a tie is the answer)."""
    values = [side_value(s, cmp, docs) for s in cmp.sides]
    if values[0] is None or values[1] is None:
        return None
    (a, cite_a, name_a), (b, cite_b, name_b) = values[0], values[1]
    if cmp.measure == "same":
        same = str(a).lower() == str(b).lower()
        return ("yes" if same else "no", cite_a) if cmp.yes_no else None
    if a == b:
        return None
    first_wins = (a > b) == cmp.larger
    if cmp.yes_no:
        return ("yes" if first_wins else "no", cite_a if first_wins else cite_b)
    return (name_a, cite_a) if first_wins else (name_b, cite_b)


def unvalued_sides(cmp: Comparison, docs: Sequence[RetrievedDoc]) -> list[str]:
    """The sides the documents give no value for, or the same value as the other (a year read off one sentence that
    names both is often one event's): what the loop searches before the reader reads."""
    values = [side_value(s, cmp, docs) for s in cmp.sides]
    if cmp.measure != "same" and values[0] and values[1] and values[0][0] == values[1][0]:
        return list(cmp.sides)
    return [s for s, v in zip(cmp.sides, values) if v is None]


def undecided_sides(question: str, docs: Sequence[RetrievedDoc], compare_values: bool) -> list[str]:
    """What the loop's ``search_options`` searches: with ``compare_values`` (the reader card's), the sides of a
    comparison, choice or yes/no, that the documents give no value for; else, or for a choice that is not a
    comparison, the options the documents leave undecided (:func:`.choices.undecided_options`)."""
    cmp = parse_comparison(question, is_yes_no(question)) if compare_values else None
    return unvalued_sides(cmp, docs) if cmp is not None else undecided_options(question, docs)
