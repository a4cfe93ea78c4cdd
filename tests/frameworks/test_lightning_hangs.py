"""Lightning (jobs/lightning_job.py, strategy "ddp") recorded by `ddpviz record` with a rank
that hangs: stuck in its data loader, with ddpviz's hang deadline before the group's timeout
and after it; hanging in its training step (inside DDP's forward), named before the group's
timeout; and its healthy twin, briefly slow, named by nothing.

(Split from test_lightning.py, which keeps the strategies and their one unrecorded reference:
these cases compare with no reference, and each file is a work unit of its own under xdist.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ddpviz
from tests.dist.harness import free_port
from tests.frameworks.harness import (
    JOBS,
    Run,
    assert_finished,
    job_env,
    launch,
    plain_python,
    tail,
)
from tests.record.hooked import marked_line

pytest.importorskip("lightning", reason="the frameworks extra (pip install -e '.[frameworks]')")

pytestmark = [pytest.mark.dist, pytest.mark.frameworks]

SCRIPT = "lightning_job.py"


def env(folder: Path, **extra: str) -> dict[str, str]:
    return job_env(folder, MASTER_PORT=str(free_port()), **extra)


def stuck(python: str, tmp_path: Path, hang_timeout: str, sleep: str) -> Run:
    # rank 1's dataset sleeps before step 2's batch; the group's timeout is 15 s. The model has
    # buffers, so rank 0 waits for rank 1 in step 2's buffer broadcast, a wait the hang
    # watchdog guards.
    # (A planted sleep ends early once rank 0 has exited: jobs/lightning_job.py
    # planted_sleep.)
    run = launch(python, plain_python(python, SCRIPT), tmp_path, recorded=True, name="stuck",
                 env=env(tmp_path, FW_STRATEGY="ddp", FW_BUFFERS="1", FW_STUCK="2",
                         FW_STUCK_S=sleep, FW_TIMEOUT="15", FW_STEPS="4",
                         DDPVIZ_HANG_TIMEOUT=hang_timeout))
    assert run.code != 0, tail(run)  # gloo's timeout ends the job, as without ddpviz
    return run


def assert_rank_1_named_as_behind(run: Run) -> None:
    found = run.findings(0)
    kinds = [f.kind for f in found]
    assert "rank_exited" not in kinds, tail(run)  # rank 1 never exited: it was loading data
    assert "rank 1 closed its connection" not in run.out, tail(run)
    hang = [f for f in found if f.kind == "rank_hang"]
    assert hang, (kinds, tail(run))
    assert hang[0].ranks == (1,) and hang[0].step == 2, hang[0]
    where = {r: v for v, ranks in hang[0].values for r in ranks}
    assert "at step 1" in where[1], hang[0].text()  # rank 1's last heartbeat: a step behind


def test_a_rank_stuck_in_its_data_loader_is_named_before_the_group_timeout(
        python: str, tmp_path: Path) -> None:
    # ddpviz's deadline 6 s (verdict by ~8 s); rank 1 sleeps 18 s, past the group's timeout
    run = stuck(python, tmp_path, hang_timeout="6", sleep="18")
    waiting = [f for f in run.findings(0) if f.kind == "rank_waiting"]
    assert waiting and waiting[0].ranks == (1,), tail(run)
    assert_rank_1_named_as_behind(run)
    # named by ddpviz's deadline: the job ends with ddpviz's error, not gloo's timeout
    assert "ddpviz.errors.RankHangError: ddpviz: rank 1 did not reach" in run.out, tail(run)


def test_a_stuck_rank_is_not_called_exited_when_the_group_times_out_first(
        python: str, tmp_path: Path) -> None:
    # ddpviz's deadline (60 s) is past the group's (15 s): gloo's timeout ends the wait.
    run = stuck(python, tmp_path, hang_timeout="60", sleep="20")
    assert_rank_1_named_as_behind(run)
    assert "is not below the process group's timeout" in run.out, tail(run)  # said up front
    assert "the process group's own timeout ended the wait first" in run.out, tail(run)


def planted_line() -> str:
    """"lightning_job.py:LINE" of training_step's planted sleep (FW_HANG: its `# <hang>`)."""
    return f"lightning_job.py:{marked_line(JOBS / SCRIPT, 'hang')}"


@pytest.mark.parametrize("recording", [None, "guard"], ids=["default", "guard"])
def test_a_rank_hanging_in_its_training_step_is_named_before_the_group_timeout(
        python: str, tmp_path: Path, recording: str | None) -> None:
    # rank 1 sleeps 30 s in training_step at step 2, which Lightning runs inside DDP's
    # forward: it has reached step 2 and never returns from that forward. The group's
    # timeout is 20 s; ddpviz's deadline is left to its default (0.6 x the group's).
    extra = {"DDPVIZ_RECORDING": recording} if recording else {}
    run = launch(python, plain_python(python, SCRIPT), tmp_path, recorded=True, name="hang",
                 env=env(tmp_path, FW_STRATEGY="ddp", FW_HANG="2", FW_HANG_S="30",
                         FW_TIMEOUT="20", FW_STEPS="4", **extra))
    assert run.code != 0, tail(run)
    found = run.findings(0)
    assert "rank_exited" not in [f.kind for f in found], tail(run)
    hang = [f for f in found if f.kind == "rank_hang"]
    assert [(f.ranks, f.step) for f in hang] == [((1,), 2)], (found, tail(run))
    lines = "\n".join(hang[0].detail)
    assert f"rank 1 is at tests/frameworks/jobs/{planted_line()} in training_step" in lines, \
        lines
    if recording is None:  # the reducer waits in C++: named live, then torch's own error
        assert hang[0].title.startswith(
            "rank 1 did not return from step 2's forward within "), hang[0].title
        named = run.out.index("ddpviz: rank 1 did not return from step 2's forward")
        assert "Timed out" in run.out[named:] and "Timed out" not in run.out[:named], tail(run)
    else:  # raised from backward(): ddpviz's error ends the job, not gloo's timeout
        assert "ddpviz.errors.RankHangError: ddpviz: rank 1 did not reach the all-reduce of " \
               "bucket 0 at step 2" in run.out, tail(run)
        assert "Timed out" not in run.out, tail(run)


def test_a_rank_briefly_slow_in_its_training_step_is_not_named(python: str,
                                                                tmp_path: Path) -> None:
    # the healthy twin: rank 1's training_step sleeps 1 s at step 2 (inside DDP's forward,
    # below the live notice's 3 s): rank 0 waits for it in its backward, and nothing is named
    run = launch(python, plain_python(python, SCRIPT), tmp_path, recorded=True, name="slow",
                 env=env(tmp_path, FW_STRATEGY="ddp", FW_HANG="2", FW_HANG_S="1",
                         FW_TIMEOUT="20", FW_STEPS="4"))
    assert_finished(run)
    for rank in range(2):
        assert run.findings(rank) == [], tail(run)
    assert run.traces is not None
    judged = [f for f in ddpviz.diagnose(run.traces) if f.severity != "info"]
    assert judged == [], judged
