"""How long a rank's replica check holds it at exit (See [Note: the job's end and checkpoints]
in ddpviz/probes/replicas.py): a script that ended on an uncaught exception waits for no final
judgement (its peers fail only when it exits); a clean end waits at most FINAL_S for one."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ddpviz.probes import replicas
from ddpviz.probes.replicas import FINAL_S, ReplicaCheck


class _Stub:
    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def finish(self, timeout: float = FINAL_S) -> None:
        self.timeouts.append(timeout)


@pytest.mark.parametrize(("crashed", "bound"), [(False, FINAL_S), (True, 0.0)])
def test_the_exit_handler_waits_for_a_judgement_only_after_a_clean_end(
        monkeypatch: pytest.MonkeyPatch, crashed: bool, bound: float) -> None:
    monkeypatch.setattr(sys, "last_value", RuntimeError("boom") if crashed else None,
                        raising=False)
    monkeypatch.setattr(replicas.ENDING, "set", lambda: None)  # (the process goes on here)
    stub: Any = _Stub()
    ReplicaCheck._at_exit(stub)
    assert stub.timeouts == [bound]


def test_python_marks_an_uncaught_exception_before_the_exit_handlers_run() -> None:
    # What left_on_an_exception() reads: set for an uncaught exception, not for sys.exit.
    probe = ("import atexit, sys\n"
             "from ddpviz.probes.replicas import left_on_an_exception\n"
             "atexit.register(lambda: print('crashed', left_on_an_exception()))\n"
             "{}\n")
    for last, crashed in (("raise RuntimeError('boom')", True), ("sys.exit(3)", False),
                          ("pass", False)):
        done = subprocess.run([sys.executable, "-c", probe.format(last)], capture_output=True,
                              text=True, timeout=120)
        assert f"crashed {crashed}" in done.stdout, done.stdout + done.stderr
