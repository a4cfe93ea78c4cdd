"""Saving files so that a failure never destroys the previous version.

Every file ddpviz saves (traces, reports, Chrome traces, demo outputs, a session's recording) is
written to a temporary file in the same directory, flushed to disk (fsync), then renamed over the
target (`os.replace`, atomic on POSIX) and the directory entry is synced. A full disk or any other
write error leaves the previous file untouched, removes the temporary one and raises `SaveError`
naming the path and the reason. A temporary file left by a save that was killed is removed by
the next save of the same name (`sweep`). Files that grow while a job runs (per-rank traces, a
session's `.part`) are created by `create_new`, which never writes through a symbolic link.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


class SaveError(OSError):
    """A file could not be saved; the previous version of it (if any) is unchanged."""

    def __init__(self, path: Path, cause: OSError) -> None:
        reason = cause.strerror or str(cause) or type(cause).__name__
        hint = ("Free some space there or save elsewhere" if cause.errno in
                (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "Check the path and permissions")
        self.message = (f"ddpviz: could not save {path}: {reason}; the previous file (if any) is "
                        f"unchanged.\n{hint}, then save again.")
        super().__init__(cause.errno, self.message)
        self.filename = str(path)

    def __str__(self) -> str:
        return self.message


class LinkError(SaveError):
    """The name to create a file under is a symbolic link; ddpviz does not write through it."""

    def __init__(self, path: Path) -> None:
        try:
            to = f" (to {os.readlink(path)})"
        except OSError:
            to = ""
        self.message = (f"ddpviz: will not write {path}: it is a symbolic link{to}, and writing "
                        "through it would overwrite whatever it points to (in a shared folder, "
                        "someone else may have planted it).\nRemove the link (`rm "
                        f"{path}`) or write elsewhere (another --out folder or trace_dir).")
        OSError.__init__(self, errno.ELOOP, self.message)
        self.filename = str(path)


STALE_S = 3600.0  # a temporary file untouched this long is an abandoned one, whoever owns it
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def temporary_path(path: Path) -> Path:
    """A fresh name next to `path` for the new version: `.NAME.PID@HOST.RANDOM.tmp`, naming
    its writer so that a later save can tell an abandoned one (See `sweep`)."""
    return path.with_name(f".{path.name}.{os.getpid()}@{_HOST}.{uuid.uuid4().hex[:8]}.tmp")


def sweep(path: Path) -> int:
    """Remove the temporary files an earlier save of `path` left behind (its process killed
    mid-save): those whose writer, on this host, is gone, and any untouched for STALE_S
    seconds. A live writer's file is kept: its pid is alive (or it is on another host) and it
    keeps being written. Returns how many were removed."""
    removed = 0
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent or ".")
                 if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return 0
    now = time.time()
    for name in names:
        tmp = path.with_name(name)
        owner = name[len(prefix):-len(".tmp")].rsplit(".", 1)[0]
        pid, _, host = owner.partition("@")
        try:
            st = tmp.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        gone = host == _HOST and pid.isdigit() and not _alive(int(pid))
        if gone or now - st.st_mtime > STALE_S:
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: alive
        return True
    return True


def _target(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, temp: Path | None = None) -> Iterator[Path]:
    """Yield a temporary path to write the new version of `path` into; on a clean exit it is
    synced and renamed over `path`. On an error it is removed, and an OSError becomes
    SaveError."""
    target = _target(path)
    sweep(target)
    tmp = temp if temp is not None else temporary_path(target)
    try:
        yield tmp
        commit(tmp, target)
    except OSError as exc:
        discard(tmp)
        if isinstance(exc, SaveError):
            raise
        raise SaveError(target, exc) from exc
    except BaseException:
        discard(tmp)
        raise


def commit(tmp: Path, target: Path) -> None:
    """fsync `tmp`, give it the old file's permissions, rename it over `target`, sync the
    directory."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    with contextlib.suppress(OSError):
        os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
    os.replace(tmp, target)
    with contextlib.suppress(OSError):  # not every filesystem can sync a directory
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink()


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Save `data` as `path` atomically. Returns the path."""
    target = _target(path)
    with replacing(target) as tmp, open(tmp, "xb") as f:
        f.write(data)
    return Path(path)


@contextlib.contextmanager
def streaming(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to stream the new version of `path` into; replaced atomically on a clean
    exit, as `replacing` does (for outputs too big to build in memory first)."""
    with replacing(path) as tmp, open(tmp, "xb") as f:
        yield f


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Save `text` as `path` atomically. Returns the path."""
    return write_bytes(path, text.encode(encoding))


@contextlib.contextmanager
def creating(path: str | os.PathLike[str]) -> Iterator[Path]:
    """For a writer that streams into `path` as it runs (per-rank traces, a session's `.part`),
    never through a link: yields a temporary name next to it, made exclusively
    (O_EXCL|O_NOFOLLOW, so nothing planted there is followed), for the writer to open; then
    renames it to `path` (a rename replaces a name, it never follows it). An existing regular
    file there is replaced; a symbolic link raises `LinkError`. On an error the temporary file
    is removed."""
    target = Path(path)
    if target.is_symlink():
        raise LinkError(target)
    sweep(target)
    tmp = temporary_path(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o666)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        discard(tmp)
        raise
