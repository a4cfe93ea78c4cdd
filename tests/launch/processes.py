"""Checking by pid that processes are gone (a zombie waiting for its reaper counts as gone)."""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")


def still_alive(pids: list[int], within: float = 2.0) -> list[int]:
    """The pids still running after up to `within` seconds (SIGKILL is not instantaneous)."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def recorded_pids(pid_dir: Path, ranks: int, timeout: float = 60.0) -> list[int]:
    """Rank and grandchild pids the rank functions wrote, once every rank has written them."""
    deadline = time.monotonic() + timeout
    files = [pid_dir / f"{r}.pid" for r in range(ranks)]
    while not all(f.exists() for f in files):
        if time.monotonic() > deadline:
            found = sorted(p.name for p in pid_dir.iterdir())
            raise AssertionError(f"ranks did not start within {timeout}s (found {found})")
        time.sleep(0.05)
    return [int(pid) for f in files for pid in f.read_text().split()]
