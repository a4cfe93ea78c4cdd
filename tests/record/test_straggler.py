"""Who is slow, in real jobs: an unmodified torch DDP script (train_slow.py) under
`ddpviz record` and torchrun (gloo), one rank slowed in its backward (a sleep in a module's
backward hook) or in its data loading, and a healthy job beside a CPU hog. The straggler is
named with the right rank and phase; the healthy job names nobody."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ddpviz
from ddpviz import events as ev
from tests.dist.harness import free_port
from tests.record.hooked import ROOT, hooked_python
from tests.record.test_record import job_env, run

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "record" / "train_slow.py"


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def record(python: str, out: Path, nprocs: int, recording: str | None = None,
           **env: str) -> ddpviz.Trace:
    policy = ["--recording", recording] if recording else []
    done = run([python, "-m", "ddpviz", "record", *policy, "--out", str(out), "--", python,
                "-m", "torch.distributed.run", "--nproc-per-node", str(nprocs),
                "--master-port", str(free_port()), str(SCRIPT)], job_env(**env), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(out.glob("ddpviz-trace-rank*.ddpviz"))
    assert len(files) == nprocs
    return ddpviz.Trace.merge([ddpviz.Trace.load(f) for f in files])


def stragglers(trace: ddpviz.Trace) -> list[ddpviz.Finding]:
    return [f for f in ddpviz.diagnose(trace) if f.kind == "straggler"]


@pytest.mark.parametrize(("ranks", "recording", "slow"), [(2, "every=2", 1),
                                                          (3, "guard,every=never", 0)])
def test_a_rank_slowed_in_its_backward_is_named_with_the_bucket(
        python: str, tmp_path: Path, ranks: int, recording: str, slow: int) -> None:
    # A sleep of 12 ms in layer 2's backward hook on one rank (steps ~40-90 ms). Hook-less
    # watch, every=2: 31 of 60 steps with bucket events (two ranks need 14 of 14 to rule out
    # chance); the guard: every step.
    trace = record(python, tmp_path / "t", ranks, recording, TRAIN_SLOW_RANK=str(slow),
                   TRAIN_SLOW_PHASE="backward")
    (f,) = stragglers(trace)
    assert f.ranks == (slow,) and f.field == "backward" and f.severity == "warning"
    if "guard" not in recording:  # (the hook-less watch's backward marks read the CPU wait)
        # a rank asleep in its own backward is not waiting for a CPU
        assert "less than half of its lateness" in f.text(), f.text()
    # the hook runs after layer 2's gradients, before layer 0's: the time is lost before
    # the bucket of 0.weight/0.bias launches
    assert f.bucket >= 0 and "0.weight" in f.text()
    assert "clock offsets exact" in f.text()


def test_a_rank_slowed_in_its_backward_is_named_at_the_default_level(
        python: str, tmp_path: Path) -> None:
    # Nothing configured (watch's default: per-bucket events on steps 0-2 only in 40 steps):
    # rank 1 sleeps 40 ms in layer 2's backward hook, steps of ~50 ms. Every step's
    # BackwardComputed (the end of a rank's own backward, before the wait, and its first
    # gradient) names it, and the place: after its first gradient (8 layers: 6.bias, ready
    # first), before the bucket of layer 0 launched (the sampled steps' launches).
    trace = record(python, tmp_path / "t", 2, None, TRAIN_SLOW_RANK="1",
                   TRAIN_SLOW_PHASE="backward", TRAIN_SLOW_S="0.04", TRAIN_LOAD_S="0.005",
                   TRAIN_STEPS="40")
    (f,) = stragglers(trace)
    assert f.ranks == (1,) and f.field == "backward", f.text()
    assert "between its first gradient (6." in f.text(), f.text()
    assert f.bucket >= 0 and "0.weight" in f.text(), f.text()
    assert "per-step backward (BackwardComputed)" in f.text()
    # every synced step is marked on every rank, per-bucket events on the sampled ones only
    for rank in (0, 1):
        events = trace.events(rank=rank)
        assert [e.step for e in events if isinstance(e, ev.BackwardComputed)] == list(
            range(40))
        assert sorted({e.step for e in events if isinstance(e, ev.GradReady)}) == [0, 1, 2]
    # named within 30 steps: the analysis over the first 30 steps' events names it already
    from ddpviz._diagnose.straggler import find_straggler, timeline

    first = {r: t for r, t in trace.columns().items()}
    early = find_straggler(timeline(_first_steps(first, 30), trace.clock))
    assert early is not None and early.rank == 1 and early.phase == "backward"


def _first_steps(tables: dict, steps: int) -> dict:
    from ddpviz.traces.columns import Table

    out = {}
    for r, t in tables.items():
        keep = t.step < steps
        objects = {}  # (rows renumbered: the kept rows' objects)
        new_row = keep.cumsum() - 1
        for row, e in t.objects.items():
            if keep[row]:
                objects[int(new_row[row])] = e
        out[r] = Table(r, t.kind[keep], t.step[keep], t.t[keep], t.seq[keep], t.a[keep],
                       t.b[keep], t.s[keep], objects, t.strings)
    return out


def test_a_rank_slow_in_data_loading_is_named_at_the_default_level(python: str,
                                                                   tmp_path: Path) -> None:
    # 3 ranks, watch's default recording (per-bucket events on steps 0-2 only): the forwards
    # of every step say who arrives late.
    trace = record(python, tmp_path / "t", 3, None, TRAIN_SLOW_RANK="0",
                   TRAIN_SLOW_PHASE="data")
    (f,) = stragglers(trace)
    assert f.ranks == (0,) and f.field == "data"


@pytest.mark.parametrize(("phase", "where"), [
    ("optimizer", "it loses the time in the optimizer step"),
    ("data", "it loses the time in data loading (before the forward, after the optimizer step)"),
])
def test_the_optimizer_step_is_told_from_data_loading(python: str, tmp_path: Path, phase: str,
                                                      where: str) -> None:
    # Rank 1 sleeps 12 ms a step (~25%) in an optimizer step pre-hook of the script's own, or
    # in its data loading. Both fall between a backward's end and the next forward; the
    # sampled steps (every=2) time the optimizer step with torch's global optimizer hooks.
    trace = record(python, tmp_path / "t", 2, "every=2", TRAIN_SLOW_RANK="1",
                   TRAIN_SLOW_PHASE=phase)
    (f,) = stragglers(trace)
    assert f.ranks == (1,) and f.field == phase
    assert where in f.text() and "told from data loading" in f.text()
    # timed on the sampled steps only: those whose per-parameter hooks were armed
    for rank in (0, 1):
        events = trace.events(rank=rank)
        timed = [e.step for e in events if isinstance(e, ev.OptimizerStepStarted)]
        sampled = sorted({e.step for e in events if isinstance(e, ev.GradReady)})
        assert timed == sampled and len(timed) >= 25
        assert len([e for e in events if isinstance(e, ev.OptimizerStepFinished)]) \
            == len(timed)


@pytest.mark.parametrize("recording", ["every=2", None])
def test_a_healthy_job_beside_a_cpu_hog_names_nobody(python: str, tmp_path: Path,
                                                     recording: str | None) -> None:
    # (the default: every step's BackwardComputed looked at, 60 steps)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        trace = record(python, tmp_path / "t", 2, recording, TRAIN_LOAD_S="0.005")
    finally:
        hog.kill()
        hog.wait()
    # a rank that a hog beside it slows for real is named only as waiting for a CPU (an
    # info: its host's load, not its code); never as a straggler in its own work
    for f in stragglers(trace):
        assert f.severity == "info" and f.field == "cpu_wait", f.text()
        assert "waits for a CPU" in f.title and "run-queue delay" in f.text(), f.text()
    # the wait table exists all the same: who made which bucket wait, by chance
    from ddpviz._diagnose.straggler import who_waited

    table = who_waited(trace.columns(), trace.clock)
    assert table.steps >= (20 if recording else 2) and table.n_last.sum() + table.unsure > 0
