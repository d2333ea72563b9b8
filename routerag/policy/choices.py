"""Choice questions: the two options a question asks to choose between ("Which opened first, the Railway or the
Light?"), and what dates them in the documents.

Their answer is a span of the question, which the extractive reader's free spans rule out (a span made only of the
question's tokens is never the answer); :class:`~routerag.policy.extractive.ExtractiveReader` answers them with an
option instead, the loop's ``search_options`` searches the options the documents leave undecided, and grounding
allows the options as queries. Rules, not a model: measured in docs/research/2026-11-28-choice-questions.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..retrieval.types import RetrievedDoc
from .citations import Citation, split_sentences

_AUXILIARIES = frozenset("is are was were am do does did can could has have had will would should shall may might "
                         "must".split())
_ASKED_AFTER_STATEMENT = re.compile(r"[.!?]\s+(%s)\b" % "|".join(w.capitalize() for w in sorted(_AUXILIARIES)))
"""A capitalised auxiliary verb opening a sentence after another: the question asked after a statement."""

_WHO_OR_WHAT = re.compile(r"^who or what\b", re.IGNORECASE)
_OF_TWO = re.compile(r"^(?:of|between)\s+(.+?)\s+and\s+(.+?),\s*(?:which|who|what)\b", re.IGNORECASE)
ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)
_ASKS_WHICH = re.compile(r"\b(?:which|who|whom|what)\b", re.IGNORECASE)
"""A choice asks which before it names the options; an ``or`` inside a statement ("..., cardboard or wood plates
are coated ...") follows no such word."""
_CLAUSE_AFTER = re.compile(r",\s+(?=[a-z])")
"""Where a second option ends and the question goes on: "..., Lee Ranaldo or Ozzy Osbourne, has had ...?" (a name's
own comma is followed by a capital or a digit: "Peter, Count of Dreux", "George Rodney, 2nd Baron Rodney")."""
_MAX_OPTION_WORDS = 12


def _names_something(option: str) -> bool:
    """An option names something: a word that opens with a capital, a digit or a letter of a script without case
    (the options a corpus question compares are entities, not "restricted or banned")."""
    return any(w[0].isalnum() and not w[0].islower() for w in option.split())


_NAME_JOINERS = frozenset("of the de del da di du von van der la le y & v. vs. for on in at".split())
"""Lowercase words that occur inside a name ("Battle of Stones River", "Aptheker v. Secretary of State"); not "and",
which joins two names more often than it is inside one ("... from Finland and Paul David Hewson or Bono ...")."""


def name_words(words: list[str]) -> int:
    """How many of ``words``, from the first, make a name: each opens with a capital or a digit (after an opening
    quote or bracket), or is a joiner between two such words; the run never ends on a joiner."""
    n = 0
    for i, w in enumerate(words):
        if _names_something(w.lstrip("\"'(")):
            n = i + 1
        elif w.lower() not in _NAME_JOINERS:
            break
    return n


def _named_without_comma(body: str, at: int) -> list[str] | None:
    """The options of a choice written without a comma before them ("Who was born first Busby Berkeley or Billy Bob
    Thornton ?", "Which publication Woman's Journal or Woman's Era was published more often?"): the name that ends at
    the last ``or`` and the name that starts after it, each a run of capitalised words, after a "which"/"who"/"what"
    (a statement's "Trap or Die 3 is an album by ...?" is not a choice)."""
    before, after = body[:at].split(), body[at + 4:].replace("?", " ").split()
    left = name_words(before[::-1])
    right = name_words(after)
    if not left or not right:
        return None
    first = " ".join(before[len(before) - left:])
    if not _ASKS_WHICH.search(" ".join(before[:len(before) - left])):
        return None
    return [first, " ".join(after[:right])]


_NAMES_OWN_COMMA = re.compile(r",\s+[A-Z0-9]")


def _before_names_own_comma(body: str, cut: int) -> int:
    """Where the first option starts when the comma at ``cut`` is inside it: "...: Robert III, Count of Dreux or
    X?" (a name's own comma, followed by a capital or a digit, after a colon, semicolon or question mark with only
    a name between). Else ``cut``: "Which came first, the Railway or the Light?" keeps its comma."""
    if cut < 0 or body[cut] != "," or not _NAMES_OWN_COMMA.match(body, cut):
        return cut
    mark = max(body.rfind(m, 0, cut) for m in ":;?")
    words = body[mark + 1:cut].split()
    return mark if mark >= 0 and words and name_words(words) == len(words) else cut


def is_yes_no(question: str) -> bool:
    """A question a span cannot answer: it (or a later sentence of it, after a statement that sets it up: "X has an
    OBE. Does Y also have one?", a HotpotQA form) opens with an auxiliary verb and offers no ``A or B`` choice."""
    words = question.strip().split()
    if words and words[0].lower() in _AUXILIARIES:
        asked = question
    else:
        after_statement = _ASKED_AFTER_STATEMENT.search(question)
        if after_statement is None:
            return False
        asked = question[after_statement.start(1):]
    return " or " not in f" {asked.lower()} "


def choice_options(question: str) -> list[str] | None:
    """The two options a question asks to choose between, as it writes them without a leading article: "Which
    opened first, the Railway or the Light?" (the options after the last comma, colon, semicolon or question mark
    before its last ``or``), "Of A and B, which one ...?" / "Between A and B, who ...?", and, with no such mark, the
    two capitalised names around the ``or`` after a "which"/"who"/"what" ("Who was born first Busby Berkeley or
    Billy Bob Thornton ?"). None for any other question ("Did A or B come first?" asks no "which"). Of the 9,991
    HotpotQA questions of RouteRAG's RL training parquet outside HotpotQA-100, 833 read as choices, and the answer is
    one of the options for 662 (most others: the answer is a longer name, "Allen Stuart Drury" for "Allen Drury");
    before the names without a comma were read, 751 and 602)."""
    question = " ".join(question.split())
    paired = _OF_TWO.match(question)
    if paired:
        options = [paired.group(1), paired.group(2)]
    else:
        body = _WHO_OR_WHAT.sub("", question)
        at = body.lower().rfind(" or ")
        cut = max(body.rfind(mark, 0, max(at, 0)) for mark in ",:;")
        asked = body.rfind("?", 0, max(at, 0))  # "Which ... India? Gurla Mandhata or Kirat Chuli?", but not a
        if asked > cut and body[asked + 1:at].strip():  # title's own: "..., Where Have All the Flowers Gone? or X?"
            cut = asked
        if at < 0:
            return None
        cut = _before_names_own_comma(body, cut)
        if cut >= 0 and _ASKS_WHICH.search(question[:len(question) - len(body) + cut]):
            options = [body[cut + 1:at], _CLAUSE_AFTER.split(body[at + 4:], 1)[0].rstrip(" ?")]
        else:
            options = _named_without_comma(body, at) or []
    options = [ARTICLE.sub("", o.strip(" ,")) for o in options]
    if not options or not all(options) or max(len(o.split()) for o in options) > _MAX_OPTION_WORDS:
        return None
    if all(o.isdigit() for o in options):  # "Between 2010 and 2014, which stadium ...?" asks for neither
        return None
    if not all(_names_something(o) for o in options):  # "What activity, restricted or banned in ..., was ...?"
        return None
    return options


YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_EARLIER = re.compile(r"\b(first|earlier|earliest|before|older|oldest|sooner)\b", re.IGNORECASE)
_LATER = re.compile(r"\b(later|latest|last|after|younger|youngest|newer|newest|more recent)\b", re.IGNORECASE)


def asks_earlier(question: str) -> bool | None:
    """True when a choice question asks which came first ("earlier", "before", "older"), False when it asks which
    came later, None when it asks neither, or both."""
    earlier, later = bool(_EARLIER.search(question)), bool(_LATER.search(question))
    return None if earlier == later else earlier


def option_year(option: str, docs: Sequence[RetrievedDoc]) -> tuple[int, Citation] | None:
    """The year that dates an option, with the sentence that gives it: the first year of the option's own page (a
    document titled as the option: a person's birth, a building's opening), else of the first sentence that
    mentions the option."""
    forms = [f.lower() for f in option_forms(option)]
    own = [d for d in docs if " ".join((d.title or "").split()).lower() in forms]
    mentions = [(d, sentence) for d in docs for sentence in split_sentences(d.text)
                if any(f in sentence.lower() for f in forms)]
    for doc, sentence in [(d, sentence) for d in own for sentence in split_sentences(d.text)] + mentions:
        year = YEAR.search(sentence)
        if year:
            return int(year.group(1)), Citation(doc.id, doc.title, sentence)
    return None


def dated_choice(question: str, options: Sequence[str], docs: Sequence[RetrievedDoc]) -> tuple[int, Citation] | None:
    """The option the years decide (its index, and the sentence giving its year) when the question asks which came
    first or later and every option is dated, each with its own year; None otherwise."""
    earlier, years = asks_earlier(question), [option_year(o, docs) for o in options]
    if earlier is None or not all(years) or len({y[0] for y in years if y}) < len(years):
        return None
    dated = [y for y in years if y]
    pick = min(range(len(dated)), key=lambda i: dated[i][0] if earlier else -dated[i][0])
    return pick, dated[pick][1]


def undecided_options(question: str, docs: Sequence[RetrievedDoc]) -> list[str]:
    """The options of a choice question the documents leave the reader unable to weigh: for a question of which came
    first or later, those :func:`option_year` cannot date or dates with the same year as another (a year read off a
    sentence that names two options is often one event's); for another, those no document mentions. Empty for a
    question that is not a choice."""
    options = choice_options(question) or []
    if asks_earlier(question) is not None:
        years = [dated[0] if (dated := option_year(o, docs)) else None for o in options]
        return [o for o, y in zip(options, years) if y is None or years.count(y) > 1]
    texts = [f"{d.title or ''}\n{d.text}".lower() for d in docs]
    return [o for o in options if not any(f.lower() in t for f in option_forms(o) for t in texts)]


def option_forms(option: str) -> list[str]:
    """How an option may be written in a document: whole, or its head before a comma or bracket ("William Barnard
    (bishop)" is "William Barnard" in his page's text)."""
    head = re.split(r"\s*[,(]", option)[0].strip()
    return [option, head] if head and head != option else [option]
