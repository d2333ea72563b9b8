"""Resumable builds and incremental updates: an interrupted build resumes without redoing finished work, and
add/delete give exactly what a full rebuild of the final corpus gives."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from graph_index.builder import Components, add_to_index, build_index, delete_from_index
from graph_index.openie.base import Extractor, OpenIEResult
from graph_index.store import IndexData
from graph_index.corpus import Passage, read_jsonl, write_jsonl

from .helpers.index_compare import assert_same_index


class Counting(Extractor):
    """Wraps the real extractor, counts passages, and can die after ``fail_after`` of them (an injected crash)."""

    def __init__(self, inner: Extractor, fail_after: int | None = None, chunk_size: int = 8) -> None:
        self.inner, self.fail_after, self.chunk_size = inner, fail_after, chunk_size
        self.identity = inner.identity
        self.seen = 0

    def extract(self, passages: Sequence[Passage]) -> Iterator[OpenIEResult]:
        for r in self.inner.extract(passages):
            if self.fail_after is not None and self.seen >= self.fail_after:
                raise RuntimeError("injected failure mid-extraction")
            self.seen += 1
            yield r


def comps(cfg, minilm, extractor) -> Components:
    return Components(cfg, embedder=minilm, extractor=extractor)


def test_killed_build_resumes_and_equals_an_uninterrupted_build(tmp_path: Path, build_cfg, minilm, spacy_extractor,
                                                               sample_corpus: Path) -> None:
    n = len(read_jsonl(sample_corpus))
    crashing = Counting(spacy_extractor, fail_after=20)
    with pytest.raises(RuntimeError, match="injected failure"):
        build_index([sample_corpus], tmp_path / "idx", build_cfg, progress=False,
                    components=comps(build_cfg, minilm, crashing))
    assert not (tmp_path / "idx").exists()  # nothing half-written
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".idx")] == []

    resumed = Counting(spacy_extractor)
    m = build_index([sample_corpus], tmp_path / "idx", build_cfg, progress=False,
                    components=comps(build_cfg, minilm, resumed))
    assert resumed.seen == n - 20  # the 20 finished before the crash came from the cache
    assert m["openie"]["cached"] == 20 and m["openie"]["extracted"] == n - 20

    # a re-run over the same corpus does no extraction work and embeds nothing
    again = Counting(spacy_extractor)
    c = comps(build_cfg, minilm, again)
    m2 = build_index([sample_corpus], tmp_path / "idx2", build_cfg, progress=False, components=c)
    assert again.seen == 0 and m2["openie"]["cached"] == n
    assert m2["embedding_cache"]["misses"] == 0

    clean_cfg = build_cfg.model_copy(update={"cache_dir": tmp_path / "other-cache"})
    build_index([sample_corpus], tmp_path / "ref", clean_cfg, progress=False,
                components=comps(clean_cfg, minilm, spacy_extractor))
    assert_same_index(IndexData(tmp_path / "idx"), IndexData(tmp_path / "ref"))


def split_corpus(sample_corpus: Path, tmp_path: Path) -> tuple[Path, Path, list[dict]]:
    rows = read_jsonl(sample_corpus)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    write_jsonl(first, rows[:24])
    write_jsonl(second, rows[20:])  # overlaps: 4 duplicates are dropped on add
    return first, second, rows


def test_add_equals_full_rebuild(tmp_path: Path, build_cfg, minilm, spacy_extractor, sample_corpus: Path) -> None:
    first, second, _ = split_corpus(sample_corpus, tmp_path)
    c = comps(build_cfg, minilm, spacy_extractor)
    build_index([first], tmp_path / "inc", build_cfg, progress=False, components=c)
    counting = Counting(spacy_extractor)
    m = add_to_index(tmp_path / "inc", [second], build_cfg, progress=False,
                     components=comps(build_cfg, minilm, counting))
    assert counting.seen == 12 and m["corpus"]["duplicates"] == 4
    assert [h["op"] for h in m["history"]] == ["build", "add"]
    assert m["synonymy"]["recomputed_entities"] < m["counts"]["entities"]  # only touched entities recomputed
    build_index([first, second], tmp_path / "full", build_cfg, progress=False, components=c)
    assert_same_index(IndexData(tmp_path / "inc"), IndexData(tmp_path / "full"))


def test_delete_equals_full_rebuild(tmp_path: Path, build_cfg, minilm, spacy_extractor, sample_corpus: Path) -> None:
    rows = read_jsonl(sample_corpus)
    c = comps(build_cfg, minilm, spacy_extractor)
    build_index([sample_corpus], tmp_path / "inc", build_cfg, progress=False, components=c)
    data = IndexData(tmp_path / "inc")
    # delete the opera's passages: their entities (and synonyms) must disappear with them
    doomed = [p for p in data.passages if "Glass Lighthouse" in p.title or p.title == "Idris Calloway"]
    assert len(doomed) == 2
    delete_from_index(tmp_path / "inc", [p.id for p in doomed], build_cfg, progress=False, components=c)
    kept = tmp_path / "kept.jsonl"
    write_jsonl(kept, [r for r in rows if r["title"] not in {p.title for p in doomed}])
    build_index([kept], tmp_path / "full", build_cfg, progress=False, components=c)
    after = IndexData(tmp_path / "inc")
    assert_same_index(after, IndexData(tmp_path / "full"))
    assert "glass lighthouse" not in after.entities or any("Glass Lighthouse" in p.text for p in after.passages)


def test_delete_unknown_id_changes_nothing(tmp_path: Path, build_cfg, components, sample_corpus: Path) -> None:
    build_index([sample_corpus], tmp_path / "idx", build_cfg, progress=False, components=components)
    before = (tmp_path / "idx" / "manifest.json").read_text()
    with pytest.raises(KeyError, match="no passages with ids: nope"):
        delete_from_index(tmp_path / "idx", ["nope"], build_cfg, progress=False, components=components)
    assert (tmp_path / "idx" / "manifest.json").read_text() == before
