"""The hand-written held-out sets under benchmarks/heldout/ load as `routerag eval` and `build-graph` load them, and
are well formed: every answer a reader could point at is in the corpus, no answer gives itself away in its
question, and each set logs its reads. Nothing here prints or pins a question: the sets are sealed (their README)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from graph_index.corpus import load_corpus
from routerag.datasets import load_questions

HELDOUT = Path(__file__).resolve().parents[1] / "benchmarks" / "heldout"
SETS = sorted(p.name for p in HELDOUT.iterdir() if (p / "questions.jsonl").is_file())
SEALED = {name for name in SETS if "sealed" in (HELDOUT / name / "README.md").read_text(encoding="utf-8").lower()}
"""The sets whose README says they are sealed (read only as benchmarks/heldout/README.md says)."""
TYPES = {"single-hop", "bridge", "comparison", "unanswerable"}
DEV = HELDOUT.parent / "dev"
WRITTEN_BY_PROMPT = [HELDOUT / name for name in SETS] + [DEV / "fenwold", DEV / "lissmarch"]
"""Every set written to the pool's prompt: the sealed ones and the two development sets written to it (dev/)."""


def _norm(text: str) -> str:
    """Case, spacing and thousands commas aside ("12,400" and "12400" are one answer)."""
    return re.sub(r"\s+", " ", text.lower()).replace(",", "")


def test_there_are_sealed_sets() -> None:
    assert {"tarrowmere", "brindlemoor", "caldwick", "merrowgate", "quellin", "coastal", "askerry", "wrenbury",
            "vessandra", "carrickvale", "hollowaystaithe", "brannoch", "dunmarrow", "skarrholm", "fellgarth", "quarrendon", "ellisveig",
            "tamsworth"} <= SEALED


@pytest.mark.parametrize("folder", WRITTEN_BY_PROMPT, ids=lambda p: p.name)
def test_a_set_loads_and_is_well_formed(folder: Path) -> None:
    name = folder.name
    passages, _ = load_corpus([folder / "corpus.jsonl"])
    items = load_questions(folder / "questions.jsonl")
    assert len({p.title for p in passages}) == len(passages)
    assert len({q.id for q in items}) == len(items) and items
    corpus = _norm(" ".join(p.text for p in passages))
    problems = [(q.id, why) for q in items for why in _problems(q.meta.get("type"), q.question, q.answers, corpus)]
    assert not problems, f"{name}: {problems}"  # ids and reasons only: the texts stay sealed


def _problems(kind: str | None, question: str, answers: list[str], corpus: str) -> list[str]:
    """What is wrong with one question, as reasons that quote none of its text."""
    out = [] if kind in TYPES else ["unknown type"]
    if (kind == "unanswerable") != (not answers):
        out.append("an unanswerable question has no answers, and only it")
    spans = [a for a in answers if a.lower() not in ("yes", "no")]
    if len(spans) < len(answers) and kind != "comparison":
        out.append("yes/no outside a comparison")
    if kind == "comparison":  # one of the two options, as the question names it, or as a passage names what the
        # question describes ("the abbey founded by X or the one founded by Y")
        named = any(_norm(a) in _norm(question) or _norm(a) in corpus for a in spans)
        out += [] if not spans or named else ["no answer is an option or in a passage"]
    elif spans:  # variants may be phrasings of their own ("river Saltva"); one of them is the passage's words
        out += [] if any(_norm(a) in corpus for a in spans) else ["no answer is in a passage"]
        out += [] if not any(_norm(a) in _norm(question) for a in spans) else ["an answer is in its question"]
    return out


@pytest.mark.parametrize("name", sorted(SEALED))
def test_a_sealed_set_logs_its_reads(name: str) -> None:
    assert (HELDOUT / name / "READS.md").is_file(), f"{name}: a sealed set keeps READS.md, one line per read"


def test_the_pool_runner_and_its_table_name_every_sealed_set() -> None:
    """`run_pool.sh` writes `indexes/heldout/<set>` and `reports/heldout/<set>`; `pool.json` must read those same
    folders, for every sealed set, or the tables it prints silently leave a set out."""
    script = (HELDOUT / "run_pool.sh").read_text(encoding="utf-8")
    looped = set(re.search(r"for name in ([\w ]+); do", script).group(1).split())
    assert looped == SEALED
    spec = json.loads((HELDOUT / "pool.json").read_text(encoding="utf-8"))
    assert {s["index"] for s in spec["sets"]} == {f"indexes/heldout/{n}" for n in SEALED}
    for s in spec["sets"]:
        name = s["index"].rsplit("/", 1)[1]
        assert {folder for _, folder, _ in s["rows"]} == {f"reports/heldout/{name}"}
        assert [strategy for _, _, strategy in s["rows"]] == ["learned", "naive-passage", "naive-graph", "naive-hybrid"]
    assert subprocess.run(["bash", "-n", str(HELDOUT / "run_pool.sh")]).returncode == 0
