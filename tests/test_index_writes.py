"""Index writes cannot lose the index: one writer at a time (concurrent updates all land, or one is refused
clearly), a write killed at any step leaves a complete index at the path, leftovers of killed writes are cleaned,
old versions go only when no reader holds them, and plain-directory indexes migrate."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from graph_index import builder, forked, store, versions
from graph_index.builder import Components, add_to_index, build_index, delete_from_index
from graph_index.lock import IndexBusyError, index_lock
from graph_index.store import IndexData
from routerag.cli import app
from routerag.config import Settings
from graph_index.corpus import read_jsonl, write_jsonl
from graph_index.embedders import Embedder

FIX = Path(__file__).parent / "fixtures"
OIE = FIX / "curie_openie.json"


@pytest.fixture(scope="module")
def base(tmp_path_factory, minilm) -> Path:
    """The first three Curie passages as an index (plus the two others as one-passage files), built once."""
    d = tmp_path_factory.mktemp("writes")
    rows = read_jsonl(FIX / "curie.jsonl")
    write_jsonl(d / "a.jsonl", rows[:3])
    write_jsonl(d / "b1.jsonl", rows[3:4])
    write_jsonl(d / "b2.jsonl", rows[4:5])
    cfg = Settings(cache_dir=d / "cache")
    build_index([d / "a.jsonl"], d / "idx", cfg, openie_results=OIE, progress=False,
                components=Components(cfg, embedder=minilm))
    return d


@pytest.fixture
def work(base: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`base` (the link and its version travel together)."""
    shutil.copytree(base, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def comps(work: Path, minilm) -> Components:
    cfg = Settings(cache_dir=work / "cache")
    return Components(cfg, embedder=minilm)


def n_passages(idx: Path) -> int:
    with IndexData(idx) as data:
        data.check()
        return len(data.passages)


def leftovers(idx: Path) -> list[str]:
    return sorted(p.name for p in idx.parent.iterdir() if p.name.startswith(f".{idx.name}.")
                  and not (p.name[len(idx.name) + 2:].startswith("v") and (p / "manifest.json").is_file()))


def test_a_fresh_index_is_a_link_to_its_first_version(work: Path) -> None:
    idx = work / "idx"
    assert idx.is_symlink() and os.readlink(idx) == ".idx.v0001"
    with IndexData(idx) as data:
        assert data.version == ".idx.v0001" and data.path == (work / ".idx.v0001").resolve()
    assert leftovers(idx) == []  # no lock file, no temporaries


def test_concurrent_adds_both_land(work: Path, minilm) -> None:
    idx, start = work / "idx", threading.Barrier(2)
    errors: list[BaseException] = []

    def add(corpus: Path) -> None:
        try:
            start.wait()
            add_to_index(idx, [corpus], Settings(cache_dir=work / "cache"), openie_results=OIE, progress=False,
                         components=comps(work, minilm), lock_timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(work / f"b{i}.jsonl",)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert n_passages(idx) == 5  # 3 + 1 + 1: neither update was lost
    with IndexData(idx) as data:
        assert [h["op"] for h in data.manifest["history"]] == ["build", "add", "add"]


def test_a_second_writer_waits_then_fails_naming_the_holder(work: Path, minilm, monkeypatch) -> None:
    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(work / "cache"))
    idx = work / "idx"
    with IndexData(idx) as data:
        pid = data.passages[0].id
    runner = CliRunner()
    with index_lock(idx, op="test holder"):
        t0 = time.monotonic()
        res = runner.invoke(app, ["index", "delete", str(idx), "--ids", pid, "--lock-timeout", "0.5"])
        waited = time.monotonic() - t0
    assert res.exit_code == 1, res.output
    assert f"is being written by pid {os.getpid()}" in res.output and "test holder" in res.output
    assert "--lock-timeout" in res.output and waited >= 0.5
    assert n_passages(idx) == 3

    # a writer that can wait long enough goes ahead once the holder is done
    holder = threading.Thread(target=_hold, args=(idx, 1.0))
    holder.start()
    time.sleep(0.2)
    res = runner.invoke(app, ["index", "delete", str(idx), "--ids", pid, "--lock-timeout", "30"])
    holder.join()
    assert res.exit_code == 0, res.output
    assert "waiting up to" in res.output
    assert n_passages(idx) == 2


def _hold(idx: Path, seconds: float) -> None:
    with index_lock(idx, op="test holder"):
        time.sleep(seconds)


def test_lock_timeout_zero_fails_at_once(work: Path) -> None:
    idx = work / "idx"
    with index_lock(idx, op="first"):
        with pytest.raises(IndexBusyError, match=r"being written by pid \d+ .*first"):
            with index_lock(idx, timeout=0, op="second"):
                pass
    with index_lock(idx, timeout=0):  # released: free again, and the lock file went with it
        pass
    assert not (work / ".idx.lock").exists()


def test_a_killed_writers_forked_worker_does_not_keep_the_lock(work: Path) -> None:
    """spaCy's worker processes are forked while a build holds the lock; one that outlives a killed build must not
    keep the index locked. (On Linux a forked worker dies with its parent, see test_forked_children; this worker
    opts out of that, as on a system without ``PR_SET_PDEATHSIG``, to outlive the build.)"""
    idx, pidfile = work / "idx", work / "worker.pid"
    writer = os.fork()
    if writer == 0:
        try:
            with index_lock(idx, op="build"):
                worker = os.fork()
                if worker == 0:
                    if forked._prctl is not None:  # None off Linux, where nothing asks for the signal
                        forked._prctl(forked._PR_SET_PDEATHSIG, 0, 0, 0, 0)
                    time.sleep(10)
                    os._exit(0)
                pidfile.write_text(str(worker))
                os.kill(os.getpid(), signal.SIGKILL)  # the build dies; its worker lives on
        finally:
            os._exit(1)
    os.waitpid(writer, 0)
    worker = int(pidfile.read_text())
    try:
        with index_lock(idx, timeout=0):  # the worker is still alive, and the lock is free
            pass
    finally:
        os.kill(worker, signal.SIGKILL)


def test_a_version_directory_is_never_written_in_place(work: Path, minilm) -> None:
    with pytest.raises(ValueError, match=r"is a version of .*idx, never changed in place"):
        delete_from_index(work / ".idx.v0001", ["x"], Settings(cache_dir=work / "cache"), progress=False,
                          components=comps(work, minilm))


# -- a write killed at every step -------------------------------------------------------------------------------

def run_killed(target: Callable[[], None], kill_at: int) -> bool:
    """Run ``target`` in a forked child that SIGKILLs itself just before its ``kill_at``-th step of publishing
    (writing the manifest, each rename, link, exchange, and pruning). Returns whether the kill happened."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            import faiss

            faiss.omp_set_num_threads(1)  # the parent's OpenMP pool does not survive fork
            calls = [0]

            def step(fn: Callable) -> Callable:
                def wrapped(*args, **kwargs):
                    calls[0] += 1
                    if calls[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return fn(*args, **kwargs)
                return wrapped

            os.rename, os.replace, os.symlink = step(os.rename), step(os.replace), step(os.symlink)
            versions._exchange = step(versions._exchange)
            versions.prune = step(versions.prune)
            store.write_manifest = step(store.write_manifest)
            target()
        finally:
            os._exit(0)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the write hung")
        time.sleep(0.02)


def make_plain(idx: Path) -> None:
    """Turn the versioned index into a plain directory, as written before versions existed."""
    real = idx.resolve()
    idx.unlink()
    shutil.move(str(real), str(idx))


@pytest.mark.parametrize("layout", ["versioned", "plain", "plain-no-exchange"])
def test_a_write_killed_at_any_step_leaves_a_valid_index(work: Path, minilm, layout: str, monkeypatch) -> None:
    idx = work / "idx"
    if layout != "versioned":
        make_plain(idx)
    if layout == "plain-no-exchange":  # a file system or OS without renameat2(RENAME_EXCHANGE)
        monkeypatch.setattr(versions, "_exchange", lambda a, b: False)
    with IndexData(idx) as data:
        ids = [p.id for p in data.passages]
    cfg = Settings(cache_dir=work / "cache")
    kill_at, killed_somewhere, gaps = 1, False, 0
    while True:
        snapshot = work.parent / f"snap-{kill_at}"
        shutil.copytree(work, snapshot, symlinks=True)  # each step is killed on the same starting state
        sidx = snapshot / "idx"
        killed = run_killed(lambda: delete_from_index(sidx, [ids[0]], cfg, progress=False,
                                                      components=Components(cfg, embedder=minilm)), kill_at)
        # whatever step it died at, the path names a complete index: the old one or the new one
        assert n_passages(sidx) in (3, 2), (layout, kill_at)
        if not sidx.exists():
            gaps += 1  # only a migration without atomic exchange has a moment without the path (readers bridge it)
        if not killed:
            assert n_passages(sidx) == 2
            break
        killed_somewhere = True
        # the next write repairs and cleans what the killed one left, then works
        delete_from_index(sidx, [ids[1]], cfg, progress=False, components=Components(cfg, embedder=minilm))
        assert n_passages(sidx) in (2, 1)
        assert sidx.is_symlink() and leftovers(sidx) == [], (layout, kill_at, leftovers(sidx))
        assert len(versions.versions(sidx)) <= 2
        shutil.rmtree(snapshot)
        kill_at += 1
    assert killed_somewhere and kill_at >= 5  # manifest, rename, link(s), swap, prune
    assert gaps == (2 if layout == "plain-no-exchange" else 0)


def test_stale_temporaries_are_removed_by_the_next_write(work: Path, minilm) -> None:
    idx = work / "idx"
    tmp = work / ".idx.tmp-4242-1"
    tmp.mkdir()
    np.save(tmp / "passage_embeddings.npy", np.zeros((1000, 384), dtype=np.float32))  # a killed build's output
    (work / ".idx.link-4242-1").symlink_to(".idx.v0001")
    (work / ".idx.v0009").mkdir()  # a version a killed prune left half-removed (no manifest)
    old = work / ".idx.old-4242-1"  # what an older release's killed replace left beside a live index
    old.mkdir()
    with IndexData(idx) as data:
        pid = data.passages[0].id
    delete_from_index(idx, [pid], Settings(cache_dir=work / "cache"), progress=False, components=comps(work, minilm))
    assert leftovers(idx) == []
    assert sorted(versions.versions(idx)) == [1, 2]  # previous + current


def test_an_index_an_older_release_left_aside_is_recovered(work: Path, minilm) -> None:
    """Older releases replaced an index with two renames; killed between them, the index sat in ``.NAME.old-*``
    with nothing at the path. The next write puts it back before updating it."""
    idx = work / "idx"
    make_plain(idx)
    os.rename(idx, work / ".idx.old-777-1")
    add_to_index(idx, [work / "b1.jsonl"], Settings(cache_dir=work / "cache"), openie_results=OIE, progress=False,
                 components=comps(work, minilm))
    assert n_passages(idx) == 4 and leftovers(idx) == []


def test_old_versions_go_unless_a_reader_holds_them(work: Path, minilm) -> None:
    idx = work / "idx"
    cfg = Settings(cache_dir=work / "cache")
    reader = IndexData(idx)  # e.g. a server that opened version 1
    first = reader.passages
    for corpus in ("b1", "b2"):
        add_to_index(idx, [work / f"{corpus}.jsonl"], cfg, openie_results=OIE, progress=False,
                     components=comps(work, minilm))
    assert sorted(versions.versions(idx)) == [1, 2, 3]  # 1 is older than the previous, but pinned
    assert reader.passages == first and len(reader.graph.vs) == reader.counts["nodes"]  # still reads version 1
    reader.close()
    with IndexData(idx) as data:
        delete_from_index(idx, [data.passages[-1].id], cfg, progress=False, components=comps(work, minilm))
    assert sorted(versions.versions(idx)) == [3, 4]


def test_a_plain_directory_index_is_read_then_migrated_by_its_next_write(work: Path, minilm) -> None:
    idx = work / "idx"
    make_plain(idx)
    assert n_passages(idx) == 3
    add_to_index(idx, [work / "b1.jsonl"], Settings(cache_dir=work / "cache"), openie_results=OIE, progress=False,
                 components=comps(work, minilm))
    assert idx.is_symlink() and n_passages(idx) == 4
    assert n_passages(versions.version_dir(idx, 1)) == 3  # the old directory, kept as the previous version


def test_removing_the_link_removes_the_index(work: Path, minilm) -> None:
    idx = work / "idx"
    idx.unlink()  # what `rm -rf indexes/idx` does to a link
    with pytest.raises(store.IndexFormatError, match="no such index directory"):
        IndexData(idx)
    build_index([work / "b1.jsonl"], idx, Settings(cache_dir=work / "cache"), openie_results=OIE, progress=False,
                components=comps(work, minilm))  # a fresh build: no --force needed, and the orphan version goes
    assert n_passages(idx) == 1 and sorted(versions.versions(idx)) == [2]


def test_build_force_replaces_a_versioned_index(work: Path, minilm) -> None:
    idx = work / "idx"
    cfg = Settings(cache_dir=work / "cache")
    with pytest.raises(FileExistsError, match="--force"):
        build_index([work / "b1.jsonl"], idx, cfg, openie_results=OIE, progress=False, components=comps(work, minilm))
    m = build_index([work / "b1.jsonl"], idx, cfg, openie_results=OIE, progress=False, force=True,
                    components=comps(work, minilm))
    assert m["counts"]["passages"] == 1 and n_passages(idx) == 1
    assert json.loads((idx / "manifest.json").read_text())["timings_s"]["write"] > 0


# -- one progress bar per stage ---------------------------------------------------------------------------------

class FakeEmbedder(Embedder):
    identity, batch_size = "fake", 64

    @property
    def dim(self) -> int:
        return 8

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        return np.array([[len(t) + 1.0, *[float(i) for i in range(7)]] for t in texts], dtype=np.float32)


class RecordingBar:
    """Stands in for tqdm: records each bar's total and progress."""

    made: list[RecordingBar] = []

    def __init__(self, *args, total: int | None = None, initial: int = 0, disable: bool = False, **kwargs) -> None:
        self.total, self.n, self.disable = total, initial, disable
        RecordingBar.made.append(self)

    def update(self, n: int = 1) -> None:
        self.n += n

    def __enter__(self) -> RecordingBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_embedding_shows_one_bar_over_the_whole_stage(tmp_path: Path, monkeypatch) -> None:
    import graph_index.embedders.base as emb_base
    from graph_index.cache import DiskCache
    from graph_index.embedders import CachedEmbedder

    RecordingBar.made = []
    monkeypatch.setattr(builder, "tqdm", RecordingBar, raising=False)
    monkeypatch.setattr(emb_base, "tqdm", RecordingBar)
    emb = CachedEmbedder(FakeEmbedder(), DiskCache(tmp_path / "c.sqlite"))
    keys = [f"entity {i}" for i in range(5000)]
    known = {k: np.ones(8, dtype=np.float32) for k in keys[:500]}  # reused from the previous index
    out = builder._reuse_or_embed(emb, keys, lambda idx: [keys[i] for i in idx], known, "entities", True)
    shown = [b for b in RecordingBar.made if not b.disable]
    assert len(shown) == 1 and shown[0].total == 5000 and shown[0].n == 5000
    assert out.shape == (5000, 8) and np.allclose(out[1000], FakeEmbedder().encode([keys[1000]], progress=False)[0])


# -- an add of passages already indexed (issue 34, item 9) ------------------------------------------------------

def test_adding_only_passages_already_indexed_is_a_no_op_not_an_empty_corpus(work: Path, monkeypatch) -> None:
    """The CLI reports ``0 added`` and the duplicates, exits 0 and publishes nothing (the HTTP job says the same:
    test_ingestion); an empty file is still an empty corpus; a mixed file adds its new passages."""
    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(work / "cache"))
    idx, runner = work / "idx", CliRunner()
    res = runner.invoke(app, ["index", "add", str(idx), str(work / "a.jsonl")])
    assert res.exit_code == 0, res.output
    assert "0 added, 3 duplicates (3 already indexed)" in res.output and "unchanged" in res.output
    assert "empty corpus" not in res.output
    assert sorted(versions.versions(idx)) == [1] and n_passages(idx) == 3  # nothing was published

    (work / "empty.jsonl").write_text("\n")
    res = runner.invoke(app, ["index", "add", str(idx), str(work / "empty.jsonl")])
    assert res.exit_code == 1 and "empty corpus" in res.output

    write_jsonl(work / "mixed.jsonl", [*read_jsonl(work / "a.jsonl")[:2], *read_jsonl(work / "b1.jsonl")])
    res = runner.invoke(app, ["index", "add", str(idx), str(work / "mixed.jsonl"), "--openie-results", str(OIE)])
    assert res.exit_code == 0, res.output
    assert "1 added, 2 duplicates (2 already indexed)" in res.output and n_passages(idx) == 4
