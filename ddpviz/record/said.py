"""Live findings of a `ddpviz record` job, said as ddpviz's own lines on stderr: every probe
raises its findings as a `DiagnosisWarning`; in a recorded rank that warning is printed as its
text alone (no "file:line: DiagnosisWarning:" around it, no source line after it), and only by
the first rank of the job to hold it, so the job's output shows each finding once.

See [Note: one line per finding per job].
"""

from __future__ import annotations

import hashlib
import sys
import threading
import warnings
from typing import Any, TextIO

import torch.distributed as dist

from ddpviz.findings import DiagnosisWarning
from ddpviz.probes.rendezvous import Scope

# [Note: one line per finding per job]
# The probes compute a finding on every rank that holds its evidence, and each rank raised it
# as a Python warning: a 2-rank job printed the same message twice, each time ending in the
# `warnings.warn(...)` line of ddpviz's own source. Under `ddpviz record` the ranks share one
# terminal, so the first rank to see a finding's text claims it in the process group's store
# (`add` on a key named after the text: 1 means first) and prints it; the others stay quiet.
# Texts that differ (a finding seen from two sides) are two lines. The claim goes through the
# background connection (the training thread's store calls never wait behind it); when there
# is no store to ask (a group of one, or its host already gone), the rank says it itself: a
# line twice is better than none. Outside `ddpviz record` (watch(), ddpviz's DDP in Python)
# findings stay Python warnings, which code can filter (docs/replicas.md).

_KEY = "ddpviz/said/"
_lock = threading.Lock()
_scope: Scope | None = None
_previous: Any = None


def install(group: dist.ProcessGroup) -> None:
    """Say this process's DiagnosisWarnings as ddpviz's own lines, once per job (the first
    watched DDP's group decides whose store is asked). Other warnings are left as they were."""
    global _scope, _previous
    with _lock:
        if _scope is not None:
            return
        _scope = Scope(group, clone=True)
        _previous = warnings.showwarning
        warnings.showwarning = _show


def _show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
          file: TextIO | None = None, line: str | None = None) -> None:
    if not issubclass(category, DiagnosisWarning):
        _previous(message, category, filename, lineno, file, line)
        return
    text = str(message)
    if first_in_job(text):
        print(text, file=sys.stderr if file is None else file, flush=True)


def first_in_job(text: str) -> bool:
    """Whether this rank is the first of the job to say `text` (True when no store answers)."""
    if _scope is None or _scope.world_size == 1:
        return True
    key = _KEY + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:24]
    try:
        return int(_scope.store.add(key, 1)) == 1
    except Exception:  # no store to ask (its host is gone): say it here
        return True
