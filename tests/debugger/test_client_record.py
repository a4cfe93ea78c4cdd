"""`session.debugger` on a `ddpviz record --debug --connect` job: an unmodified torch DDP script
under torchrun (the default hook-less watch()), paused from the notebook's session, its
parameters compared across ranks, stepped one step, resumed: it ends with the bits of an
unwatched run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ddpviz
from ddpviz.debugger.client import DebuggerError
from tests.record.hooked import ROOT, hooked_python
from tests.record.test_record import job_env, run, torchrun

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def bits(stdout: str) -> dict[int, str]:
    return {int(r): b for r, b in re.findall(r"rank (\d+) done .*? bits ([0-9a-f]+)", stdout)}


def _gated(python: str) -> list[str]:
    return [*torchrun(python)[:-1], str(ROOT / "tests" / "record" / "train_gated.py")]


def test_a_record_debug_job_pauses_steps_and_ends_as_unwatched(python: str,
                                                               tmp_path: Path) -> None:
    env = job_env(TRAIN_STEPS="400")
    plain = run(_gated(python), env)
    assert plain.returncode == 0, plain.stderr
    # the ranks wait before step 2 until the pause went out (a loaded machine once let all
    # 400 steps end before it arrived)
    gate = tmp_path / "gate"
    with ddpviz.listen(show=False) as session:
        proc = subprocess.Popen([python, "-m", "ddpviz", "record", "--debug", "--connect",
                                 session.connect_string, "--", *_gated(python)],
                                env={**env, "TRAIN_GATES": f"2:{gate}"}, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            assert session.collector.wait(lambda s: len(s.peers) == 2, timeout=120)
            reached = [Path(f"{gate}.reached{r}") for r in (0, 1)]
            deadline = time.monotonic() + 120
            while not all(p.exists() for p in reached):
                assert time.monotonic() < deadline and proc.poll() is None, "no rank at the gate"
                time.sleep(0.05)
            dbg = session.debugger
            dbg.pause()
            time.sleep(1.0)  # delivered by each rank's sender thread while its loop waits
            gate.touch()
            stop = dbg.wait(timeout=60)
            assert stop.agreed and stop.point == "forward" and sorted(stop.ranks) == [0, 1]
            # the hook-less watch() has no safe point before a bucket: said at once, with the fix
            with pytest.raises(DebuggerError, match=r"guard=True"):
                dbg.break_at(step=stop.step + 5, bucket=0)
            assert dbg.breaks == ()
            # between steps DDP's replicas hold the same parameters, bit for bit
            weights = dbg.inspect("0.weight", "value", timeout=60)
            assert weights.all_equal and "bitwise equal on all 2 ranks" in repr(weights)
            after = dbg.step("step", timeout=60)
            assert after is not None and after.step == stop.step + 1
            dbg.resume(timeout=60)
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:  # torchrun and its ranks, whose pipes communicate() reads
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert proc.returncode == 0, err
    assert bits(out) == bits(plain.stdout) and len(bits(out)) == 2


def test_record_debug_paused_parks_before_the_first_forward(python: str, tmp_path: Path) -> None:
    env = job_env(TRAIN_STEPS="8")
    plain = run(_gated(python), env)
    assert plain.returncode == 0, plain.stderr
    with ddpviz.listen(show=False) as session:
        proc = subprocess.Popen([python, "-m", "ddpviz", "record", "--debug=paused", "--connect",
                                 session.connect_string, "--", *_gated(python)],
                                env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            dbg = session.debugger
            stop = dbg.wait(timeout=120)  # nothing asked: every rank parks before step 0
            assert stop.agreed and (stop.step, stop.point) == (0, "forward")
            assert sorted(stop.ranks) == [0, 1]
            # a break set while parked at the start is in force when the ranks go on
            dbg.break_at(step=3, where="forward")
            dbg.resume(timeout=60)
            stop = dbg.wait(timeout=120)
            assert stop.agreed and (stop.step, stop.point) == (3, "forward")
            dbg.clear()
            dbg.resume(timeout=60)
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert proc.returncode == 0, err
    assert bits(out) == bits(plain.stdout) and len(bits(out)) == 2
