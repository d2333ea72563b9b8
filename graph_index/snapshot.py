"""Snapshots: one self-contained file holding an index's current version, and its restore as a new version.

An index path is a link to a hidden version directory beside it (:mod:`graph_index.versions`), so ``cp -r`` or
``tar`` of the path copies a link that dangles once moved, and no data. A snapshot (as Qdrant's) is the way to copy
an index: an uncompressed tar whose first member, ``routerag-snapshot.json``, lists every other member with its size
and sha256, followed by the version's files (``manifest.json`` and the data files it records)::

    routerag index snapshot indexes/sample backups/          # backups/sample.v0003.20260127T101500Z.snapshot.tar
    routerag index restore backups/sample....snapshot.tar indexes/sample --force

Writing one pins the version (a concurrent writer can publish, never remove it), checks each file's sha256 against
the manifest while copying it (one read of every byte), and renames the finished, fsynced file into place: a killed
snapshot leaves no file at the destination. Restoring reads the archive into a new version of the target under its
write lock, checks every member against the list and the restored files against their manifest (sizes, shapes,
sha256), and only then publishes it with the same atomic link swap as any write: a truncated or damaged snapshot
is refused with :class:`SnapshotError` and the index is untouched.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from . import integrity, store, versions
from .atomic import atomic_path
from .layout import MANIFEST, IndexFormatError
from .lock import DEFAULT_LOCK_TIMEOUT_S

FORMAT = "routerag-snapshot"
FORMAT_VERSION = 1
HEADER = "routerag-snapshot.json"
SUFFIX = ".snapshot.tar"
_CHUNK = 1 << 20


class SnapshotError(IndexFormatError):
    """The file is not a complete, intact RouteRAG snapshot (truncated, damaged, or something else). The message
    starts with the snapshot's path and names the member at fault."""


def snapshot_path(index: Path, dest: Path, version: str) -> Path:
    """Where ``index snapshot`` writes: ``dest`` itself when it names a ``.tar`` file, else a file in the folder
    ``dest`` named after the index, its version and the time (the folder is created if missing)."""
    if dest.suffix == ".tar":
        return dest
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"{dest} is a file; give a folder, or a FILE.tar to write")
    name = Path(index).name
    tag = version[len(name) + 2:] if version.startswith(f".{name}.v") else "plain"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return dest / f"{name}.{tag}.{stamp}{SUFFIX}"


def write_snapshot(index: Path, dest: Path, *, force: bool = False) -> dict[str, Any]:
    """Write the current version of ``index`` into one snapshot file (see the module's docstring); returns its
    header, with ``path`` (the file written) and ``bytes``. Raises :class:`IndexFormatError` naming a file whose
    sha256 differs from the manifest's (nothing is written then)."""
    with store.IndexData(index) as data:  # pins the version until the copy is done
        files = _files(data)
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "index": Path(index).name,
                  "version": data.version, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "passages": data.counts.get("passages"), "files": files}
        out = snapshot_path(Path(index), Path(dest), data.version)
        if out.exists() and not force:
            raise FileExistsError(f"{out} already exists; pass --force to replace it")
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            with open(tmp, "wb") as raw:
                with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    _add_bytes(tar, HEADER, json.dumps(header, indent=1).encode())
                    for name, rec in files.items():
                        _add_checked(tar, data.path / name, rec)
                raw.flush()
                os.fsync(raw.fileno())
        versions.fsync_dir(out.parent)
    return {**header, "path": str(out), "bytes": out.stat().st_size}


def _files(data: store.IndexData) -> dict[str, dict[str, Any]]:
    """Every file of the version with its size and sha256: the manifest's records, and the manifest itself (an
    index written before records existed gets them computed here)."""
    recorded = data.manifest.get("files") or {}
    names = [MANIFEST, *(recorded or [n for n in store.ALL_FILES[1:]])]
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        rec = recorded.get(name)
        path = data.path / name
        out[name] = ({"bytes": rec["bytes"], "sha256": rec["sha256"]} if rec else
                     {"bytes": path.stat().st_size, "sha256": integrity.sha256_file(path)})
    return out


class _Hashing(io.RawIOBase):
    """A file read through, hashing what passes (tarfile copies from it)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha, self.n = f, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self.f.readinto(b)  # type: ignore[attr-defined]
        if n:
            self.sha.update(memoryview(b)[:n])
            self.n += n
        return n


def _add_checked(tar: tarfile.TarFile, path: Path, rec: dict[str, Any]) -> None:
    """Copy ``path`` into the archive, holding it to its record as it goes (one read)."""
    info = tarfile.TarInfo(path.name)
    info.size, info.mtime, info.mode = rec["bytes"], int(path.stat().st_mtime), 0o644
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size != rec["bytes"]:
            raise IndexFormatError(f"{path}: {os.fstat(f.fileno()).st_size:,} bytes, the manifest records "
                                   f"{rec['bytes']:,}; {store.REBUILD_HINT}", path)
        reader = _Hashing(f)
        tar.addfile(info, io.BufferedReader(reader, _CHUNK))
    if reader.sha.hexdigest() != rec["sha256"]:
        raise IndexFormatError(f"{path}: sha256 {reader.sha.hexdigest()[:16]}…, the manifest records "
                               f"{rec['sha256'][:16]}… (the file changed after the write); nothing was written; "
                               f"{store.REBUILD_HINT}", path)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    info.mtime = int(datetime.now(timezone.utc).timestamp())
    tar.addfile(info, io.BytesIO(data))


# -- restore --------------------------------------------------------------------------------------------------------


def read_header(snapshot: Path) -> dict[str, Any]:
    """The snapshot's list of members (its first member), checked for format; :class:`SnapshotError` otherwise."""
    with _open(snapshot) as tar:
        return _header(snapshot, tar)


def restore_snapshot(snapshot: Path, index: Path, *, force: bool = False,
                     lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S) -> dict[str, Any]:
    """Restore ``snapshot`` as the next version of ``index`` (created if absent or a dangling link; replaced only
    with ``force``),
    under the index's write lock; returns the restored manifest. Every member is checked against the snapshot's list
    and the restored version against its manifest before it is published: a truncated or damaged snapshot raises
    :class:`SnapshotError` and leaves ``index`` as it was."""
    snapshot, index = Path(snapshot), Path(index)
    header = read_header(snapshot)  # a file that is no snapshot fails before the lock is taken
    if index.exists() and not force:
        raise FileExistsError(f"{index} already exists; pass --force to replace it with the snapshot")
    with store.write_lock(index, timeout=lock_timeout, op="index restore", create=True):
        if index.exists() and not force:  # again: another writer may have made it
            raise FileExistsError(f"{index} already exists; pass --force to replace it with the snapshot")
        if index.is_symlink() and not index.exists():
            index.unlink()  # a dangling link (what `cp -r` of an index makes) holds nothing to keep
        with store.atomic_directory(index, force=True) as tmp:
            _extract(snapshot, header, tmp)
            manifest = _check_restored(snapshot, tmp)
        restored = versions.current(index)
    return {**manifest, "restored": {"from": str(snapshot), "version": restored.name if restored else None,
                                     "source": {k: v for k, v in header.items() if k != "files"}}}


def _open(snapshot: Path) -> tarfile.TarFile:
    if not snapshot.is_file():
        raise FileNotFoundError(f"{snapshot}: no such snapshot file")
    try:
        return tarfile.open(snapshot, mode="r:")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise SnapshotError(f"{snapshot}: not a RouteRAG snapshot, or truncated ({exc})", snapshot) from None


def _header(snapshot: Path, tar: tarfile.TarFile) -> dict[str, Any]:
    try:
        first = tar.next()
        f = tar.extractfile(first) if first is not None and first.name == HEADER and first.isfile() else None
        header = json.loads(f.read()) if f is not None else None
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise SnapshotError(f"{snapshot}: unreadable snapshot list {HEADER} ({exc}); truncated?", snapshot) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT or not isinstance(header.get("files"), dict):
        raise SnapshotError(f"{snapshot}: not a RouteRAG snapshot (its first member is not {HEADER}); make one with "
                            "`routerag index snapshot`", snapshot)
    if header.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{snapshot}: snapshot format {header.get('format_version')} is not supported by this "
                            f"version (expects {FORMAT_VERSION})", snapshot)
    return header


def _extract(snapshot: Path, header: dict[str, Any], out: Path) -> None:
    """Write every listed member into ``out``, each held to its listed size and sha256; anything else (a member
    not listed, a link, a path) is refused, and so is a member missing at the end."""
    want: dict[str, dict[str, Any]] = header["files"]
    seen: set[str] = set()
    with _open(snapshot) as tar:
        _header(snapshot, tar)
        try:
            for i, member in enumerate(tar):
                if i == 0:
                    continue  # the list itself, read above
                _extract_member(snapshot, tar, member, want, seen, out)
        except (tarfile.TarError, EOFError) as exc:
            raise SnapshotError(f"{snapshot}: truncated or damaged after {len(seen)} of {len(want)} files ({exc})",
                                snapshot) from None
    missing = sorted(set(want) - seen)
    if missing:
        raise SnapshotError(f"{snapshot}: truncated: {len(missing)} of {len(want)} files missing "
                            f"({', '.join(missing[:5])})", snapshot)


def _extract_member(snapshot: Path, tar: tarfile.TarFile, member: tarfile.TarInfo, want: dict[str, dict[str, Any]],
                    seen: set[str], out: Path) -> None:
    name = member.name
    rec = want.get(name)
    if rec is None or not member.isfile() or "/" in name or name in seen:
        raise SnapshotError(f"{snapshot}: unexpected member {name!r} (not in its list, repeated, or not a plain file)",
                            snapshot)
    src = tar.extractfile(member)
    sha, n = hashlib.sha256(), 0
    with open(out / name, "wb") as dst:
        while chunk := src.read(_CHUNK):  # type: ignore[union-attr]
            sha.update(chunk)
            dst.write(chunk)
            n += len(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    if n != rec["bytes"] or sha.hexdigest() != rec["sha256"]:
        raise SnapshotError(f"{snapshot}: member {name}: {n:,} bytes with sha256 {sha.hexdigest()[:16]}…, its list "
                            f"says {rec['bytes']:,} bytes and {str(rec['sha256'])[:16]}… (truncated or damaged)",
                            snapshot)
    seen.add(name)


def _check_restored(snapshot: Path, d: Path) -> dict[str, Any]:
    """The restored directory is an index that opens and verifies, before it is published."""
    try:
        manifest = store.read_manifest(d)
        integrity.check_sizes(d, manifest)
        problems = integrity.verify_checksums(d, manifest)
    except IndexFormatError as exc:
        raise SnapshotError(f"{snapshot}: does not restore to a valid index: {exc}", snapshot) from None
    if problems and manifest.get("files"):
        raise SnapshotError(f"{snapshot}: does not restore to a valid index:\n  " + "\n  ".join(problems), snapshot)
    return manifest

