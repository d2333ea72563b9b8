"""Corpus input: formats, stable ids, duplicates, and bad input reported as file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_index.corpus import CorpusError, content_hash, load_corpus


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_ids_are_content_hashes_unless_given(tmp_path: Path) -> None:
    f = write(tmp_path / "c.jsonl", '{"title": "A", "text": "alpha"}\n\n{"id": "x7", "title": "B", "text": "beta"}\n')
    passages, report = load_corpus([f])
    assert [p.id for p in passages] == [content_hash("A", "alpha"), "x7"]
    assert passages[0].content == "A\nalpha"
    assert report.records == 2 and report.duplicates == 0
    # the same content always gets the same id, whatever the file or whitespace
    again, _ = load_corpus([write(tmp_path / "d.jsonl", '{"title": " A ", "text": "alpha  "}\n')])
    assert again[0].id == passages[0].id


def test_hipporag_json_list_and_hotpot_object(tmp_path: Path) -> None:
    lst = write(tmp_path / "c.json", json.dumps([{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]))
    obj = write(tmp_path / "h.json", json.dumps({"C": ["Gamma one.", " Gamma two."], "D": "delta"}))
    passages, report = load_corpus([lst, obj])
    assert [(p.title, p.text) for p in passages] == [("A", "alpha"), ("B", "beta"), ("C", "Gamma one. Gamma two."),
                                                     ("D", "delta")]
    assert report.files == [str(lst), str(obj)]


def test_duplicates_across_files_are_dropped_and_counted(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", '{"title": "A", "text": "alpha"}\n{"title": "A", "text": "alpha"}\n')
    b = write(tmp_path / "b.json", '[{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]')
    passages, report = load_corpus([a, b])
    assert len(passages) == 2 and report.duplicates == 2 and report.records == 4


@pytest.mark.parametrize(
    "content, line, reason",
    [
        ('{"title": "A", "text": "alpha"}\n{"title": "B", "text": \n', 2, "invalid JSON"),
        ('{"title": "A", "text": "alpha"}\n\n["not", "an", "object"]\n', 3, "expected an object"),
        ('{"title": "A"}\n', 1, "missing 'text'"),
        ('{"title": "A", "text": "   "}\n', 1, "empty 'text'"),
        ('{"title": 5, "text": "x"}\n', 1, "'title' must be a string"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path: Path, content: str, line: int, reason: str) -> None:
    f = write(tmp_path / "bad.jsonl", content)
    with pytest.raises(CorpusError) as err:
        load_corpus([f])
    assert str(err.value).startswith(f"{f}:{line}: ")
    assert reason in str(err.value)


def test_malformed_json_list_names_the_line_of_the_element(tmp_path: Path) -> None:
    f = write(tmp_path / "bad.json", '[\n  {"title": "A", "text": "alpha"},\n  {"title": "B"},\n  {"title": "C", "text": "c"}\n]\n')
    with pytest.raises(CorpusError, match=rf"^{f}:3: missing 'text'"):
        load_corpus([f])
    broken = write(tmp_path / "broken.json", '[\n {"title": "A", "text": "alpha"},\n {"title": "B" "text": "b"}\n]')
    with pytest.raises(CorpusError, match=rf"^{broken}:3: invalid JSON"):
        load_corpus([broken])


def test_skip_bad_skips_and_counts(tmp_path: Path) -> None:
    f = write(tmp_path / "c.jsonl", '{"title": "A", "text": "alpha"}\nnot json\n{"text": 3}\n{"title": "B", "text": "b"}\n')
    passages, report = load_corpus([f], skip_bad=True)
    assert [p.title for p in passages] == ["A", "B"]
    assert len(report.skipped) == 2
    assert report.skipped[0].startswith(f"{f}:2: invalid JSON")


def test_empty_corpus_is_a_clear_error(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty.jsonl", "\n\n")
    with pytest.raises(CorpusError, match="empty corpus"):
        load_corpus([empty])
    only_bad = write(tmp_path / "bad.jsonl", "nope\n")
    with pytest.raises(CorpusError, match=r"empty corpus.*1 malformed records skipped"):
        load_corpus([only_bad], skip_bad=True)
    with pytest.raises(CorpusError, match="no such file"):
        load_corpus([tmp_path / "missing.jsonl"])


def test_same_id_for_different_passages_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path / "c.jsonl", '{"id": "1", "title": "A", "text": "a"}\n{"id": "1", "title": "B", "text": "b"}\n')
    with pytest.raises(CorpusError, match=rf"^{f}:2: id '1' already used"):
        load_corpus([f])


def test_non_utf8_lines_are_located_and_skipped_per_kind(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_bytes(b'{"title": "A", "text": "alpha"}\n{"title": "B", "text": "caf\xe9"}\n'
                  b'{"title": "C", "text": "\\ud800 lone"}\nnot json\n{"title": "D", "text": "delta"}\n')
    with pytest.raises(CorpusError, match=rf"^{f}:2: not valid UTF-8 \(byte 0xe9"):
        load_corpus([f])
    passages, report = load_corpus([f], skip_bad=True)
    assert [p.title for p in passages] == ["A", "D"]
    assert report.skipped_by_kind == {"invalid_utf8": 2, "invalid_json": 1}
    assert report.skipped[1].startswith(f"{f}:3: 'text' is not valid UTF-8")


def test_non_utf8_inside_a_json_list_is_one_bad_record(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_bytes(b'[\n {"title": "A", "text": "alpha"},\n {"title": "B", "text": "caf\xe9"},\n'
                  b' {"title": "C", "text": "gamma"}\n]\n')
    with pytest.raises(CorpusError, match=rf"^{f}:3: 'text' is not valid UTF-8"):
        load_corpus([f])
    passages, report = load_corpus([f], skip_bad=True)
    assert [p.title for p in passages] == ["A", "C"] and report.skipped_by_kind == {"invalid_utf8": 1}


def five_mb_corpus(tmp_path: Path) -> Path:
    big = " ".join(f"The ledger lists ship {i}." for i in range(200_000))[:5_000_000]
    return write(tmp_path / "big.jsonl", json.dumps({"title": "A", "text": "alpha"}) + "\n"
                 + json.dumps({"id": "ledger", "title": "Ledger", "text": big}) + "\n"
                 + json.dumps({"title": "C", "text": "gamma"}) + "\n")


def test_an_oversize_passage_is_a_located_error_or_skipped_with_skip_bad(tmp_path: Path) -> None:
    f = five_mb_corpus(tmp_path)
    with pytest.raises(CorpusError, match=rf"^{f}:2: passage of 5,000,006 characters, over "
                                          r"corpus.max_passage_chars \(100,000\)"):
        load_corpus([f])
    passages, report = load_corpus([f], skip_bad=True)
    assert [p.title for p in passages] == ["A", "C"] and report.skipped_by_kind == {"oversize": 1}
    passages, report = load_corpus([f], oversize="skip")  # skipped and counted without --skip-bad too
    assert len(passages) == 2 and report.skipped_by_kind == {"oversize": 1}


def test_an_oversize_passage_can_be_split_at_breaks(tmp_path: Path) -> None:
    f = five_mb_corpus(tmp_path)
    passages, report = load_corpus([f], oversize="split", max_passage_chars=100_000)
    parts = [p for p in passages if p.title == "Ledger"]
    assert report.split == 1 and len(parts) == 51 and report.duplicates == 0
    assert [p.id for p in parts[:3]] == ["ledger#1", "ledger#2", "ledger#3"]
    assert all(len(p.title) + len(p.text) <= 100_000 for p in parts)
    assert all(p.text.endswith(".") for p in parts[:-1])  # cut at sentence ends, not mid-word
    original = json.loads(f.read_text().splitlines()[1])["text"]
    assert " ".join(p.text for p in parts).split() == original.split()


def test_a_line_over_the_line_limit_is_located_and_never_held_whole(tmp_path: Path, monkeypatch) -> None:
    import graph_index.corpus as corpus

    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 1000)
    f = write(tmp_path / "c.jsonl", '{"title": "A", "text": "alpha"}\n' + '{"title": "B", "text": "' + "b" * 5000
              + '"}\n{"title": "C", "text": "gamma"}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: line longer than 1,000 bytes"):
        load_corpus([f])
    passages, report = load_corpus([f], skip_bad=True)
    assert [p.title for p in passages] == ["A", "C"] and report.skipped_by_kind == {"oversize": 1}


def test_iter_corpus_yields_every_passage_once(tmp_path: Path) -> None:
    from graph_index.corpus import LoadReport, iter_corpus

    f = write(tmp_path / "c.jsonl", "".join(f'{{"title": "T{i}", "text": "text {i}"}}\n' for i in range(10))
              + '{"title": "T0", "text": "text 0"}\n')
    report = LoadReport()
    passages = list(iter_corpus([f], report))
    assert [p.title for p in passages] == [f"T{i}" for i in range(10)]
    assert report.records == 11 and report.duplicates == 1


STREAM_PROBE = r"""
import resource, sys
from graph_index.corpus import LoadReport, iter_corpus
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = sum(1 for _ in iter_corpus([sys.argv[1]], LoadReport()))
print(n, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def test_a_large_jsonl_streams_with_bounded_memory(tmp_path: Path) -> None:
    """Reading a 200 MB JSONL passage by passage: the reader's peak RSS grows by a small fraction of the file."""
    import os
    import subprocess
    import sys

    f = tmp_path / "big.jsonl"
    body = "word " * 4000
    with open(f, "w") as out:
        for i in range(10_000):
            out.write(f'{{"title": "P{i}", "text": "{i} {body}"}}\n')
    size = f.stat().st_size
    assert size > 190e6
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", STREAM_PROBE, str(f)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    n, grown = (int(v) for v in res.stdout.split())
    assert n == 10_000
    assert grown < size / 10, f"peak RSS grew by {grown / 2**20:.0f} MB reading a {size / 2**20:.0f} MB file"
