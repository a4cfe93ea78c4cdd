"""A rank's own uncaught exception as a finding (probes/exit_error.py), without processes; the
real job (a crash between micro-steps under `ddpviz record`): tests/record/test_accum.py."""

from __future__ import annotations

import sys
from types import TracebackType

from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.errors import RankHangError
from ddpviz.probes import exit_error
from tests.diagnose.synthetic import Ranks


def load_batch() -> None:
    raise ValueError("bad shard\nline two")  # <raise>


def raised() -> tuple[BaseException, TracebackType | None]:
    try:
        load_batch()
    except ValueError as exc:
        return exc, sys.exc_info()[2]
    raise AssertionError("no exception")


def test_the_finding_names_the_rank_type_message_and_the_users_frame() -> None:
    exc, tb = raised()
    f = exit_error.finding_for(exc, tb, rank=1, step=7, world_size=2)
    assert f.kind == "rank_exited" and f.severity == "error" and f.field == "exception"
    assert f.ranks == (1,) and f.step == 7 and f.name == "ValueError"
    assert f.title.startswith("rank 1 exited on an uncaught exception after step 7: "
                              "ValueError: bad shard line two (raised at ")
    assert "test_exit_error.py:" in f.title and "in load_batch" in f.title
    assert "rank 1" in f.fix


def test_a_peers_failure_and_ddpvizs_own_errors_are_not_this_ranks_cause() -> None:
    assert exit_error.peer_error(RuntimeError(
        "[pair.cc:553] Connection closed by peer [127.0.0.1]:8079"))
    assert exit_error.peer_error(RankHangError("ddpviz: rank 1 did not reach ...", (), {}))
    assert not exit_error.peer_error(ValueError("bad shard"))


def test_diagnose_puts_the_crash_first_and_drops_uneven_steps_of_the_crashed_rank() -> None:
    run = Ranks(2)
    run.construct()
    for step in range(3):
        for r in range(2):
            if step < 2 or r == 0:
                run.emit(r, ev.ForwardStarted, step=step)
    exc, tb = raised()
    crash = exit_error.finding_for(exc, tb, rank=1, step=1, world_size=2)
    run.emit(1, ev.FindingReported, crash)
    findings = diagnose(run.events)
    assert findings[0] == crash
    assert not [f for f in findings if f.kind == "uneven_iterations"], findings
