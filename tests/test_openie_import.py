"""Importing HippoRAG OpenIE results (v1 Python-literal strings, v2 'passage' docs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_index.openie.imported import OpenIEImportError, load_openie_results
from graph_index.corpus import load_corpus

FIX = Path(__file__).parent / "fixtures"


def test_imports_both_layouts_and_matches_passages_by_content() -> None:
    passages, _ = load_corpus([FIX / "curie.jsonl"])
    results = load_openie_results(FIX / "curie_openie.json")
    matched = [results.get(p.hash) for p in passages]
    assert all(r is not None for r in matched)
    curie = matched[0]
    assert curie.entities == ["Marie Curie", "Warsaw", "Nobel Prize in Physics"]
    assert curie.triples[1] == ("Marie Curie", "born in", "Warsaw")
    assert matched[3].triples == [("Ernest Hemingway", "lived in", "United States of America")]  # 'passage' doc
    assert curie.source == "imported:curie_openie.json"


def test_malformed_docs_are_skipped_and_an_empty_file_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "o.json"
    f.write_text(json.dumps({"docs": [
        "not a doc",
        {"title": "A", "text": "a", "extracted_entities": "[unclosed", "extracted_triples": "[]"},
        {"title": "B", "text": "b", "extracted_entities": ["B"], "extracted_triples": [["B", "is", "b"], ["bad"]]},
    ]}))
    results = load_openie_results(f)
    assert len(results) == 1
    only = next(iter(results.values()))
    assert only.triples == [("B", "is", "b")]
    f.write_text("{}")
    with pytest.raises(OpenIEImportError):
        load_openie_results(f)


@pytest.mark.shared_data
def test_musique_gpt35_openie_covers_its_corpus(shared_data: Path) -> None:
    passages, _ = load_corpus([shared_data / "musique_100" / "musique_100_corpus.json"])
    results = load_openie_results(shared_data / "musique_100" / "openie_gpt-3.5-turbo-1106.json")
    covered = sum(p.hash in results for p in passages)
    assert covered == len(passages)
    assert sum(len(results[p.hash].triples) for p in passages) > 5 * len(passages)
