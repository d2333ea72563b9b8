"""``routerag search``: one query, a file of queries as JSON lines, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from routerag.cli import app

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def index(tmp_path_factory, minilm, spacy_extractor) -> Path:
    from graph_index.builder import Components, build_index
    from routerag.config import Settings

    out = tmp_path_factory.mktemp("search") / "idx"
    cfg = Settings(cache_dir=out.parent / "cache")
    build_index([FIX / "twohop.jsonl"], out, cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return out


def test_single_query_json(index: Path) -> None:
    res = CliRunner().invoke(app, ["search", str(index), "Where was Joran Veld born?", "--mode", "hybrid", "-k", "3",
                                   "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["mode"] == "hybrid" and len(doc["docs"]) == 3 and doc["ms"] > 0
    assert doc["docs"][0]["title"] == "Joran Veld"
    assert set(doc["docs"][0]) == {"id", "title", "text", "score"}


def test_queries_file_gives_one_json_line_per_query(index: Path, tmp_path: Path) -> None:
    qf = tmp_path / "q.txt"
    qf.write_text("Where was Joran Veld born?\n\nWhat does Kesh trade?\n")
    res = CliRunner().invoke(app, ["search", str(index), "--queries", str(qf), "--mode", "graph", "-k", "2", "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [d["query"] for d in lines] == ["Where was Joran Veld born?", "What does Kesh trade?"]
    assert all(d["mode"] == "graph" and len(d["docs"]) == 2 for d in lines)


def test_human_output_and_errors(index: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    res = runner.invoke(app, ["search", str(index), "amber", "--mode", "passage"])
    assert res.exit_code == 0 and "Amber" in res.output
    res = runner.invoke(app, ["search", str(index), "   "])
    assert res.exit_code == 2 and "empty query" in res.output
    res = runner.invoke(app, ["search", str(index), "x", "--mode", "web"])
    assert res.exit_code == 2 and "mode" in res.output
    res = runner.invoke(app, ["search", str(index)])
    assert res.exit_code == 2 and "--queries" in res.output
