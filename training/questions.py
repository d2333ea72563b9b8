"""Questions derived from an index's own facts and passages, with answers and gold passages (``routerag
make-questions``): training and evaluation data for any corpus, without labels.

Every question comes from the OpenIE triples the build extracted (surface forms, each with the passage it came
from), so its answer is in a gold passage by construction (checked again, with the answer not in the question):

* ``single-hop``: one fact (S, r, O): "Where did S premiere?" → O;
* ``bridge``: two facts (A, r1, B) and (B, r2, C) chained through B, which the question describes through A and does
  not name: "When was the conservatory that Marisol Vantreigh studied at founded?" → C;
* ``comparison``: two subjects with the same relation and years as values: "Which was founded earlier, X or Y?";
* ``unanswerable``: a subject asked for a relation its passage does not state (``"answers": []``).

Each relation has several phrasings (a seeded choice per question); questions whose content words match one already
kept are dropped as near-duplicates. A question names only what a reader can look up: an entity with its own
passage (its title) or a name of two words or more, never a lone first name ("William" joins the facts of every
William in the corpus), and a bridge is described by a fact that picks it out alone.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from graph_index.atomic import write_text_atomic
from graph_index.store import IndexData
from routerag.datasets import load_questions, title_key
from routerag.metrics import normalize_answer

QUESTION_TYPES = ("single-hop", "bridge", "comparison", "unanswerable")
_YEAR = re.compile(r"^(1[0-9]{3}|20[0-9]{2})$")
_PLACE_PREPS = frozenset({"in", "at", "into", "from", "near", "on", "between", "across", "through"})
_PRONOUNS = frozenset({"he", "she", "it", "they", "this", "that", "who", "which", "we", "i", "you", "there"})
_IRREGULAR = {"write": "wrote", "teach": "taught", "spend": "spent", "meet": "met", "give": "gave", "sell": "sold",
              "rise": "rose", "lie": "lay", "make": "made", "build": "built", "lead": "led", "win": "won",
              "become": "became", "begin": "began", "leave": "left", "hold": "held", "take": "took", "run": "ran",
              "know": "knew", "see": "saw", "go": "went", "come": "came", "tell": "told", "find": "found",
              "buy": "bought", "pay": "paid", "bring": "brought", "think": "thought", "fly": "flew",
              "sing": "sang", "draw": "drew", "grow": "grew", "fall": "fell", "have": "had", "has": "had", "do": "did",
              "does": "did", "withdraw": "withdrew", "send": "sent", "flee": "fled", "get": "got", "stand": "stood",
              "fight": "fought", "speak": "spoke", "choose": "chose", "drive": "drove", "throw": "threw",
              "break": "broke", "lose": "lost", "keep": "kept", "say": "said", "seek": "sought", "feel": "felt",
              "hear": "heard", "sit": "sat", "put": "put", "set": "set", "shoot": "shot", "swim": "swam",
              "strike": "struck", "bear": "bore", "forget": "forgot", "wear": "wore", "catch": "caught"}
_ALREADY_PAST = frozenset(_IRREGULAR.values()) - {"found"} | frozenset(  # to found: founded
    "sung known shown grown drawn flown thrown begun swum hung spun struck".split())  # "sunged", "knowned"
_NUMBERED = re.compile(r"^\w+ [ivx]+$")  # "john i", "henry iv": a regnal name is shared by many rulers
_STOP = frozenset("a an the of in on at to for from by with and or is are was were what which who whom when where "
                  "how did does do".split())


class Corpus(Protocol):
    """What the questions are derived from: passages and their OpenIE, in the same order (an
    :class:`~graph_index.store.IndexData`, or a corpus with imported OpenIE)."""

    passages: Sequence[Any]
    openie: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Fact:
    subject: str
    relation: str
    object: str
    passage: int
    own_page: bool = False  # the subject is its passage's title: the page about it states the fact


@dataclass(slots=True)
class Question:
    question: str
    answers: list[str]
    supporting: list[int]
    type: str
    relation: str
    meta: dict[str, Any] = field(default_factory=dict)


# -- phrasing ---------------------------------------------------------------------------------------------------------

def past(verb: str) -> str:
    """A relation's verb (the CPU extractor's lemma) in the past tense; a participle ("born") stays."""
    if " " in verb:  # an LLM extractor's "was born in", "hosted the": inflect the first word only
        first, rest = verb.split(" ", 1)
        return f"{past(first)} {rest}"
    if verb.endswith(("ed", "en")) or verb in _ALREADY_PAST or verb in ("born", "is", "was", "were"):
        return {"is": "was"}.get(verb, verb)
    if verb.endswith("s") and not verb.endswith("ss") and len(verb) > 3:  # "runs", "includes": already inflected
        verb = verb[:-1]
    if verb in _IRREGULAR:
        return _IRREGULAR[verb]
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and len(verb) > 2 and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def split_relation(relation: str) -> tuple[str, str]:
    """("premier at") → ("premier", "at"): the verb and its preposition (empty when none)."""
    words = relation.split()
    if len(words) > 1 and words[-1] in _PLACE_PREPS | {"by", "for", "with", "as", "since", "to", "of", "about"}:
        return " ".join(words[:-1]), words[-1]
    return relation, ""


def wh_word(relation: str, answer: str) -> str:
    """What the question asks for: a year → when; a named place after a place preposition → where; else what."""
    _, prep = split_relation(relation)
    if _YEAR.match(answer):
        return "when"
    if answer[:1].isupper() and prep in _PLACE_PREPS:
        return "where"
    if answer[:1].isupper() and prep == "by":
        return "who"
    return "what"


def _passive(verb: str) -> bool:
    return verb.endswith(("ed", "en")) or verb in ("born", "sold")


def phrasings(subject: str, relation: str, answer: str) -> list[str]:
    """The forms a question about (subject, relation, ?) may take: several per relation, not one template."""
    verb, prep = split_relation(relation)
    wh = wh_word(relation, answer)
    Wh = wh.capitalize()
    if relation == "is":
        return [f"What is {subject}?", f"{subject} is what?", f"What kind of thing is {subject}?",
                f"How is {subject} described?", f"What is {subject} known as?"]
    if verb == "born":
        return [f"Where was {subject} born?", f"In what place was {subject} born?", f"What is the birthplace of "
                f"{subject}?", f"{subject} was born where?", f"Which place is {subject}'s birthplace?"]
    if _passive(verb):  # "founded in", "issued by", "sold in"
        tail = "" if wh in ("when", "where") else f" {prep}" if prep else ""
        forms = [f"{Wh} was {subject} {verb}{tail}?", f"{subject} was {verb}{tail} {wh}?"]
        if wh == "when":
            forms += [f"In what year was {subject} {verb}?", f"What year was {subject} {verb}?"]
        elif wh == "where":
            forms += [f"In what place was {subject} {verb}?"]
        return forms
    tail = "" if wh in ("when", "where") else f" {prep}" if prep else ""
    forms = [f"{Wh} did {subject} {verb}{tail}?", f"{subject} {past(verb)}{tail} {wh}?",
             f"According to the documents, {wh} did {subject} {verb}{tail}?"]
    if wh == "when":
        forms += [f"In what year did {subject} {verb}{' ' + prep if prep and prep != 'in' else ''}?"]
    elif wh == "where":
        forms += [f"In which place did {subject} {verb}?"]
    else:
        forms += [f"What is it that {subject} {past(verb)}{tail}?"]
    return forms


def describe(bridge: str, via: Fact, roles: dict[str, str]) -> str | None:
    """The bridge entity described through another fact without its name: "the conservatory that Marisol Vantreigh
    studied at" (the bridge is the fact's object) or "the composer who studied at the Tessaly Conservatory" (its
    subject)."""
    role = roles.get(key(bridge), "one")
    verb, prep = split_relation(via.relation)
    if via.relation == "is" or verb == "born":
        return None
    if key(via.object) == key(bridge):
        said = f"was {verb}" if _passive(verb) else past(verb)
        return f"the {role} that {via.subject} {said}{' ' + prep if prep else ''}"
    if _passive(verb):
        return f"the {role} {verb} {prep + ' ' if prep else ''}{via.object}"
    return f"the {role} who {past(verb)} {prep + ' ' if prep else ''}{via.object}"


# -- facts --------------------------------------------------------------------------------------------------------------

def key(text: str) -> str:
    return normalize_answer(text)


def named_alone(name: str, titles: frozenset[str]) -> bool:
    """Whether ``name`` picks out one thing a reader can look up: a passage's title, or a name of two words or more
    that is not a ruler's number ("John I"). A lone "William" or "Duke" does not."""
    k = key(name)
    return k in titles or (len(k.split()) >= 2 and not _NUMBERED.match(k))


def title_keys(data: Corpus) -> frozenset[str]:
    """The passages' titles, normalised: the names a reader can look up a page by (untitled passages give none)."""
    return frozenset(k for p in data.passages if (k := key(p.title or "")))


def load_facts(data: Corpus, titles: frozenset[str]) -> tuple[list[Fact], dict[str, str]]:
    """The index's triples whose subject is a named entity of its passage (or the passage's title) that names one
    thing alone (:func:`named_alone`) and whose object is written in the passage, and each named entity's role (its
    "is" object: "composer"; its own passage's first one wins)."""
    facts: list[Fact] = []
    roles: dict[str, str] = {}
    own_role: set[str] = set()  # entities whose role their own passage gave
    for i, (passage, ie) in enumerate(zip(data.passages, data.openie)):
        named = {key(e) for e in ie.entities} | {key(passage.title)}
        text = key(f"{passage.title} {passage.text}")
        for s, r, o in ie.triples:
            if key(s) not in named or not s[:1].isupper() or key(o) in _PRONOUNS or key(s) == key(o) or not key(o):
                continue
            if r.startswith("is ") or len(r.split()) > 3 or (r != "is" and not (o[:1].isupper() or _YEAR.match(o))):
                continue  # "is with", and common-noun objects ("tell story"), are no questions
            if f" {key(o)} " not in f" {text} " or not named_alone(s, titles):
                continue
            own_page = key(s) == key(passage.title)
            if r == "is" and not o[:1].isupper():
                if own_page and key(s) not in own_role:
                    roles[key(s)] = o.lower()
                    own_role.add(key(s))
                elif not own_page:
                    roles.setdefault(key(s), o.lower())
            facts.append(Fact(s, r, o, i, own_page))
    return facts, roles


def _answers_by_subject(facts: Sequence[Fact]) -> dict[tuple[str, str], list[Fact]]:
    out: dict[tuple[str, str], list[Fact]] = defaultdict(list)
    for f in facts:
        out[(key(f.subject), f.relation)].append(f)
    return out


def single_hop(facts: Sequence[Fact], rng: random.Random) -> Iterable[Question]:
    for (_, relation), group in _answers_by_subject(facts).items():
        first = group[0]
        answers = list(dict.fromkeys(f.object for f in group))
        text = rng.choice(phrasings(first.subject, relation, first.object))
        yield Question(text, answers, sorted({f.passage for f in group}), "single-hop", relation)


@dataclass(frozen=True, slots=True)
class Descriptions:
    """The facts grouped by (subject, relation), as every question type groups them, and which subjects each
    (relation, object) comes from: whether a description of a bridge leaves one candidate."""
    by_subject: dict[tuple[str, str], list[Fact]]
    subjects: dict[tuple[str, str], set[str]]
    titles: frozenset[str]

    @classmethod
    def of(cls, facts: Sequence[Fact], titles: frozenset[str]) -> Descriptions:
        subjects: dict[tuple[str, str], set[str]] = defaultdict(set)
        for f in facts:
            subjects[(f.relation, key(f.object))].add(key(f.subject))
        return cls(_answers_by_subject(facts), subjects, titles)

    def picks_out_one(self, via: Fact, bridge: str) -> bool:
        """"The conservatory that X studied at" when X studied at one place only; "the composer who studied at the
        Tessaly Conservatory" when nobody else did (a year, "the nobleman who died in 1681", is never enough)."""
        if not named_alone(bridge, self.titles):
            return False
        if key(via.object) == key(bridge):
            return len({key(f.object) for f in self.by_subject.get((key(via.subject), via.relation), ())}) == 1
        return named_alone(via.object, self.titles) and len(self.subjects[(via.relation, key(via.object))]) == 1


def bridges(facts: Sequence[Fact], roles: dict[str, str], titles: frozenset[str],
            rng: random.Random) -> Iterable[Question]:
    """Two facts chained through an entity the question describes, not names: the asked fact from the bridge's own
    passage, the description one that leaves no other candidate (:meth:`Descriptions.picks_out_one`)."""
    descriptions = Descriptions.of(facts, titles)
    subjects: dict[str, list[tuple[str, list[Fact]]]] = defaultdict(list)
    for (s, rel), group in descriptions.by_subject.items():
        subjects[s].append((rel, group))
    for via in facts:
        for bridge in (via.object, via.subject):
            if not bridge[:1].isupper() or key(bridge) not in subjects:
                continue
            if not descriptions.picks_out_one(via, bridge):
                continue
            for rel, group in subjects[key(bridge)]:
                own = [f for f in group if f.own_page]  # not a passing mention of a hub ("New York published ...")
                if not own or rel == "is":
                    continue
                second = own[0]
                if second.passage == via.passage or key(second.object) == key(via.subject):
                    continue
                desc = describe(bridge, via, roles)
                if desc is None:
                    continue
                text = rng.choice(phrasings(desc, rel, second.object))
                yield Question(text, list(dict.fromkeys(f.object for f in own)), [via.passage, second.passage],
                               "bridge", rel, {"bridge": bridge})


def comparisons(facts: Sequence[Fact], rng: random.Random) -> Iterable[Question]:
    years: dict[str, list[Fact]] = defaultdict(list)
    for f in facts:
        if _YEAR.match(f.object):
            years[f.relation].append(f)
    for relation, group in years.items():
        verb, prep = split_relation(relation)
        for a, b in ((a, b) for i, a in enumerate(group) for b in group[i + 1: i + 4]):
            if key(a.subject) == key(b.subject) or a.object == b.object:
                continue
            first, second = (a, b) if rng.random() < 0.5 else (b, a)
            earlier = min((a, b), key=lambda f: int(f.object))
            said = verb if _passive(verb) else past(verb)
            forms = [f"Which {'was ' if _passive(verb) else ''}{said} earlier, {first.subject} or {second.subject}?",
                     f"Of {first.subject} and {second.subject}, which one {'was ' if _passive(verb) else ''}{said} "
                     f"first?",
                     f"Who or what {'was ' if _passive(verb) else ''}{said} before the other: {first.subject} or "
                     f"{second.subject}?"]
            yield Question(rng.choice(forms), [earlier.subject], [a.passage, b.passage], "comparison", relation,
                           {"values": {a.subject: a.object, b.subject: b.object}})


def unanswerables(facts: Sequence[Fact], data: Corpus, rng: random.Random) -> Iterable[Question]:
    """A subject asked for a relation that other subjects of its kind have and its own passage does not state (nor
    does the verb occur in it)."""
    by_subject = _answers_by_subject(facts)
    kind_of = {key(f.subject): kind for f in facts if (kind := entity_kind(f.subject, data.passages[f.passage].text))}
    relations: dict[str, list[Fact]] = defaultdict(list)  # by the kind of the subjects that have them
    for f in facts:
        if f.relation != "is" and key(f.subject) in kind_of:
            relations[kind_of[key(f.subject)]].append(f)
    subjects = {key(f.subject): f for f in facts}
    for s, f in subjects.items():
        kin = [g for g in relations.get(kind_of.get(s, ""), []) if key(g.subject) != s]
        if not kin:
            continue
        relation = rng.choice(sorted({g.relation for g in kin}))
        verb, _ = split_relation(relation)
        passage = data.passages[f.passage]
        if (s, relation) in by_subject or verb.split()[0][:4] in key(passage.text):
            continue
        example = next(g for g in kin if g.relation == relation)
        yield Question(rng.choice(phrasings(f.subject, relation, example.object)), [], [f.passage], "unanswerable",
                       relation)


def entity_kind(name: str, text: str) -> str | None:
    """spaCy's label of ``name`` where its passage names it (PERSON, ORG, GPE, ...): what kinds of relations it can
    be asked for ("Where was the Bank of Oreland born?" is not a question)."""
    labels = [label for ent, label in _entities(text) if key(ent) == key(name)]
    return labels[0] if labels else None


@functools.lru_cache(maxsize=8192)
def _entities(text: str) -> tuple[tuple[str, str], ...]:
    from routerag.policy.short_answer import _nlp

    return tuple((e.text, e.label_) for e in _nlp()(text).ents)


# -- filters and output ----------------------------------------------------------------------------------------------

def _content(text: str) -> frozenset[str]:
    return frozenset(w for w in key(text).split() if w not in _STOP)


def keep(q: Question, data: Corpus, seen: set[frozenset[str]]) -> bool:
    """The answer is in a gold passage and not in the question; not a near-duplicate of a question already kept
    (the same content words)."""
    words = _content(q.question)
    if words in seen:
        return False
    if q.answers:
        gold = " ".join(key(f"{data.passages[i].title} {data.passages[i].text}") for i in q.supporting)
        if not any(f" {key(a)} " in f" {gold} " for a in q.answers):
            return False
        if any(f" {key(a)} " in f" {key(q.question)} " for a in q.answers) and q.type != "comparison":
            return False
    seen.add(words)
    return True


FactKey = tuple[frozenset[str], frozenset[str]]
"""An answerable question's fact: its gold pages' titles and its answers, whatever the phrasing."""


def fact_key(titles: Iterable[str], answers: Iterable[str]) -> FactKey:
    return frozenset(title_key(t) for t in titles), frozenset(key(a) for a in answers)


def excluded(items: Iterable[Any]) -> tuple[set[frozenset[str]], set[FactKey]]:
    """What a draw must not repeat of other question files (``routerag.datasets.QAItem`` rows): their questions'
    content words, and the facts their answerable questions ask about. Two seeds over the 2Wiki corpus shared 5
    questions word for word and 15 by fact, all bridges (docs/research/2026-12-01-later-documents-weigh-less.md),
    so a training draw beside a held-out one excludes it."""
    words = {_content(it.question) for it in items}
    facts = {fact_key((g.title for g in it.supporting), it.answers) for it in items if it.answers and it.supporting}
    return words, facts


def _select(pool: Sequence[Question], data: Corpus, seen: set[frozenset[str]], n: int,
            facts_out: set[FactKey] | frozenset[FactKey] = frozenset()) -> list[Question]:
    """The first ``n`` questions that pass :func:`keep` and ask no fact of ``facts_out``, at most two through one
    bridge entity: a draw of many chains, not ten questions about one page's facts."""
    kept: list[Question] = []
    through: Counter[str] = Counter()
    for q in pool:
        if len(kept) == n:
            break
        bridge = key(q.meta["bridge"]) if "bridge" in q.meta else None
        if facts_out and q.answers and fact_key((data.passages[i].title for i in q.supporting), q.answers) in facts_out:
            continue
        if (bridge is not None and through[bridge] >= 2) or not keep(q, data, seen):
            continue
        kept.append(q)
        if bridge is not None:
            through[bridge] += 1
    return kept


def make_questions(data: Corpus, *, per_type: int = 200, seed: int = 0,
                   exclude: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Up to ``per_type`` questions of each type (a seeded shuffle), as question-file rows (``routerag eval`` and
    the trainers read them), none repeating a question or fact of ``exclude`` (:func:`excluded`)."""
    rng = random.Random(seed)
    titles = title_keys(data)
    facts, roles = load_facts(data, titles)
    pools = {"single-hop": list(single_hop(facts, rng)), "bridge": list(bridges(facts, roles, titles, rng)),
             "comparison": list(comparisons(facts, rng)), "unanswerable": list(unanswerables(facts, data, rng))}
    rows: list[dict[str, Any]] = []
    seen, facts_out = excluded(exclude)
    for qtype in QUESTION_TYPES:
        pool = pools[qtype]
        rng.shuffle(pool)
        kept = _select(pool, data, seen, per_type, facts_out)
        for n, q in enumerate(kept):
            rows.append({"id": f"{qtype}-{n}", "question": q.question, "answers": q.answers, "type": qtype,
                         "relation": q.relation,
                         "supporting": [{"title": data.passages[i].title, "text": data.passages[i].text}
                                        for i in dict.fromkeys(q.supporting)], **q.meta})
    return rows


def write_questions(index: Path, out: Path, *, per_type: int = 200, seed: int = 0,
                    exclude: Sequence[Path] = ()) -> dict[str, int]:
    """``routerag make-questions``: write the questions as JSONL (atomically) and return the count per type. The
    output's folder is made first and the ``exclude`` files are read first, so a path that cannot be written or a
    bad question file fails before minutes of work, not after."""
    held = [item for path in exclude for item in load_questions(path)]
    with IndexData(index) as data:
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = make_questions(data, per_type=per_type, seed=seed, exclude=held)
    write_text_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts = {t: sum(1 for r in rows if r["type"] == t) for t in QUESTION_TYPES}
    return {**counts, "total": len(rows)}
