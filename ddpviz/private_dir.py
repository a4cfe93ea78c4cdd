"""Private temporary directories (mode 0700) that do not outlive their owner for long.

A launch, a %%ddp pool and a listening session each keep their files in one: the ranks'
rendezvous store and stack dumps, the connect string. Each directory names its owner (pid and the
process's start time, so a recycled pid does not count as alive) in a file inside it. Removed on
close; if the owner was killed (kill -9 of the kernel) the next directory made by any ddpviz
process of the same user sweeps it away.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

PREFIX = "ddpviz-run-"
OWNER = "owner"
_YOUNG_S = 60.0  # a directory without its owner file yet is being made: leave it alone


class PrivateDir:
    """A fresh 0700 directory under $TMPDIR (after sweeping stale ones). `remove()` deletes it."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        base = Path(root) if root is not None else Path(tempfile.gettempdir())
        sweep_stale(base)
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
        os.chmod(self.path, 0o700)
        owner = self.path / OWNER
        owner.write_text(_identity(os.getpid()) + "\n")

    def file(self, name: str) -> Path:
        return self.path / name

    def write_private(self, name: str, text: str) -> Path:
        """Write `text` to a file only this user can read (0600); returns its path."""
        path = self.path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _identity(pid: int) -> str:
    """"pid start-time" (start time in clock ticks since boot, from /proc; "?" elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return f"{pid} {text[text.rfind(')') + 2:].split()[19]}"
    except (OSError, IndexError):
        return f"{pid} ?"


def _alive(identity: str) -> bool:
    pid_text, _, start = identity.strip().partition(" ")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return start in ("", "?") or _identity(pid) == f"{pid} {start}"


def sweep_stale(base: Path) -> list[Path]:
    """Remove this user's ddpviz directories in `base` whose owner process is gone."""
    removed = []
    uid = os.getuid()
    with contextlib.suppress(OSError):
        entries = list(base.glob(f"{PREFIX}*"))
        for entry in entries:
            try:
                st = entry.lstat()
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                continue  # never follow links, never touch other users' files
            try:
                identity = (entry / OWNER).read_text()
            except OSError:
                if time.time() - st.st_mtime < _YOUNG_S:
                    continue
                identity = ""
            if identity and _alive(identity):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
