"""Index versions: the index path is a symlink to an immutable version directory beside it.

::

    indexes/sample            -> .sample.v0003     the current version
    indexes/.sample.v0003/                         written once, never changed
    indexes/.sample.v0002/                         the previous version, kept for readers that opened it
    indexes/.sample.lock                           present while a writer works (graph_index.lock)

A write fills a temporary directory, renames it to the next version and swaps the link with one atomic rename
(``os.replace`` of a new symlink over the old one), so the path names a complete index at every instant, whatever
kills the writer. A reader resolves the link once and holds a shared ``flock`` on that version's manifest (a pin);
a writer removes versions older than the previous one only when nobody pins them.

A plain index directory (written before versions existed) keeps working and is migrated by its next write: the
directory and a link to the new version trade places in one ``renameat2(RENAME_EXCHANGE)`` where the OS and file
system allow it; elsewhere two renames leave a moment without the path, which a marker (``.NAME.moving``, a link to
the new version) bridges: :func:`resolve` follows it, and the next write puts the link in place.

Removing the link removes the index: nothing resolves to versions no link names, and the next write at that path
removes them.

Everything that changes the directory runs under the index's write lock.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from .layout import MANIFEST, IndexFormatError

log = logging.getLogger(__name__)

#: Temporaries of writers that died, removed by the next write: ``.NAME.tmp-*`` (directories being written),
#: ``.NAME.link-*`` (links about to be swapped in) and ``.NAME.old-*`` (the aside-moved index of older releases).
STALE_KINDS = ("tmp", "link", "old")


def version_dir(root: Path, n: int) -> Path:
    return root.parent / f".{root.name}.v{n:04d}"


def versions(root: Path) -> dict[int, Path]:
    """Every entry named like a version of ``root`` (directories, and the odd link a killed migration left)."""
    prefix = f".{root.name}.v"
    out: dict[int, Path] = {}
    if not root.parent.is_dir():
        return out
    for entry in root.parent.iterdir():
        tail = entry.name[len(prefix):]
        if entry.name.startswith(prefix) and tail.isdigit():
            out[int(tail)] = entry
    return out


def owner_of(path: Path) -> Path | None:
    """The index link whose version ``path`` is (``indexes/.sample.v0003`` → ``indexes/sample``), if any."""
    name = path.name
    head, sep, tail = name.rpartition(".v")
    if not (name.startswith(".") and sep and tail.isdigit() and len(head) > 1):
        return None
    link = path.parent / head[1:]
    return link if link.is_symlink() else None


def _is_version(d: Path) -> bool:
    return d.is_dir() and not d.is_symlink() and (d / MANIFEST).is_file()


def current(root: Path) -> Path | None:
    """The version directory ``root`` links to, if it is a link to one of its own versions."""
    if not root.is_symlink():
        return None
    link, prefix = os.readlink(root), f".{root.name}.v"
    return root.parent / link if link.startswith(prefix) and link[len(prefix):].isdigit() else None


def _marker(root: Path) -> Path:
    return root.parent / f".{root.name}.moving"


def _moving_to(root: Path) -> Path | None:
    """The version a migration without atomic exchange was putting in place, if one was cut off."""
    marker = _marker(root)
    if not marker.is_symlink():
        return None
    target = root.parent / os.readlink(marker)
    return target if _is_version(target) else None


def resolve(root: Path) -> Path:
    """The directory holding the index at ``root`` now: the link's target, the plain directory itself, or the
    version a cut-off migration was moving in (see the module's docstring); else ``root``, for the caller to report."""
    root = Path(root)
    if root.is_symlink():
        target = root.resolve()
        if not target.is_dir():
            raise IndexFormatError(dangling_message(root), root)
        return target
    if root.exists():
        return root
    return _moving_to(root) or root


def dangling_message(root: Path) -> str:
    """What a link to a missing version means, and what to do: most often the index was copied with ``cp -r`` or
    ``tar``, which copy the link and not the hidden version directory it names."""
    link = os.readlink(root)
    own = link.startswith(f".{root.name}.v") and link[len(root.name) + 3:].isdigit()
    why = (f"an index is a link to a hidden version directory beside it ({link}), so this is most likely a copy "
           "made with `cp -r` or `tar`, which copy the link and not the data" if own else
           "the link's target was moved or removed")
    return (f"{root}: links to {link}, which is missing ({root.parent / link} does not exist); {why}. Copy an index "
            "with `routerag index snapshot INDEX DEST` and `routerag index restore SNAPSHOT INDEX`; restore it from a "
            "snapshot or rebuild it")


def shared_with(root: Path) -> Path | None:
    """The other index whose version ``root`` links to, if any: what ``cp -r`` of an index makes in the same folder
    (a link that resolves, to the original's data). Changing a file through one changes the other."""
    if not root.is_symlink() or current(root) is not None:
        return None
    owner = owner_of(root.parent / os.readlink(root))
    return owner if owner is not None and owner.absolute() != root.absolute() else None


def open_version(root: Path, *, attempts: int = 5) -> tuple[Path, int | None]:
    """Resolve ``root`` once and pin the version it names: ``(directory, descriptor to close to unpin)``.

    The pin is a shared ``flock`` on the version's manifest: writers remove a version only when they can lock it
    exclusively. A missing or non-index path comes back unpinned, for the caller to report; so does a version on a
    file system without ``flock`` (it is then protected only by being current or previous).
    """
    for _ in range(attempts):
        d = resolve(root)
        try:
            fd = os.open(d / MANIFEST, os.O_RDONLY)
        except OSError:
            if root.is_symlink() and resolve(root) != d:
                continue  # two writes went by since we resolved: the version we saw is gone
            return d, None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            time.sleep(0.01)  # a writer is removing what we resolved: the link has moved on, resolve again
            continue
        except OSError:
            pass
        return d, fd
    raise IndexFormatError(f"{root}: the index kept changing while it was being opened; try again", root)


def recover(root: Path) -> Path | None:
    """Under the write lock: put back the index a killed write left without a path. Returns the version linked.

    Two writes can leave one: a migration without atomic exchange cut off between its renames (the marker names the
    new version), and an older release's replace cut off between its renames (the index sat in ``.NAME.old-*``).
    """
    marker = _marker(root)
    if root.exists() or root.is_symlink():
        marker.unlink(missing_ok=True)  # the migration finished but for removing its marker
        return None
    target = _moving_to(root)
    if target is None:
        olds = sorted((d for d in _stale(root, "old") if _is_version(d)), key=lambda d: d.stat().st_mtime)
        if not olds:
            return None
        target = version_dir(root, max(versions(root), default=0) + 1)
        os.rename(olds[-1], target)
    _link(root, target)
    marker.unlink(missing_ok=True)
    log.warning("%s was missing after an interrupted write; it now links to %s", root, target.name)
    return target


def clean_stale(root: Path) -> list[Path]:
    """Under the write lock: remove the temporaries of writers that died, and versions left incomplete."""
    removed = []
    for kind in STALE_KINDS:
        for p in _stale(root, kind):
            _remove(p)
            removed.append(p)
    keep = current(root)
    for p in versions(root).values():
        if p != keep and (p.is_symlink() or not (p / MANIFEST).is_file()):
            _remove(p)
            removed.append(p)
    if removed:
        log.info("removed %d leftovers of interrupted writes: %s", len(removed), ", ".join(p.name for p in removed))
    return removed


def temp_dir(root: Path) -> Path:
    """A fresh directory beside ``root`` to write the next version into."""
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    return tmp


def publish(root: Path, tmp: Path) -> tuple[Path, Path | None]:
    """Under the write lock: make the complete directory ``tmp`` the index at ``root``.

    Returns ``(new version, previous one)``; the previous is ``None`` when ``root`` was absent or links elsewhere.
    """
    previous = current(root)
    legacy = root.is_dir() and not root.is_symlink()
    n = max(versions(root), default=0) + 1
    if legacy:
        previous, n = version_dir(root, n), n + 1  # the plain directory becomes version n, the new one n + 1
    new = version_dir(root, n)
    fsync_dir(tmp)  # the files' names inside it, before it is published
    os.rename(tmp, new)
    if legacy:
        _swap_in_for_directory(root, new, previous)  # type: ignore[arg-type]
    else:
        _link(root, new)
    fsync_dir(root.parent)
    return new, previous


def prune(root: Path, keep: set[Path]) -> list[Path]:
    """Under the write lock: remove versions not in ``keep`` that no reader pins. Returns those removed."""
    removed = []
    for p in versions(root).values():
        if p in keep or not p.is_dir() or p.is_symlink():
            continue
        try:
            fd = os.open(p / MANIFEST, os.O_RDONLY)
        except FileNotFoundError:
            _remove(p)
            removed.append(p)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("keeping %s: a reader still has it open", p.name)
            os.close(fd)
            continue
        try:
            shutil.rmtree(p)  # holding the lock: a reader that comes now fails to pin it and resolves again
            removed.append(p)
        finally:
            os.close(fd)
    return removed


def _link(root: Path, target: Path) -> None:
    """Point ``root`` at ``target`` with one atomic rename of a fresh link over it (relative: survives a move)."""
    tmp = root.parent / f".{root.name}.link-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(target.name, tmp)
    os.replace(tmp, root)


def _swap_in_for_directory(root: Path, new: Path, keep_as: Path) -> None:
    """Replace the plain directory ``root`` by a link to ``new``, keeping the directory as ``keep_as``."""
    os.symlink(new.name, keep_as)
    if _exchange(keep_as, root):
        return  # one step: ``root`` is the link and ``keep_as`` the old directory
    os.unlink(keep_as)
    marker = _marker(root)
    os.symlink(new.name, marker)
    os.rename(root, keep_as)  # from here until the link is in place, resolve() follows the marker
    _link(root, new)
    marker.unlink()


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # glibc before 2.28, musl without it
        return False
    at_fdcwd, rename_exchange = -100, 2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _stale(root: Path, kind: str) -> list[Path]:
    prefix = f".{root.name}.{kind}-"
    return [p for p in root.parent.iterdir() if p.name.startswith(prefix)] if root.parent.is_dir() else []


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def fsync_dir(d: Path) -> None:
    """Make the renames in ``d`` durable (a power cut after this cannot bring the old link back)."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
