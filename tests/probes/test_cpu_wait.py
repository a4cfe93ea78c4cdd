"""The main thread's wait for a CPU (probes/cpu_wait.py): read from /proc where Linux has it,
growing while the thread is runnable and not run, bounded and unknown (-1) elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpviz.probes.cpu_wait import UNKNOWN, CpuWait, parse

LINUX = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").exists()


def test_the_schedstat_line_is_parsed_and_anything_else_is_unknown() -> None:
    assert parse(b"549446484 549287067 158\n") == 549287067
    for bad in (b"", b"12", b"1 x 3", b"1 -5 3", b"1 " + b"9" * 40 + b" 3", b"\xff\xfe"):
        assert parse(bad) == UNKNOWN
    assert parse(b"1 " * 10_000) == 1  # (only the first bytes are read)


@pytest.mark.skipif(not LINUX, reason="no /proc/<pid>/task/<tid>/schedstat here")
def test_the_wait_grows_while_the_main_thread_competes_for_a_cpu() -> None:
    # One busy loop per core beside this thread's own: it is runnable and not run part of
    # the time. A sleeping thread does not count.
    wait = CpuWait()
    before = wait.read()
    assert before >= 0
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    busy = wait.read()
    assert busy - before > 10_000_000  # more than 10 ms of 1 s
    time.sleep(0.3)
    assert wait.read() - busy < 50_000_000  # asleep: (nearly) no wait
    wait.close()
    assert wait.read() >= busy  # opened again after close()


def test_without_the_file_the_wait_is_unknown_and_not_asked_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls = []

    def missing(*args: object) -> int:
        calls.append(args)
        raise FileNotFoundError("no schedstat")

    monkeypatch.setattr(os, "open", missing)
    wait = CpuWait()
    assert wait.read() == UNKNOWN and wait.read() == UNKNOWN
    assert len(calls) == 1
