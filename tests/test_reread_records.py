"""benchmarks/reread_records.py: a finished run's documents read again with other reader cards; the card that ran
reproduces every recorded answer, and a stricter card's refusals are scored as the harness scores them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from routerag.metrics import exact_match
from routerag.policy.extractive import READER_CARD, ExtractiveReader, shipped_reader_path

from .helpers.scripts import load_script

QUESTIONS = [("Where was Joran Veld born?", ["Tarsk"]), ("What did Joran Veld become?", ["glassblower"]),
             ("Who designed the harbour of Tarsk?", [])]


def _records(retriever, reader: ExtractiveReader) -> list[dict]:
    """Records as `routerag eval` writes them (the fields the re-read uses), answered by ``reader``."""
    out = []
    for i, (question, answers) in enumerate(QUESTIONS):
        docs = list(retriever.search([question], mode="graph", k=3)[0].docs)
        read = reader.read_sync(question, docs)
        answerable = bool(answers)
        em = (0.0 if read.abstained else exact_match(read.answer, answers)) if answerable else float(read.abstained)
        out.append({"id": f"q{i}", "question": question, "answers": answers, "answerable": answerable,
                    "prediction": read.answer, "refused": read.abstained, "em": em, "finish": "answer",
                    "answer_recall": 1.0 if answerable else None, "doc_ids": [d.id for d in docs]})
    out.append({**out[0], "id": "q-unread", "prediction": None, "refused": False, "em": 0.0, "finish": "no_answer"})
    return out


def test_the_card_that_ran_changes_nothing_and_a_stricter_card_refuses(index: Path, retriever, tmp_path: Path,
                                                                        capsys) -> None:
    run = tmp_path / "run" / "set"
    run.mkdir(parents=True)
    records = _records(retriever, ExtractiveReader())
    (run / "learned.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    strict = tmp_path / "strict-reader"
    shutil.copytree(shipped_reader_path(), strict)
    card = json.loads((strict / READER_CARD).read_text())
    (strict / READER_CARD).write_text(json.dumps({**card, "abstain_below": 1.0}))

    out = tmp_path / "rows.jsonl"
    load_script(Path("benchmarks/reread_records.py")).main(
        [str(index), str(tmp_path / "run"), "--reader", "shipped", "--reader", str(strict), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    shipped = [r for r in rows if r["reader"] == "shipped"]
    assert [r["prediction"] for r in shipped] == [r["prediction"] for r in records]
    assert not any(r["changed"] for r in shipped)

    strict_rows = {r["id"]: r for r in rows if r["reader"] == str(strict)}
    assert all(strict_rows[f"q{i}"]["refused"] for i in range(3))  # every free span is below 1.0
    assert strict_rows["q2"]["em"] == 1.0 and strict_rows["q0"]["em"] == 0.0  # a right refusal counts 1
    assert strict_rows["q-unread"]["refused"] is False  # never read: its recorded outcome stands
    table = capsys.readouterr().out
    pooled_strict = next(line for line in table.splitlines() if line.startswith(f"| pooled | learned | {strict} "))
    assert "| 4 | 25.0 | 3 | 0.33 | 1.00 |" in pooled_strict


def test_a_truncated_record_file_is_named_with_its_line(index: Path, tmp_path: Path) -> None:
    run = tmp_path / "run" / "set"
    run.mkdir(parents=True)
    (run / "learned.jsonl").write_text('{"id": "q0", "question": "Where was Joran Veld born?"}\n{"id": "q1", "que')
    main = load_script(Path("benchmarks/reread_records.py")).main
    with pytest.raises(SystemExit, match=r"learned\.jsonl:1: not an evaluation record \(missing answers"):
        main([str(index), str(tmp_path / "run"), "--reader", "shipped"])
    with pytest.raises(SystemExit, match="no <set>/<strategy>.jsonl records"):
        main([str(index), str(tmp_path), "--reader", "shipped"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "reader_card.json").write_text('{"later_document_penalty": -1}')
    with pytest.raises(SystemExit, match=r"--reader: .*nowhere.*no extractive reader here"):
        main([str(index), str(tmp_path / "run"), "--reader", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit, match=r"--reader: .*reader_card\.json: not a valid reader card"):
        main([str(index), str(tmp_path / "run"), "--reader", str(tmp_path / "bad")])


def test_a_records_documents_come_back_in_order_and_a_foreign_id_is_named(index: Path) -> None:
    from graph_index.store import IndexData
    from routerag.datasets import DatasetError
    from routerag.evaluation.records import record_documents

    with IndexData(index) as data:
        passages = {p.id: p for p in data.passages}
    second, first = list(passages)[:2]
    record = {"id": "q0", "doc_ids": [first, "not-in-this-index", second]}
    docs = record_documents(record, passages)
    assert [(d.id, d.title, d.text) for d in docs] == [(i, passages[i].title, passages[i].text) for i in (first, second)]
    with pytest.raises(DatasetError, match=r"record q0: documents \['not-in-this-index'\] are not in this index"):
        record_documents(record, passages, strict=True)


def test_cards_with_the_same_weights_share_one_forward_pass(tmp_path: Path) -> None:
    """Two cards of one weight set (the shipped one, and a copy with ``whole_names`` off) run the model once per
    record; the answers are the ones each reads alone, and they differ."""
    from routerag.retrieval.types import RetrievedDoc

    script = load_script(Path("benchmarks/reread_records.py"))
    cut = tmp_path / "cut"
    shutil.copytree(shipped_reader_path(), cut)
    card = json.loads((cut / READER_CARD).read_text())
    (cut / READER_CARD).write_text(json.dumps({**card, "whole_names": False}))
    docs = [RetrievedDoc("k", "Kestrel", "The Kestrel was a locomotive built by the Brackwater Engine Works in 1860.",
                         1.0)]
    alone = [ExtractiveReader(folder).read_sync("Who built the Kestrel?", docs).answer for folder in (None, cut)]
    readers = {"shipped": ExtractiveReader(), "cut": ExtractiveReader(cut)}
    script.share_forward(readers)
    assert readers["shipped"].model is readers["cut"].model
    calls = []
    inner = readers["shipped"].model.model
    readers["shipped"].model.model = lambda *a: calls.append(1) or inner(*a)
    shared = [r.read_sync("Who built the Kestrel?", docs).answer for r in readers.values()]
    assert shared == alone == ["Brackwater Engine Works", "Brackwater Engine"] and len(calls) == 1
