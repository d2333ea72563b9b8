"""The build CLI as a user meets it: summaries, JSON, and clear one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from routerag.cli import app

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture
def runner(tmp_path: Path, monkeypatch) -> CliRunner:
    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_build_prints_summary_and_info_reads_it(runner: CliRunner, tmp_path: Path, minilm) -> None:
    out = tmp_path / "idx"
    res = runner.invoke(app, ["build-graph", str(FIX / "curie.jsonl"), "--out", str(out),
                              "--openie-results", str(FIX / "curie_openie.json")])
    assert res.exit_code == 0, res.output
    for words in ("passages", "entities", "facts", "synonymy edges", "seconds per stage", "openie", "write"):
        assert words in res.output
    info = runner.invoke(app, ["info", str(out), "--json"])
    assert info.exit_code == 0, info.output
    doc = json.loads(info.stdout)
    assert doc["manifest"]["counts"]["passages"] == 5
    assert doc["graph"]["synonym_edges"] == 2
    assert doc["hubs"][0]["degree"] >= doc["hubs"][-1]["degree"]
    human = runner.invoke(app, ["info", str(out)])
    assert "top" in human.output and "st:all-MiniLM-L6-v2" in human.output


def test_bad_line_fails_with_file_and_line_and_writes_nothing(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "A", "text": "a"}\n{"title": "B", "text": oops}\n')
    out = tmp_path / "idx"
    res = runner.invoke(app, ["build-graph", str(FIX / "curie.jsonl"), str(bad), "--out", str(out)])
    assert res.exit_code == 1  # a runtime (data) error, not a usage error
    assert f"{bad}:2: invalid JSON" in res.output
    assert "Traceback" not in res.output
    assert not out.exists() and list(tmp_path.glob(".idx*")) == []


def test_skip_bad_builds_and_counts(runner: CliRunner, tmp_path: Path, minilm) -> None:
    bad = tmp_path / "mixed.jsonl"
    bad.write_text((FIX / "curie.jsonl").read_text() + "not json\n")
    out = tmp_path / "idx"
    res = runner.invoke(app, ["build-graph", str(bad), "--out", str(out), "--skip-bad", "--json",
                              "--openie-results", str(FIX / "curie_openie.json")])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["corpus"]["skipped"] == 1 and m["counts"]["passages"] == 5
    assert m["corpus"]["skipped_examples"][0].startswith(f"{bad}:6:")


@pytest.mark.parametrize("content, message", [("", "empty corpus"), ("\n\n", "empty corpus")])
def test_empty_corpus(runner: CliRunner, tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text(content)
    res = runner.invoke(app, ["build-graph", str(f), "--out", str(tmp_path / "idx")])
    assert res.exit_code == 1 and message in res.output


def test_existing_output_needs_force_and_non_index_dirs_are_never_replaced(runner: CliRunner, tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    res = runner.invoke(app, ["build-graph", str(FIX / "curie.jsonl"), "--out", str(precious)])
    assert res.exit_code == 2 and "--force" in res.output
    res = runner.invoke(app, ["build-graph", str(FIX / "curie.jsonl"), "--out", str(precious), "--force",
                              "--openie-results", str(FIX / "curie_openie.json")])
    assert res.exit_code == 2 and "not a RouteRAG index" in res.output
    assert (precious / "thesis.tex").read_text() == "do not delete"


def test_info_on_a_non_index_is_a_clear_error(runner: CliRunner, tmp_path: Path) -> None:
    res = runner.invoke(app, ["info", str(tmp_path)])
    assert res.exit_code == 2 and "not a RouteRAG index" in res.output


def test_llm_extractor_needs_an_endpoint(runner: CliRunner, tmp_path: Path) -> None:
    res = runner.invoke(app, ["build-graph", str(FIX / "curie.jsonl"), "--out", str(tmp_path / "i"), "--extractor", "llm"])
    assert res.exit_code == 2 and "--llm-model" in res.output


def test_index_add_and_delete_from_the_cli(runner: CliRunner, tmp_path: Path, minilm) -> None:
    rows = (FIX / "curie.jsonl").read_text().splitlines()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(rows[:3]) + "\n")
    b.write_text("\n".join(rows[3:]) + "\n")
    out = tmp_path / "idx"
    oie = ["--openie-results", str(FIX / "curie_openie.json")]
    assert runner.invoke(app, ["build-graph", str(a), "--out", str(out), *oie]).exit_code == 0
    res = runner.invoke(app, ["index", "add", str(out), str(b), *oie, "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["counts"]["passages"] == 5 and m["counts"]["synonymy_edges"] == 2
    chicago = json.loads(rows[4])
    from graph_index.corpus import content_hash

    res = runner.invoke(app, ["index", "delete", str(out), "--ids", content_hash(chicago["title"], chicago["text"]),
                              "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["counts"]["passages"] == 4 and m["counts"]["synonymy_edges"] == 1  # "united states" went with Chicago
    res = runner.invoke(app, ["index", "delete", str(out), "--ids", "nope"])
    assert res.exit_code == 2 and "no passages with ids: nope" in res.output


def test_skip_bad_skips_non_utf8_and_a_5mb_line(runner: CliRunner, tmp_path: Path, minilm) -> None:
    bad = tmp_path / "hostile.jsonl"
    big = json.dumps({"title": "Ledger", "text": "word " * 1_000_000})
    bad.write_bytes((FIX / "curie.jsonl").read_bytes() + b'{"title": "X", "text": "caf\xe9"}\n' + big.encode() + b"\n")
    out = tmp_path / "idx"
    oie = ["--openie-results", str(FIX / "curie_openie.json")]
    res = runner.invoke(app, ["build-graph", str(bad), "--out", str(out), *oie])
    assert res.exit_code == 1 and f"{bad}:6: not valid UTF-8" in res.output, res.output
    bad.write_bytes((FIX / "curie.jsonl").read_bytes() + big.encode() + b"\n")
    res = runner.invoke(app, ["build-graph", str(bad), "--out", str(out), *oie])
    assert res.exit_code == 1 and f"{bad}:6: passage of 5,000,005 characters, over corpus.max_passage_chars" \
        in res.output and "E088" not in res.output, res.output
    assert not out.exists()

    bad.write_bytes((FIX / "curie.jsonl").read_bytes() + b'{"title": "X", "text": "caf\xe9"}\n' + big.encode() + b"\n")
    res = runner.invoke(app, ["build-graph", str(bad), "--out", str(out), "--skip-bad", *oie])
    assert res.exit_code == 0 and "2 (invalid utf8 1, oversize 1)" in res.output, res.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["passages"] == 5
    assert m["corpus"]["skipped_by_kind"] == {"invalid_utf8": 1, "oversize": 1}
