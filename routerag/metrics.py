"""Answer metrics, shared by evaluation and the training rewards: SQuAD-normalised exact match and token F1, s3's
GenAcc span check, and answer recall (the same check on the retrieved documents). Every function takes a prediction
(or the documents) and a list of gold aliases and scores the best alias."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str | None) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and the articles a/an/the, collapse whitespace."""
    if not text:
        return ""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds if normalize_answer(g)))


def f1(prediction: str | None, golds: Sequence[str]) -> float:
    """Token-level F1 against the best alias (SQuAD). An empty prediction scores 0."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        gold = normalize_answer(g).split()
        if not gold or not pred:
            continue
        common = Counter(pred) & Counter(gold)
        same = sum(common.values())
        if same == 0:
            continue
        precision, recall = same / len(pred), same / len(gold)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def gen_acc(prediction: str | None, golds: Sequence[str]) -> float:
    """s3's GenAcc: 1 when a normalised gold alias appears as a whole-token span of the normalised prediction
    ("Paris" in "the city of Paris, France"), which forgives verbose but correct answers."""
    pred = normalize_answer(prediction).split()
    if not pred:
        return 0.0
    for g in golds:
        gold = normalize_answer(g).split()
        n = len(gold)
        if n and any(pred[i : i + n] == gold for i in range(len(pred) - n + 1)):
            return 1.0
    return 0.0


def answer_in_documents(documents: Sequence[str], golds: Sequence[str]) -> float:
    """Answer recall: 1 when a normalised gold alias is a whole-token span of a normalised retrieved document
    (GenAcc's test, applied to the evidence instead of the answer), else 0. It says whether the retrieval put the
    answer in front of the reader, whatever the reader then made of it."""
    aliases = [f" {a} " for a in (normalize_answer(g) for g in golds) if a]
    return float(any(a in f" {normalize_answer(doc)} " for doc in documents for a in aliases))
