"""Where is a hung rank waiting? Its Python stack, taken just before the rank is stopped.

Each rank registers `faulthandler` on SIGUSR1, writing to a file of its own (a rank blocked in a C
collective never runs a Python-level signal handler; faulthandler works anyway). The kernel
signals, reads the dump, drops the launcher's own threads and frames, and formats what is left
as the pulse thread's stacks are (probes/stack_text.py): most recent call last, the user's
frames with the source lines the kernel knows (notebook cells included; none with
$DDPVIZ_RECORDING's stack_source=false), torch's and the standard library's runs folded into
one line each, bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from ddpviz.probes import stack_text
from ddpviz.recording import stack_source_from_env

STACK_SIGNAL = signal.SIGUSR1
ENV = "DDPVIZ_STACKS"
Frame = tuple[str, int, str]  # file, line, function
_OURS = (f"{os.sep}ddpviz{os.sep}launcher{os.sep}", f"{os.sep}ddpviz{os.sep}transport{os.sep}")
_PLUMBING = ("<frozen runpy>", f"{os.sep}threading.py")
_SETTLE_S = 1.0  # longest wait for the dumps to be written
_QUIET_S = 0.05  # a dump is complete once its file stopped growing this long

_registered: IO[Any] | None = None


def install_in_rank() -> None:
    """In a rank: dump every thread's stack to the file named by DDPVIZ_STACKS on SIGUSR1."""
    import faulthandler

    global _registered
    path = os.environ.pop(ENV, None)
    if path:
        _registered = open(path, "a")  # noqa: SIM115 - faulthandler writes to it until exit
        faulthandler.register(STACK_SIGNAL, file=_registered, all_threads=True)


class StackFiles:
    """One stack file per rank, in the run's private directory (ddpviz/private_dir.py)."""

    def __init__(self, nprocs: int, directory: Path) -> None:
        self.dir = directory
        self.paths = [self.dir / f"rank{r}.txt" for r in range(nprocs)]
        for path in self.paths:
            path.touch()

    def env(self, rank: int) -> dict[str, str]:
        return {ENV: str(self.paths[rank])}

    def take(self, ranks: Iterable[tuple[int, int]]) -> dict[int, list[str]]:
        """Stacks of (rank, pid) pairs, formatted: {rank: lines prefixed "[rank r]"}."""
        ranks = list(ranks)
        sizes = {rank: self.paths[rank].stat().st_size for rank, _ in ranks}
        for _, pid in ranks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, STACK_SIGNAL)
        texts = self._settle(sizes)
        source = stack_source_from_env()  # the policy the ranks inherit from this process
        return {rank: format_stack(rank, parse(texts[rank]), source=source)
                for rank, _ in ranks}

    def _settle(self, sizes: dict[int, int]) -> dict[int, str]:
        deadline = time.monotonic() + _SETTLE_S
        last: dict[int, str] = {}
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            texts = {r: _read_from(self.paths[r], size) for r, size in sizes.items()}
            if texts != last:
                last, stable_since = texts, time.monotonic()
            elif all(texts.values()) and time.monotonic() - stable_since >= _QUIET_S:
                break
            time.sleep(0.01)
        return last


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def parse(text: str) -> list[list[Frame]]:
    """faulthandler's dump -> the user's threads (main thread first), each as frames outermost
    first, with the launcher's threads and frames left out."""
    threads = [[(f.file, f.line, f.func) for f in reversed(frames)]
               for _, frames in stack_text.faulthandler_threads(text)]
    # the main thread is the one runpy started
    threads.sort(key=lambda t: not any(f[0] == "<frozen runpy>" for f in t))
    kept = []
    for thread in threads:
        user = [f for f in thread if not any(p in f[0] for p in _OURS + _PLUMBING)]
        if user:
            kept.append(user)
    return kept


def format_stack(rank: int, threads: list[list[Frame]], *, source: bool = True) -> list[str]:
    """Each thread's stack (frames outermost first, as `parse` gives them) as
    `stack_text.stack_lines` formats it ("train.py:57 in load_batch: batch = next(it)", runs of
    torch's and the standard library's frames folded; without ": batch = next(it)" when
    `source` is False), under a heading; every line prefixed "[rank r]"."""
    prefix = f"[rank {rank}] "
    if not threads:
        return [prefix + "(no Python frames outside ddpviz: starting up, or exiting)"]
    lines: list[str] = []
    for i, frames in enumerate(threads):
        lines.append(prefix + ("Stack (most recent call last):" if i == 0 else
                               "Another thread (most recent call last):"))
        stack = [stack_text.Frame(*f) for f in reversed(frames)]  # innermost first
        lines += [f"{prefix}  {line}" for line in stack_text.stack_lines(stack, source=source)]
    return lines
