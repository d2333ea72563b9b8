"""How often a question set reads as a choice, and how often its answer is one of the options read.

    python benchmarks/choice_parse.py ../shared/data/hotpotqa_rl/train.parquet \
        --exclude ../shared/data/hotpotqa_100/hotpotqa_100.json [--show 20]

`routerag.policy.choices.choice_options` is a rule, not a model; this measures it on question text alone (nothing
is retrieved): how many questions read as a choice, for how many the gold answer is exactly one of the two options
(SQuAD normalisation), and for how many it contains one as written ("Battle of Okinawa" in "the Battle of Okinawa
campaign"; not "Thomas Wolfe" in "Thomas Clayton Wolfe", a longer name a reader would still get wrong). The input is a
verl RL parquet (RouteRAG's HotpotQA training set) or a question file `routerag eval` reads; ``--exclude`` drops the
questions of a held-out file by id, so a rule is never tuned on the questions it is judged on. ``--show`` prints
that many parsed questions whose answer holds neither option, to see what the rule misreads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routerag.metrics import normalize_answer  # noqa: E402
from routerag.policy.choices import choice_options  # noqa: E402


def parquet_questions(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    """(id, question, answers) of a verl RL parquet: the question is the last user message's text after
    "Question:"."""
    import pandas as pd

    for _, row in pd.read_parquet(path).iterrows():
        text = row["prompt"][-1]["content"]
        yield (str(row["extra_info"]["original_id"]), text.split("Question:")[-1].strip(),
               [str(a) for a in row["reward_model"]["ground_truth"]["target"]])


def file_questions(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    from routerag.datasets import load_questions

    for item in load_questions(path):
        yield item.id, item.question, list(item.answers)


def held_out_ids(path: Path | None) -> set[str]:
    return {i for i, _, _ in file_questions(path)} if path else set()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("questions", type=Path)
    ap.add_argument("--exclude", type=Path, help="a question file whose ids are left out (a held-out set)")
    ap.add_argument("--show", type=int, default=0)
    args = ap.parse_args(argv)
    read = parquet_questions if args.questions.suffix == ".parquet" else file_questions
    skip = held_out_ids(args.exclude)
    n = parsed = exact = contains = 0
    misses: list[str] = []
    for qid, question, answers in read(args.questions):
        if qid in skip:
            continue
        n += 1
        options = choice_options(question)
        if not options:
            continue
        parsed += 1
        forms = [normalize_answer(o) for o in options]
        golds = [normalize_answer(a) for a in answers]
        exact += any(f == g for f in forms for g in golds)
        hit = any(f and f in g for f in forms for g in golds)
        contains += hit
        if not hit and len(misses) < args.show:
            misses.append(f"{question!r} -> {options} (answer {answers[:2]})")
    print(json.dumps({"questions": n, "excluded": len(skip), "choices": parsed, "answer_is_an_option": exact,
                      "answer_contains_an_option": contains}, indent=2))
    for line in misses:
        print(line)


if __name__ == "__main__":
    main()
