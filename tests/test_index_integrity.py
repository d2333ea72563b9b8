"""A damaged index is caught and named: truncated files and count mismatches fail at open or load with the file's
path (``routerag info`` exits non-zero), and ``routerag info --verify`` catches a changed byte by checksum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graph_index.layout import CSR_FILES
from graph_index.store import IndexData, IndexFormatError
from routerag.cli import app
from routerag.config import RetrievalConfig
from routerag.retrieval import Retriever

from .helpers.curie_index import build_curie_index, writable_copy


@pytest.fixture(scope="module")
def base(tmp_path_factory, minilm) -> Path:
    return build_curie_index(tmp_path_factory.mktemp("integrity"), minilm)


@pytest.fixture
def idx(base: Path, tmp_path: Path) -> Path:
    return writable_copy(base, tmp_path)


@pytest.fixture
def runner(monkeypatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner()


def truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def forget_file_records(idx: Path) -> None:
    """Make the manifest look like one written before it recorded sizes and checksums."""
    mf = idx / "manifest.json"
    m = json.loads(mf.read_text())
    del m["files"]
    mf.write_text(json.dumps(m))


def test_the_manifest_records_every_data_file(idx: Path) -> None:
    m = json.loads((idx / "manifest.json").read_text())
    assert set(m["files"]) == {"passages.jsonl", "openie.jsonl", "entities.jsonl", "facts.jsonl", "synonyms.jsonl",
                               "passage_embeddings.npy", "entity_embeddings.npy", "fact_embeddings.npy",
                               "fact_embeddings.f16.npy", "passages.faiss", "graph.graphml", *CSR_FILES}
    rec = m["files"]["entity_embeddings.npy"]
    assert rec["shape"] == [m["counts"]["entities"], 384] and len(rec["sha256"]) == 64
    assert m["files"]["passages.jsonl"]["rows"] == 5


@pytest.mark.parametrize("recorded", [True, False], ids=["with-sizes", "older-manifest"])
@pytest.mark.parametrize("name", ["passage_embeddings.npy", "entity_embeddings.npy", "passages.faiss",
                                  "graph.graphml", "passages.jsonl", "entities.jsonl"])
def test_a_truncated_file_is_named_and_info_fails(idx: Path, runner: CliRunner, name: str, recorded: bool) -> None:
    if not recorded:
        forget_file_records(idx)
    truncate(idx / name)
    res = runner.invoke(app, ["info", str(idx)])
    assert res.exit_code == 1, res.output  # a damaged index is a runtime error
    assert name in res.output and "Traceback" not in res.output
    with pytest.raises(IndexFormatError, match=name) as err:
        with IndexData(idx) as data:
            data.check()
    assert err.value.path is not None and err.value.path.name in (name, "idx")


def test_a_truncated_entity_array_fails_at_open_not_at_a_later_delete(idx: Path, minilm) -> None:
    truncate(idx / "entity_embeddings.npy", keep=0.9)
    forget_file_records(idx)  # even without recorded sizes: the .npy header says how long the file must be
    with pytest.raises(IndexFormatError, match=r"entity_embeddings\.npy: .* its header needs"):
        Retriever(idx, RetrievalConfig(), embedder=minilm)


def test_a_count_mismatch_is_named_not_a_numpy_broadcast_error(idx: Path, runner: CliRunner, minilm) -> None:
    forget_file_records(idx)
    ents = idx / "entities.jsonl"
    ents.write_text("".join(ents.read_text().splitlines(keepends=True)[:-1]))  # one entity row lost
    res = runner.invoke(app, ["info", str(idx)])
    assert res.exit_code == 1 and "entities.jsonl" in res.output and "broadcast" not in res.output, res.output
    for name in CSR_FILES:  # an index from before the compact graph: converting it reads entities.jsonl
        (idx / name).unlink()
    retriever = Retriever(idx, RetrievalConfig(), embedder=minilm)
    with pytest.raises(IndexFormatError, match=r"entities\.jsonl: .* rows, the manifest says"):
        retriever.search(["Who discovered radium?"], mode="graph", k=2)


def test_info_verify_catches_a_changed_byte(idx: Path, runner: CliRunner) -> None:
    res = runner.invoke(app, ["info", str(idx), "--verify"])
    assert res.exit_code == 0 and "verified  21 files" in res.output, res.output
    # same size, still valid JSON: only the checksum can tell
    p = idx / "passages.jsonl"
    text = p.read_text()
    p.write_text(text.replace("Curie", "Curia", 1))
    assert p.stat().st_size == len(text.encode())
    assert runner.invoke(app, ["info", str(idx)]).exit_code == 0  # structurally fine
    res = runner.invoke(app, ["info", str(idx), "--verify"])
    assert res.exit_code == 1 and "failed verification" in res.output and f"{p.resolve()}: sha256" in res.output


def test_info_verify_catches_a_flipped_bit_in_an_array(idx: Path, runner: CliRunner) -> None:
    p = idx / "fact_embeddings.npy"
    data = bytearray(p.read_bytes())
    data[-5] ^= 0x01
    p.write_bytes(bytes(data))
    res = runner.invoke(app, ["info", str(idx), "--verify", "--json"])
    assert res.exit_code == 1 and "fact_embeddings.npy: sha256" in res.output


def test_verify_needs_recorded_checksums(idx: Path, runner: CliRunner) -> None:
    forget_file_records(idx)
    assert runner.invoke(app, ["info", str(idx)]).exit_code == 0
    res = runner.invoke(app, ["info", str(idx), "--verify"])
    assert res.exit_code == 1 and "records no checksums" in res.output
