"""Where each rank is, in code, and who left the loop (probes/where.py, whereabouts.py): real
2-rank gloo jobs of an unmodified script (train_stuck.py) under `ddpviz record` and torchrun,
with one rank in planted trouble at step 3. Each finding must name the rank, the step, where
the waiting rank waits, and the planted line of the script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz import events as ev
from tests.record.hooked import ROOT, hooked_python
from tests.record.test_record import job_env, run

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "record" / "train_stuck.py"
HANG_S = "5"  # ddpviz's hang timeout; the group's own is 4x longer


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def planted(tag: str) -> str:
    """"train_stuck.py:LINE" of the line marked `# PLANTED tag`."""
    for n, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# PLANTED {tag}"):
            return f"train_stuck.py:{n}"
    raise AssertionError(tag)


def record(python: str, tmp_path: Path, plant: str, recording: str | None = None,
           nprocs: int = 2) -> tuple[str, list[Any]]:
    """Run the job; its output and the findings rank 0 recorded."""
    from tests.dist.harness import free_port

    out = tmp_path / "traces"
    args = [python, "-m", "ddpviz", "record", "--out", str(out), "--hang-timeout", HANG_S]
    if recording is not None:
        args += ["--recording", recording]
    args += ["--", python, "-m", "torch.distributed.run", "--nproc-per-node", str(nprocs),
             "--master-port", str(free_port()), str(SCRIPT)]
    done = run(args, job_env(TRAIN_PLANT=plant, TRAIN_PG_TIMEOUT="20", TRAIN_SLEEP_S="60"))
    text = done.stdout + done.stderr
    assert done.returncode != 0, text[-3000:]
    trace = ddpviz.Trace.load(out / "ddpviz-trace-rank0.ddpviz")
    return text, [e.finding for e in trace if isinstance(e, ev.FindingReported)]


def test_a_rank_sleeping_in_its_data_loading_is_named_with_the_planted_line(
        python: str, tmp_path: Path) -> None:
    # watch's default (no comm hook), 3 ranks: ranks 0 and 2 both wait for rank 1
    text, found = record(python, tmp_path, "sleep", nprocs=3)
    # each waiting rank names the wait from its side; the job says it once
    said = [line for line in text.splitlines() if line.startswith("ddpviz: rank")]
    assert len([s for s in said if "did not reach step 3" in s]) == 1, "\n".join(said)
    assert len([s for s in said if "in step 3" in s and "for rank 1" in s]) <= 1, said
    hang = [f for f in found if f.kind == "rank_hang"]
    assert [(f.ranks, f.step) for f in hang] == [((1,), 3)], text[-3000:]
    lines = "\n".join(hang[0].detail)
    assert f"rank 1 is at tests/record/{planted('sleep')} in load_batch <- " in lines, lines
    assert "time.sleep(float(" in lines  # the planted source line itself
    # the waiting rank, briefly: in its backward, called from the loop's line
    assert "rank 0 (waiting) is at tests/record/train_stuck.py" in lines
    assert "inside torch: backward" in lines
    waiting = [f for f in found if f.kind == "rank_waiting"]  # live, before the verdict
    assert waiting and planted("sleep") in "\n".join(waiting[0].detail)
    assert "left the training loop" not in text  # in its loop: not left
    # stuck, alive, in its step: not uneven data (diagnose read the whole folder)
    diagnosed = [(f.kind, f.severity, f.ranks) for f in ddpviz.diagnose(tmp_path / "traces")]
    assert diagnosed == [("rank_hang", "error", (1,))], diagnosed


def test_a_rank_blocked_in_a_collective_of_its_own_is_named_with_the_planted_line(
        python: str, tmp_path: Path) -> None:
    text, found = record(python, tmp_path, "barrier", recording="guard")
    assert "ddpviz.errors.RankHangError: ddpviz: rank 1 did not reach the all-reduce of " \
           "bucket 0 at step 3" in text, text[-3000:]
    assert "Timed out" not in text  # named before gloo's own timeout
    hang = [f for f in found if f.kind == "rank_hang"]
    assert [(f.ranks, f.step, f.bucket, f.field) for f in hang] == [
        ((1,), 3, 0, "all-reduce")]
    lines = "\n".join(hang[0].detail)
    assert f"rank 1 is at tests/record/{planted('barrier')} in sync_side <- " in lines, lines
    assert "inside torch/distributed: barrier" in lines
    assert "dist.barrier(group=side)  # PLANTED barrier" in lines
    assert "... 2 frames in torch/distributed (innermost: barrier)" in lines  # folded


@pytest.mark.parametrize("recording", [None, "guard"])
def test_a_rank_holding_the_gil_in_c_code_is_named_with_its_stack_from_faulthandler(
        python: str, tmp_path: Path, recording: str | None) -> None:
    """Rank 1's data loading calls libc's sleep() through ctypes.PyDLL, which keeps the GIL: its
    pulse thread cannot answer the stack request, so rank 0 has faulthandler dump it (a signal
    to that thread, stuck_stack.py); the C call is not interrupted."""
    text, found = record(python, tmp_path, "gil", recording=recording)
    hang = [f for f in found if f.kind == "rank_hang"]
    assert [(f.ranks, f.step) for f in hang] == [((1,), 3)], text[-3000:]
    lines = "\n".join(hang[0].detail)
    assert "did not post its stack" not in lines, lines
    assert "rank 1's training thread has held the GIL in C code for about " in lines, lines
    assert "its Python stack, dumped by faulthandler:" in lines
    assert f"rank 1 is at tests/record/{planted('gil')} in load_batch <- " in lines
    assert "libc.sleep(int(os.environ.get(" in lines  # the planted source line itself
    assert "its training thread, per /proc: sleeping (S)" in lines
    uneven = [f for f in ddpviz.diagnose(tmp_path / "traces") if f.kind == "uneven_iterations"]
    assert uneven == [], uneven  # stuck in C code, alive: not uneven data
    assert "rank 0 (waiting) is at tests/record/train_stuck.py" in lines
    if recording == "guard":  # raised from backward(), with the same lines, before gloo's
        raised = text.index("ddpviz.errors.RankHangError: ddpviz: rank 1 did not reach the "
                            "all-reduce of bucket 0 at step 3")
        # own timeout (rank 0 lives on after it: its replica check waits for rank 1 at exit)
        assert "Timed out" not in text[:raised]


@pytest.mark.parametrize("recording", [None, "guard"])
def test_a_rank_that_breaks_out_of_the_loop_is_named_as_left_with_step_counts(
        python: str, tmp_path: Path, recording: str | None) -> None:
    text, found = record(python, tmp_path, "break", recording=recording)
    left = [f for f in found if f.kind == "uneven_iterations"]
    assert [(f.severity, f.ranks, f.step, f.field) for f in left] == [
        ("error", (1,), 3, "left_loop")], text[-3000:]
    f = left[0]
    assert f.title == ("rank 1 left the training loop after 3 steps while rank 0 went on to "
                       "step 3: it is blocked in torch.distributed's barrier; this step can "
                       "never complete")
    values = dict((rs, v) for v, rs in f.values)
    assert values[(1,)].startswith("ran 3 steps (0-2), then left the loop at "
                                   "tests/record/train_stuck.py:")
    assert f"it is at tests/record/{planted('end')} in main" in values[(1,)]
    assert "drop_last=True" in f.fix and "join()" in f.fix
    if recording == "guard":  # raised from backward() instead of hanging to gloo's timeout
        assert f.bucket == 0 and values[(0,)] == (
            "runs step 3, waiting in the all-reduce of bucket 0")
        assert "ddpviz.errors.RankHangError: ddpviz: rank 1 left the training loop" in text
        assert "Timed out" not in text
    else:  # named live, before the hang timeout's verdict
        kinds = [g.kind for g in found]
        assert kinds.index("uneven_iterations") < kinds.index("rank_hang"), kinds


def test_a_rank_whose_script_returns_after_fewer_steps_is_named_as_left(
        python: str, tmp_path: Path) -> None:
    text, found = record(python, tmp_path, "quit", recording="guard")
    left = [f for f in found if f.kind == "uneven_iterations"]
    assert [(f.severity, f.ranks, f.step, f.bucket) for f in left] == [
        ("error", (1,), 3, 0)], text[-3000:]
    assert left[0].title == ("rank 1 left the training loop after 3 steps while rank 0 went "
                             "on to step 3: its process exited; this step can never complete")
    assert "closed its connection" not in text  # not "exited or crashed": what it did
    uneven = [f for f in ddpviz.diagnose(tmp_path / "traces") if f.kind == "uneven_iterations"]
    assert [(f.severity, f.ranks) for f in uneven] == [("error", (1,))], uneven  # still uneven


def test_a_rank_that_breaks_out_inside_join_is_not_named(python: str, tmp_path: Path) -> None:
    out = tmp_path / "traces"
    from tests.dist.harness import free_port

    done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--hang-timeout", HANG_S,
                "--", python, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port()), str(SCRIPT)],
               job_env(TRAIN_PLANT="break", TRAIN_JOIN="1", TRAIN_STEPS="12",
                       TRAIN_STEP_S="0.4"))  # rank 0 trains on alone for about 4 s
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "rank 0 ran 12 steps" in done.stdout and "rank 1 ran 3 steps" in done.stdout
    for rank in (0, 1):
        trace = ddpviz.Trace.load(out / f"ddpviz-trace-rank{rank}.ddpviz")
        found = [e.finding for e in trace if isinstance(e, ev.FindingReported)]
        assert found == [], found  # joined: it shadows the all-reduces, nobody waits


def test_the_healthy_job_reports_nothing(python: str, tmp_path: Path) -> None:
    """The twin of the planted jobs: no plant, the same deadline; no finding live, and none
    but notes from diagnose."""
    from tests.dist.harness import free_port

    out = tmp_path / "traces"
    done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--hang-timeout", HANG_S,
                "--", python, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port()), str(SCRIPT)],
               job_env(TRAIN_PG_TIMEOUT="20"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    judged = [f for f in ddpviz.diagnose(out) if f.severity != "info"]
    assert judged == [], judged
