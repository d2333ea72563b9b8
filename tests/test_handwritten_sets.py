"""The hand-written training sets (training/handwritten/) load as `routerag train-reader` reads them and are well
formed, and none of them shares a passage with a held-out or development set: training on them must not train on a
test corpus."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from training.reader_data import is_yes_no_row, read_question_file

ROOT = Path(__file__).resolve().parents[1]
SETS = sorted(p for p in (ROOT / "training" / "handwritten").iterdir() if (p / "questions.jsonl").is_file())
TEST_SETS = [p for base in ("benchmarks/heldout", "benchmarks/dev") for p in (ROOT / base).iterdir()
             if (p / "corpus.jsonl").is_file()]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).replace(",", "")


def _pages(folder: Path) -> dict[str, str]:
    lines = (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    return {page["title"]: page["text"] for page in map(json.loads, filter(str.strip, lines))}


def _word_overlap(a: str, b: str) -> float:
    x, y = set(a.lower().split()), set(b.lower().split())
    return len(x & y) / len(x | y)


def test_there_are_five_training_sets() -> None:
    assert [p.name for p in SETS] == ["ambleton", "corvane", "orrisford", "pellam", "tallowby"]


@pytest.mark.parametrize("folder", SETS, ids=lambda p: p.name)
def test_a_training_set_is_well_formed(folder: Path) -> None:
    rows = read_question_file(folder / "questions.jsonl")  # resolves every supporting title, or raises
    assert len({r["id"] for r in rows}) == len(rows) == 100
    problems = []
    for r in rows:
        kind, answers, pages = r["type"], [a for a in r["answers"] if a], r["supporting"]
        if kind not in {"single-hop", "bridge", "comparison", "unanswerable"} or not pages:
            problems.append((r["id"], "type or supporting"))
        elif (kind == "unanswerable") != (not answers):
            problems.append((r["id"], "answers"))
        elif kind in ("single-hop", "bridge") and not any(_norm(a) in _norm(pages[-1]["text"]) for a in answers):
            problems.append((r["id"], "answer not in the last supporting passage"))
        elif kind != "comparison" and any(_norm(a) in _norm(r["question"]) for a in answers):
            problems.append((r["id"], "answer in its question"))
        elif kind == "comparison" and not is_yes_no_row(r) and not any(
                _norm(a) in _norm(" ".join(p["text"] for p in pages)) for a in answers):
            problems.append((r["id"], "comparison answer in neither page"))
    assert not problems


@pytest.mark.parametrize("folder", SETS, ids=lambda p: p.name)
def test_no_training_passage_is_a_test_sets_passage(folder: Path) -> None:
    """Separate writers invent some of the same names (a town, a play), so a title may recur; its text must not
    (the recurring titles share 10-19% of their words, the function words)."""
    ours = _pages(folder)
    copied = [(other.name, round(_word_overlap(ours[t], text), 2)) for other in TEST_SETS
              for t, text in _pages(other).items() if t in ours and _word_overlap(ours[t], text) > 0.5]
    assert not copied  # set names and overlaps only: the held-out texts stay sealed
