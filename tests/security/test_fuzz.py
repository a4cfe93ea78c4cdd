"""Runs the hypothesis fuzz over hostile traces (fuzz_traces.py) in a child process under a
memory cap (RLIMIT_AS) and a time cap: a trace that makes ddpviz allocate without bound dies
with MemoryError, one that makes it loop for minutes hits the time cap; either fails here."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 2 << 30  # address space: ~0.7 GB is the interpreter with torch and ipywidgets
TIME_CAP_S = 540  # the fuzz (60 examples) takes well under a minute on an idle machine


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@pytest.mark.timeout(TIME_CAP_S + 60)
def test_hostile_traces_fuzz_under_memory_and_time_caps() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-x", "-p", "no:cacheprovider",
         "-W", "error::pytest.PytestUnraisableExceptionWarning",
         str(ROOT / "tests" / "security" / "fuzz_traces.py")],
        cwd=ROOT, env=env, preexec_fn=_cap_memory, capture_output=True, text=True,
        timeout=TIME_CAP_S)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
    loaded = re.search(r"fuzz: (\d+) of (\d+) traces loaded", proc.stdout)
    assert loaded is not None and int(loaded[1]) >= 10, proc.stdout[-2000:]  # views exercised
