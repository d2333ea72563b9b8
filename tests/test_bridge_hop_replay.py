"""benchmarks/bridge_hop_replay.py: a finished run's reads replayed with the loop's bridge hop at several thresholds;
the read without the hop reproduces the recorded EM, and only unsure answers (free spans) within the budget hop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from routerag.policy.extractive import ExtractiveReader, shipped_reader_path

from .helpers.scripts import load_script
from .test_reread_records import _records

pytestmark = pytest.mark.skipif(not (shipped_reader_path() / "reader_card.json").is_file(), reason="no shipped reader")


def test_reads_replay_the_run_and_only_unsure_spans_within_the_budget_hop(index: Path, retriever, tmp_path: Path,
                                                                          capsys) -> None:
    records = [{**r, "modes": ["graph"], "searches": 1} for r in _records(retriever, ExtractiveReader())
               if r["finish"] == "answer"]
    records[0]["searches"] = 2  # its budget spent: never hopped from
    run = tmp_path / "set" / "learned.jsonl"
    run.parent.mkdir()
    run.write_text("".join(json.dumps(r) + "\n" for r in records))
    rows_out = tmp_path / "rows.jsonl"
    load_script(Path("benchmarks/bridge_hop_replay.py")).main(
        [str(index), str(run), "--tau", "1.0", "--budget", "2", "--out", str(rows_out)])
    table = capsys.readouterr().out
    rows = [json.loads(line) for line in rows_out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in records]
    assert all(r["em_read"] == rec["em"] for r, rec in zip(rows, records))  # the read reproduces the run
    assert f"replayed: set/learned {len(records)}/{len(records)}" in table
    hopping = [r for r in rows[1:] if r["kind"] == "span" and "em_hop" in r and not r["abstained"]]
    assert hopping and all(r["bridge"] for r in hopping)
    assert table.splitlines()[2].startswith("| 0 (off) |")
    assert table.splitlines()[3].endswith(f"| {len(hopping)} |")  # every answer hops at 1.0, not the spent one


def test_a_truncated_records_file_is_named(index: Path, tmp_path: Path) -> None:
    run = tmp_path / "learned.jsonl"
    run.write_text('{"id": "q0", "question": "Where was Joran Veld born?"}\n{"id": "q1"')
    with pytest.raises(SystemExit, match=r"learned\.jsonl:1: not an evaluation record"):
        load_script(Path("benchmarks/bridge_hop_replay.py")).main([str(index), str(run)])


def test_another_readers_card_replays_and_a_missing_one_is_named(index: Path, retriever, tmp_path: Path,
                                                                 capsys) -> None:
    """``--reader`` replays with a copy's card (here the shipped weights with ``later_document_penalty``)."""
    import shutil

    records = [{**r, "modes": ["graph"], "searches": 1} for r in _records(retriever, ExtractiveReader())
               if r["finish"] == "answer"]
    run = tmp_path / "set" / "learned.jsonl"
    run.parent.mkdir()
    run.write_text("".join(json.dumps(r) + "\n" for r in records))
    copy = tmp_path / "reader"
    shutil.copytree(shipped_reader_path(), copy)
    card = json.loads((copy / "reader_card.json").read_text())
    (copy / "reader_card.json").write_text(json.dumps({**card, "later_document_penalty": 2.0}))
    script = load_script(Path("benchmarks/bridge_hop_replay.py"))
    script.main([str(index), str(run), "--tau", "1.0", "--reader", str(copy)])
    assert "replayed: set/learned" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--reader: .*nowhere.*no extractive reader here"):
        script.main([str(index), str(run), "--reader", str(tmp_path / "nowhere")])
