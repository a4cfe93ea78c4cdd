"""Saving files so that a failure never destroys the previous version.

Every file ddpviz saves (traces, reports, Chrome traces, demo outputs, a session's recording) is
written to a temporary file in the same directory, flushed to disk (fsync), then renamed over the
target (`os.replace`, atomic on POSIX) and the directory entry is synced. A full disk or any other
write error leaves the previous file untouched, removes the temporary one and raises `SaveError`
naming the path and the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
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


def temporary_path(path: Path) -> Path:
    """A fresh name next to `path` for the new version."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def _target(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, temp: Path | None = None) -> Iterator[Path]:
    """Yield a temporary path to write the new version of `path` into; on a clean exit it is
    synced and renamed over `path`. On an error it is removed, and an OSError becomes
    SaveError."""
    target = _target(path)
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
