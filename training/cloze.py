"""Cloze-translated questions for the extractive reader: many question forms from any training corpus, no labels.

The reader learned its answer types from PopQA and corpus-derived questions (places, occupations, relations of
facts), so it puts almost no probability on "31 metres" for "How tall is the Osterby Light?" although that passage
is all it reads. Unsupervised QA by cloze translation (Lewis et al., 2019) makes questions of every answer type from
plain sentences: take a sentence, cut out an answer span (a named entity or a noun chunk), and put a wh-phrase
chosen by the span's type in its place (``How tall`` for a quantity followed by "tall", ``When`` for a date, ``Who``
for a person, ...). The questions are noisy ("When the Osterby Light was first lit and is 31 metres tall?"), but
they pair each wh-phrase with the kind of span that answers it, over every sentence of the corpus.

Output rows are ``routerag make-questions`` rows (question, answers, type, supporting passage), so ``routerag
train-reader --questions`` reads them as it reads corpus-derived questions:

    python -m training.cloze CORPUS.json --out cloze.jsonl [--per-passage 2]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from graph_index.corpus import load_corpus
from routerag.policy.short_answer import SPACY_MODEL

_MEASURES = {"tall", "high", "long", "wide", "deep", "old", "far", "heavy", "big", "large"}
_WH_BY_LABEL = {"PERSON": "Who", "ORG": "What organization", "NORP": "What nationality", "EVENT": "What event",
                "WORK_OF_ART": "What work", "LAW": "What law", "LANGUAGE": "What language", "PRODUCT": "What",
                "MONEY": "How much", "PERCENT": "What percentage", "TIME": "What time", "ORDINAL": "Which"}
_PLACES = {"GPE", "LOC", "FAC"}
_LEADING_PREPOSITION = {"in", "at", "on", "from", "near"}


def wh_phrase(label: str, span: Any) -> tuple[str, bool]:
    """The wh-phrase for an answer span of spaCy type ``label``, and whether it absorbs a preposition before the
    span ("born in Lindmark" → "Where ... born"; "first lit in 1866" → "When ... first lit")."""
    after = span.doc[span.end].lower_ if span.end < len(span.doc) else ""
    before = span.doc[span.start - 1].lower_ if span.start > 0 else ""
    if label in ("CARDINAL", "QUANTITY"):
        return (f"How {after}" if after in _MEASURES else "How many" if label == "CARDINAL" else "How much"), False
    if label == "DATE":
        year_only = bool(re.fullmatch(r"\d{4}", span.text))
        return ("In what year" if year_only else "When"), before in _LEADING_PREPOSITION
    if label in _PLACES:
        return ("Where", True) if before in _LEADING_PREPOSITION else ("What place", False)
    return _WH_BY_LABEL.get(label, "What"), False


def translate(sentence: Any, span: Any, label: str, title: str) -> str | None:
    """The cloze question: the wh-phrase, then the sentence without the span (and without a preposition the
    wh-phrase absorbs, and without a measure word its "How" took); a leading pronoun becomes the passage title."""
    wh, absorbs = wh_phrase(label, span)
    drop = set(range(span.start, span.end))
    if absorbs and span.start > sentence.start:
        drop.add(span.start - 1)
    if span.start == sentence.start + 1 and sentence[0].pos_ == "DET":  # "The [Osterby Light] is ..."
        drop.add(sentence.start)
    if wh.startswith("How ") and wh.split()[1] in _MEASURES:
        drop.add(span.end)
    words = []
    for tok in sentence:
        if tok.i in drop or tok.is_space:
            continue
        text = title if tok.i == sentence.start and tok.lower_ in ("it", "he", "she", "they") else tok.text
        words.append(text + tok.whitespace_)
    body = "".join(words).strip().rstrip(".!?;:,").strip()
    if len(body.split()) < 3:
        return None
    return f"{wh} {body[0].lower() + body[1:] if not _keeps_case(sentence, drop) else body}?"


def _keeps_case(sentence: Any, drop: set[int]) -> bool:
    """Whether the remaining sentence starts with a proper noun (keeps its capital) rather than a common word."""
    for tok in sentence:
        if tok.i not in drop and not tok.is_space:
            return tok.pos_ in ("PROPN", "NUM") or tok.text.isupper() or tok.lower_ in ("it", "he", "she", "they")
    return True


def answer_spans(sentence: Any) -> list[tuple[Any, str]]:
    """Candidate answers of a sentence: its named entities, and noun chunks (as ``NOUN``) that are not the subject
    and not a bare pronoun."""
    spans = [(ent, ent.label_) for ent in sentence.ents]
    taken = {i for ent, _ in spans for i in range(ent.start, ent.end)}
    for chunk in sentence.noun_chunks:
        if chunk.root.dep_ in ("nsubj", "nsubjpass") or chunk.root.pos_ == "PRON":
            continue
        if not taken.intersection(range(chunk.start, chunk.end)) and len(chunk) <= 6:
            spans.append((chunk, "NOUN"))
    return spans


NUMERIC_LABELS = frozenset({"CARDINAL", "QUANTITY", "DATE", "MONEY", "PERCENT"})


def answer_head(span: Any, label: str) -> str:
    """The answer as PopQA and HotpotQA bound it: a noun chunk's head noun with the compound nouns before it ("an
    American session guitarist" → "session guitarist"), an entity without a leading "the". Why: whole spaCy spans
    taught a reader to answer "American guitarist" where "guitarist" was asked
    (docs/research/2026-11-28-reader-cloze-questions.md)."""
    if label != "NOUN":
        words = list(span)
        if len(words) > 1 and words[0].lower_ == "the":
            words = words[1:]
        return span.doc[words[0].i: span.end].text
    root = span.root
    start = root.i
    while start - 1 >= span.start and span.doc[start - 1].dep_ == "compound":
        start -= 1
    return span.doc[start: root.i + 1].text


def cloze_rows(passages: Iterable[dict[str, str]], per_passage: int = 2, seed: int = 0,
               labels: frozenset[str] | None = None, heads: bool = False) -> Iterator[dict]:
    """Up to ``per_passage`` cloze questions from each passage, each on a different sentence, with its passage as
    the gold one; rows in ``routerag make-questions`` format. ``labels`` keeps answers of those spaCy types only
    (``NOUN`` for noun chunks): spaCy's span boundaries ("American guitarist") taught a reader trained on every type
    to answer with modifiers it was not asked for (docs/research/2026-11-28-reader-cloze-questions.md); ``heads``
    cuts each answer to :func:`answer_head` instead."""
    import spacy

    nlp = spacy.load(SPACY_MODEL, disable=["lemmatizer"])
    rng = random.Random(seed)
    items = [p for p in passages if p.get("text", "").strip()]
    texts = (p["text"] for p in items)
    for n, (passage, doc) in enumerate(zip(items, nlp.pipe(texts, batch_size=64))):
        sentences = [s for s in doc.sents if len(s) >= 5]
        rng.shuffle(sentences)
        made = 0
        for sentence in sentences:
            candidates = [(sp, lab) for sp, lab in answer_spans(sentence) if labels is None or lab in labels]
            if not candidates or made >= per_passage:
                continue
            span, label = rng.choice(candidates)
            question = translate(sentence, span, label, passage.get("title", ""))
            answer = answer_head(span, label) if heads else span.text
            if question is None or answer.lower() in question.lower():
                continue
            made += 1
            yield {"id": f"cloze-{n}-{made}", "question": question, "answers": [answer],
                   "type": f"cloze-{label.lower()}", "supporting": [{"title": passage.get("title", ""),
                                                                     "text": passage["text"]}]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path, nargs="+", help="training corpora only: the reader is judged elsewhere")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--per-passage", type=int, default=2)
    ap.add_argument("--numeric-only", action="store_true", help="answers that are numbers, dates or amounts only")
    ap.add_argument("--heads", action="store_true", help="answers cut to a head noun and its compounds (answer_head)")
    args = ap.parse_args(argv)
    loaded, _ = load_corpus(args.corpus)  # build-graph's reader: JSON list, JSONL or title → sentences
    passages = [{"title": p.title, "text": p.text} for p in loaded]
    with args.out.open("w", encoding="utf-8") as f:
        count = 0
        for row in cloze_rows(passages, args.per_passage, labels=NUMERIC_LABELS if args.numeric_only else None,
                              heads=args.heads):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    print(f"{count} cloze questions from {len(passages)} passages -> {args.out}")


if __name__ == "__main__":
    main()
