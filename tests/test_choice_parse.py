"""benchmarks/choice_parse.py: the choice rule measured on question text, a held-out file's ids left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers.scripts import load_script


def test_choices_and_option_answers_are_counted_and_held_out_ids_left_out(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    rows = [{"id": "a", "question": "Who was born first Busby Berkeley or Billy Bob Thornton ?",
             "answers": ["Busby Berkeley"]},
            {"id": "b", "question": "Which is older, Meyer Schapiro or Thomas Wolfe?",
             "answers": ["Thomas Clayton Wolfe"]},
            {"id": "c", "question": "Where was Joran Veld born?", "answers": ["Tarsk"]},
            {"id": "d", "question": "Which opened first, the Railway or the Light?", "answers": ["Light"]}]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps(rows[3]) + "\n")
    load_script(Path("benchmarks/choice_parse.py")).main([str(questions), "--exclude", str(held), "--show", "5"])
    out = capsys.readouterr().out
    counts = json.loads(out[: out.index("}") + 1])
    assert counts == {"questions": 3, "excluded": 1, "choices": 2, "answer_is_an_option": 1,
                      "answer_contains_an_option": 1}
    assert "Thomas Clayton Wolfe" in out  # a longer name holds neither option as written: shown as a miss
