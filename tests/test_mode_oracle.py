"""benchmarks/mode_oracle.py's scoring: the harness's EM for an abstaining reader, the per-question oracle over the
modes, the most confident mode, and refusal precision and recall as the threshold moves."""

from __future__ import annotations

from pathlib import Path

from .helpers.scripts import load_script


def _mode_oracle():
    return load_script(Path("benchmarks/mode_oracle.py"))


def _read(answer: str | None, score: float, em: float) -> dict:
    return {"answer": answer, "score": score, "em": em}


ROWS = [
    # answerable: passage right but unsure, graph wrong and sure
    {"answers": ["Oslo"], "passage": _read("Oslo", 0.4, 1.0), "graph": _read("Bergen", 0.9, 0.0),
     "hybrid": _read("Bergen", 0.8, 0.0), "union": _read("Bergen", 0.9, 0.0)},
    # unanswerable: graph abstains below the threshold, the others answer
    {"answers": [], "passage": _read("1901", 0.3, 0.0), "graph": _read("x", 0.005, 0.0),
     "hybrid": _read("y", 0.2, 0.0), "union": _read("y", 0.2, 0.0)},
]


def test_columns_score_abstentions_as_the_harness_does_and_the_oracle_takes_each_questions_best() -> None:
    mo = _mode_oracle()
    assert mo.scored(ROWS[0], ROWS[0]["passage"], 0.01) == 1.0
    assert mo.scored(ROWS[0], ROWS[0]["passage"], 0.5) == 0.0  # an abstention on an answerable question
    assert mo.scored(ROWS[1], ROWS[1]["graph"], 0.01) == 1.0  # an abstention on an unanswerable one
    cols = mo.columns(ROWS, 0.01)
    assert cols["passage"] == 1.0 and cols["graph"] == 1.0 and cols["hybrid"] == 0.0
    assert cols["oracle"] == 2.0
    assert cols["confident"] == 0.0  # the surest answers are the wrong graph one and the unanswerable passage one


def test_only_a_free_span_abstains() -> None:
    """The reader's choice and yes/no reads answer whatever their score, as in the loop."""
    mo = _mode_oracle()
    chosen = {**ROWS[0]["passage"], "kind": "option", "score": 0.001}
    assert mo.scored(ROWS[0], chosen, 0.01) == 1.0 and not mo.abstains(chosen, 0.5)
    assert mo.abstains({**chosen, "kind": "span"}, 0.01)
    unsure = {**chosen, "kind": "span", "score": 0.02}  # above the threshold, below the card's unsupported band
    assert not mo.abstains(unsure, 0.01) and not mo.abstains({**unsure, "supported": True}, 0.01)
    assert mo.abstains({**unsure, "supported": False}, 0.01)
    assert not mo.abstains({**unsure, "score": 0.5, "supported": False}, 0.01)


def test_refusals_trade_precision_for_recall_as_the_threshold_rises() -> None:
    lines = _mode_oracle().refusals(ROWS, "graph", (0.001, 0.01, 0.95)).splitlines()
    assert lines[2] == "| 0.001 | 0 | — | 0.00 | 0.0 |"
    assert lines[3] == "| 0.01 | 1 | 1.00 | 1.00 | 50.0 |"  # graph is wrong on the answerable one
    assert lines[4] == "| 0.95 | 2 | 0.50 | 1.00 | 50.0 |"


def test_table_pools_the_sets(tmp_path: Path) -> None:
    import json

    files = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
        files.append(path)
    out = _mode_oracle().table(files, 0.01).splitlines()
    assert out[2].startswith("| a | 2 | 50.0 | 50.0 | 0.0 |") and out[-1].startswith("| pooled | 4 | 50.0 |")
    assert out[-1].endswith("| 100.0 | 0.0 |")
