"""Copying an index (issue 34, item 11): ``cp -r`` of an index copies its link, not its data, so ``index snapshot``
writes one verified, self-contained file and ``index restore`` publishes it as a new version under the write lock.
A snapshot restores to an equal index (the same top 10 in every mode); a truncated or damaged one is refused by name
with the index untouched; restore waits for, and never interleaves with, another writer; ``info`` on a ``cp -r``
copy says what happened."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graph_index import versions
from graph_index.builder import Components, add_to_index, build_index
from graph_index.layout import IndexFormatError
from graph_index.lock import IndexBusyError, index_lock
from graph_index.snapshot import SnapshotError, restore_snapshot, write_snapshot
from graph_index.store import IndexData
from routerag.cli import app
from routerag.config import RetrievalConfig, Settings
from routerag.retrieval import Retriever

from .helpers.index_compare import assert_same_index

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
QUESTIONS = ["In which city was the composer of The Glass Lighthouse born?", "Who designed the Halvard Opera House?",
             "Which river flows through Kestrel Harbor?", "university of sarnow founder"]
runner = CliRunner()


@pytest.fixture(scope="module")
def base(tmp_path_factory, minilm, spacy_extractor) -> Path:
    """The sample corpus (36 passages, more than a top 10) as an index, built once; tests copy or only read it."""
    d = tmp_path_factory.mktemp("snap")
    cfg = Settings(cache_dir=d / "cache")
    build_index([ROOT / "samples" / "corpus.jsonl"], d / "idx", cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return d


@pytest.fixture
def work(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base, tmp_path / "w", symlinks=True)  # the link and its version travel together
    return tmp_path / "w"


@pytest.fixture(scope="module")
def snap(base: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("snapshots")
    return Path(write_snapshot(base / "idx", out)["path"])


def top10(index: Path, minilm) -> dict[str, list[list[tuple[str, float]]]]:
    r = Retriever(index, RetrievalConfig(device="cpu"), embedder=minilm)
    return {mode: [[(d.id, round(d.score, 5)) for d in res.docs] for res in r.search(QUESTIONS, mode, 10)]
            for mode in ("passage", "graph", "hybrid")}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".link-" in p.name)


def test_a_snapshot_restores_to_an_equal_index(base: Path, tmp_path: Path, minilm) -> None:
    res = runner.invoke(app, ["index", "snapshot", str(base / "idx"), str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "sha256 verified" in res.output
    [snapshot] = tmp_path.glob("idx.v0001.*.snapshot.tar")
    res = runner.invoke(app, ["index", "restore", str(snapshot), str(tmp_path / "copy" / "idx")])
    assert res.exit_code == 0, res.output
    restored = tmp_path / "copy" / "idx"
    assert restored.is_symlink() and os.readlink(restored) == ".idx.v0001"
    res = runner.invoke(app, ["info", str(restored), "--verify"])
    assert res.exit_code == 0 and "sha256 as recorded" in res.output, res.output
    with IndexData(base / "idx") as a, IndexData(restored) as b:
        assert_same_index(a, b)
        assert a.manifest == b.manifest
    want, got = top10(base / "idx", minilm), top10(restored, minilm)
    assert got == want
    assert all(len(ranked) == 10 for mode in want.values() for ranked in mode)  # a real top 10, in every mode


def test_restore_refuses_to_overwrite_without_force_then_publishes_a_new_version(work: Path, snap: Path) -> None:
    idx = work / "idx"
    res = runner.invoke(app, ["index", "restore", str(snap), str(idx)])
    assert res.exit_code == 2 and "already exists; pass --force" in res.output
    assert os.readlink(idx) == ".idx.v0001"
    res = runner.invoke(app, ["index", "restore", str(snap), str(idx), "--force"])
    assert res.exit_code == 0, res.output
    assert os.readlink(idx) == ".idx.v0002" and sorted(versions.versions(idx)) == [1, 2]
    with IndexData(idx) as data:
        assert data.verify() > 0


@pytest.mark.parametrize("cut", ["header", "middle", "last-member", "one-byte"])
def test_a_truncated_snapshot_is_refused_by_name_and_the_index_is_untouched(work: Path, snap: Path,
                                                                          cut: str) -> None:
    data = snap.read_bytes()
    last = max(data.rfind(b"fact_embeddings.f16.npy"), data.rfind(b"graph.graphml"))
    keep = {"header": 700, "middle": len(data) // 2, "last-member": last + 600, "one-byte": 1}[cut]
    bad = work / f"cut-{cut}.snapshot.tar"
    bad.write_bytes(data[:keep])
    idx = work / "idx"
    with pytest.raises(SnapshotError, match=rf"^{bad}: .*(truncated|not a RouteRAG snapshot)"):
        restore_snapshot(bad, idx, force=True)
    assert os.readlink(idx) == ".idx.v0001" and sorted(versions.versions(idx)) == [1]
    assert leftovers(work) == [] and not (work / ".idx.lock").exists()
    res = runner.invoke(app, ["index", "restore", str(bad), str(work / "fresh")])
    assert res.exit_code == 1 and str(bad) in res.output
    assert not (work / "fresh").exists() and not (work / "fresh").is_symlink()


def test_a_damaged_snapshot_member_is_refused_by_name(work: Path, snap: Path) -> None:
    data = bytearray(snap.read_bytes())
    at = data.find(b'"title"')  # inside passages.jsonl: the same size, other bytes
    data[at + 2] ^= 0x01
    bad = work / "damaged.snapshot.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=r"member passages.jsonl: .*truncated or damaged"):
        restore_snapshot(bad, work / "idx", force=True)
    assert os.readlink(work / "idx") == ".idx.v0001"


def test_a_snapshot_of_a_damaged_index_is_refused_and_writes_nothing(work: Path, tmp_path: Path) -> None:
    version = (work / "idx").resolve()
    text = (version / "passages.jsonl").read_bytes()
    (version / "passages.jsonl").write_bytes(text.replace(b"Oreland", b"Orelanx", 1))  # same size, other bytes
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(IndexFormatError, match=r"passages.jsonl: sha256 .*nothing was written"):
        write_snapshot(work / "idx", out)
    assert list(out.iterdir()) == []


def test_restore_waits_for_another_writer_and_never_interleaves(work: Path, snap: Path, minilm,
                                                                spacy_extractor) -> None:
    idx = work / "idx"
    (work / "b.jsonl").write_text('{"id": "extra-1", "title": "Ferry of Venn", "text": "The Venn ferry crosses the '
                                  'Ossel at Kestrel Harbor twice a day."}\n', encoding="utf-8")
    with index_lock(idx, op="test holder"):
        with pytest.raises(IndexBusyError, match="test holder"):
            restore_snapshot(snap, idx, force=True, lock_timeout=0.3)
    assert os.readlink(idx) == ".idx.v0001"

    reader = IndexData(idx)  # a server that opened version 1 keeps reading it throughout
    start, errors = threading.Barrier(2), []

    def run(fn) -> None:  # noqa: ANN001
        try:
            start.wait()
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    cfg = Settings(cache_dir=work / "cache")
    writers = [threading.Thread(target=run, args=(lambda: add_to_index(
                   idx, [work / "b.jsonl"], cfg, progress=False, lock_timeout=120,
                   components=Components(cfg, embedder=minilm, extractor=spacy_extractor)),)),
               threading.Thread(target=run, args=(lambda: restore_snapshot(snap, idx, force=True, lock_timeout=120),))]
    for t in writers:
        t.start()
    for t in writers:
        t.join(300)
    assert not errors, errors
    with IndexData(idx) as data:
        assert data.verify() > 0
        ids = {p.id for p in data.passages}
        add_was_last = data.manifest["history"][-1]["op"] == "add"
    assert ("extra-1" in ids) == add_was_last  # one whole write after the other, in either order
    assert len(ids) == 36 + add_was_last
    assert sorted(versions.versions(idx))[-1] == 3 and leftovers(work) == []
    assert len(reader.passages) == 36 and reader.verify() > 0
    reader.close()


def test_info_on_a_cp_r_copy_says_what_happened(work: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "backup"
    elsewhere.mkdir()
    os.symlink(os.readlink(work / "idx"), elsewhere / "idx")  # what `cp -r indexes/idx backup/` copies: the link
    res = runner.invoke(app, ["info", str(elsewhere / "idx")])
    assert res.exit_code == 1
    for words in ("links to .idx.v0001, which is missing", "cp -r", "routerag index snapshot"):
        assert words in res.output
    # in the same folder the copy resolves, to the original's files: info says so
    os.symlink(os.readlink(work / "idx"), work / "copy")
    res = runner.invoke(app, ["info", str(work / "copy")])
    assert res.exit_code == 0 and "a version of" in res.output and "not a copy" in res.output
    # restoring a snapshot over the dangling copy needs no --force: it holds nothing
    snapshot = write_snapshot(work / "idx", tmp_path)["path"]
    res = runner.invoke(app, ["index", "restore", snapshot, str(elsewhere / "idx")])
    assert res.exit_code == 0, res.output
    assert os.readlink(elsewhere / "idx") == ".idx.v0001"
