"""ddpviz.launch on real spawned gloo ranks: results, environment, notebook-defined functions,
failures, hangs, stop and interrupt, and that no process (grandchildren included) survives."""

from __future__ import annotations

import _thread
import contextlib
import io
import linecache
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz.launcher import LaunchError, LaunchTimeout, RankError
from tests.launch import rank_fns
from tests.launch.processes import recorded_pids, still_alive

pytestmark = pytest.mark.dist

STOP_WITHIN_S = 5.0  # the launcher's promise for stop(), interrupts and timeouts


def notebook_namespace(filename: str) -> dict[str, Any]:
    """Run rank_fns.NOTEBOOK_CELL as IPython would: in __main__, source only in linecache."""
    source = rank_fns.NOTEBOOK_CELL
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def reported() -> tuple[list[Any], str, str, ddpviz.Run]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        run = ddpviz.launch(rank_fns.reduce_and_report, 2, args=("there",))
        values = run.wait(timeout=120)
    return values, out.getvalue(), err.getvalue(), run


def test_each_rank_returns_its_value_after_a_real_all_reduce(reported: Any) -> None:
    values, _, _, run = reported
    assert [v["rank"] for v in values] == [0, 1]
    assert [v["sum"] for v in values] == [3.0, 3.0]  # (0 + 1) + (1 + 1)
    assert {v["world_size"] for v in values} == {2}
    assert {v["backend"] for v in values} == {"gloo"}  # no GPU here
    assert run.backend == "gloo"
    assert run.returncodes == [0, 0]
    assert run.status == "finished"


def test_ranks_get_the_torchrun_environment(reported: Any) -> None:
    values, _, _, _ = reported
    envs = [v["env"] for v in values]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert {v["omp"] for v in values} == {"1"}  # conftest sets it; the launcher keeps it


def test_output_comes_back_prefixed_by_rank(reported: Any) -> None:
    _, out, err, _ = reported
    assert sorted(out.splitlines()) == ["[rank 0] hello there", "[rank 1] hello there"]
    assert "[rank 0] to stderr there" in err.splitlines()
    assert "[rank 1] to stderr there" in err.splitlines()


def test_each_rank_streams_its_events_into_the_runs_session(reported: Any) -> None:
    _, _, _, run = reported
    trace = run.trace
    assert trace.ranks == [0, 1]
    for rank in (0, 1):  # every event emitted is in by the time wait() returned
        assert [(e.rank, e.step, e.seq) for e in trace.events(rank)] == [
            (rank, s, s) for s in range(5 + rank)]
    stats = run.session.stats
    assert sorted(stats.closed) == [0, 1]  # each rank's sender said goodbye
    assert stats.total_rejected == 0 and sum(stats.gaps.values()) == 0


def test_runs_can_share_a_session() -> None:
    from ddpviz.session.live import listen

    with listen(show=False) as session:
        run = ddpviz.launch(rank_fns.emit, 2, args=(3,), session=session)
        assert run.wait() == [True, True]
        assert run.session is session
        assert not session.collector.closed  # the caller's session outlives the run
        assert len(session.trace.events(0)) == len(session.trace.events(1)) == 3


def test_no_process_survives_a_finished_run(reported: Any) -> None:
    _, _, _, run = reported
    assert still_alive(run.pids) == []


def test_a_notebook_defined_function_runs_on_every_rank() -> None:
    namespace = notebook_namespace("<notebook cell 1>")
    fn = namespace["notebook_fn"]
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(fn)  # what multiprocessing's spawn would do
    with contextlib.redirect_stdout(io.StringIO()):
        values = ddpviz.launch(fn, 2, kwargs={"offset": 0.5}).wait(timeout=120)
    assert values == [30.5, 30.5]  # SCALE * (1 + 2) + offset


def test_an_exception_on_rank_1_names_it_with_its_traceback_and_stops_rank_0(
        tmp_path: Path) -> None:
    fn = notebook_namespace("<notebook cell 2>")["notebook_fails_on_rank_1"]
    err_text = io.StringIO()
    with contextlib.redirect_stderr(err_text), contextlib.redirect_stdout(io.StringIO()):
        run = ddpviz.launch(fn, 2, args=(str(tmp_path),))
        with pytest.raises(RankError) as info:
            run.wait(timeout=120)
    error = info.value
    assert error.rank == 1
    assert str(error).startswith(
        "ddpviz: rank 1 raised ValueError: planted failure on rank 1 (world_size=2)")
    assert 'File "<notebook cell 2>", line' in error.traceback
    # the notebook cell's source line, although the rank never saw that "file"
    assert 'raise ValueError("planted failure on rank 1")' in error.traceback
    assert "[rank 1] ValueError: planted failure on rank 1" in str(error)
    assert "rank 0 stopped when rank 1 failed" in str(error)
    assert run.returncodes[1] == 1
    assert run.returncodes[0] != 0  # rank 0 was sleeping: it did not end by itself
    assert run.status == "failed"
    pids = recorded_pids(tmp_path, 2)
    assert still_alive([*run.pids, *pids]) == []
    rendered = error._render_traceback_()
    assert rendered[0] == "[rank 1] Traceback (most recent call last):"
    assert "launcher" not in "\n".join(rendered)  # kernel-side frames are not shown


def test_a_rank_that_dies_without_raising_is_reported_by_exit_code() -> None:
    with contextlib.redirect_stderr(io.StringIO()):
        run = ddpviz.launch(rank_fns.rank_1_exits_hard, 2)
        with pytest.raises(RankError) as info:
            run.wait(timeout=120)
    assert info.value.rank == 1
    assert "rank 1 exited with code 3 before returning" in str(info.value)
    assert still_alive(run.pids) == []


def test_a_second_init_process_group_gets_a_hint() -> None:
    import torch.distributed as dist

    with contextlib.redirect_stderr(io.StringIO()):
        run = ddpviz.launch(dist.init_process_group, 2, args=("gloo",))
        with pytest.raises(RankError) as info:
            run.wait(timeout=120)
    assert "trying to initialize the default process group twice" in str(info.value)
    assert str(info.value).splitlines()[-1].startswith(
        "ddpviz.launch already initialised the process group on every rank: remove the "
        "init_process_group call from the function")


def test_a_hang_times_out_naming_the_rank_still_running(tmp_path: Path) -> None:
    timeout = 15.0  # from launch: start-up (seconds on a loaded 2-core machine) counts
    start = time.monotonic()
    run = ddpviz.launch(rank_fns.rank_1_hangs, 2, args=(str(tmp_path),), timeout=timeout)
    with pytest.raises(LaunchTimeout) as info:
        run.wait()
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    assert info.value.ranks == [1]
    assert str(info.value).startswith("ddpviz: rank 1 still running after timeout=15s "
                                      "(world_size=2); rank 0 had returned; they were stopped.")
    assert elapsed < timeout + STOP_WITHIN_S
    stack = info.value.stacks[1]  # where rank 1 was when stopped, innermost call last
    assert stack[0] == "[rank 1] Stack (most recent call last):"
    assert stack[-1].startswith("[rank 1]   ")
    assert stack[-1].endswith(" in rank_1_hangs: time.sleep(600)")  # its frame, its line
    assert "\n".join(stack) in str(info.value)
    assert run.status == "timed out"
    assert still_alive([*run.pids, *recorded_pids(tmp_path, 2)]) == []


def test_a_rank_holding_the_gil_in_c_code_is_named_with_its_stack_from_faulthandler() -> None:
    """A launched rank's training thread holds the GIL in C code (libc's sleep() through
    ctypes.PyDLL) while its peer waits in ddpviz's DDP: the peer's RankHangError shows its
    Python stack, dumped by faulthandler (probes/stuck_stack.py), not "did not post its
    stack"; the C call runs its full time, so the rank then raises the same verdict."""
    run = ddpviz.launch(rank_fns.rank_1_holds_the_gil, 2, args=(3.0, 15), timeout=150)
    texts = run.wait()
    assert texts[0] == texts[1], texts  # one verdict, raised by both ranks
    text = texts[0]
    assert text.startswith("ddpviz: rank 1 did not reach the bucket rebuild broadcast at step "
                           "1 within 3s"), text
    assert "did not post its stack" not in text, text
    assert "rank 1's training thread has held the GIL in C code for about " in text, text
    source = Path(rank_fns.__file__)
    line = next(n for n, t in enumerate(source.read_text().splitlines(), 1)
                if t.rstrip().endswith("# PLANTED gil"))
    assert f"rank 1 is at tests/launch/rank_fns.py:{line} in rank_1_holds_the_gil" in text, text
    assert "ctypes.PyDLL(None).sleep(hold_s)  # PLANTED gil" in text


def test_stop_ends_every_rank_and_grandchild(tmp_path: Path) -> None:
    run = ddpviz.launch(rank_fns.sleep_forever, 2, args=(str(tmp_path),))
    pids = recorded_pids(tmp_path, 2)
    assert run.pids == pids[0::2]  # each rank wrote its own pid, then its grandchild's
    # wait()'s own timeout only stops the waiting
    with pytest.raises(TimeoutError, match=r"ranks 0, 1 still running after wait\(timeout=0.1\)"):
        run.wait(timeout=0.1)
    assert still_alive(pids, within=0) == pids
    start = time.monotonic()
    run.stop()
    assert time.monotonic() - start < STOP_WITHIN_S
    assert still_alive(pids) == []
    assert run.status == "stopped"
    with pytest.raises(LaunchError, match=r"^ddpviz: the run was stopped before ranks 0, 1 "):
        run.wait()


@pytest.fixture
def kernel_sigint() -> Iterator[None]:
    """SIGINT handled as in a kernel, even when pytest was started with it ignored (a
    background job of a non-interactive shell inherits SIGINT ignored, and then
    `_thread.interrupt_main()` does nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("kernel_sigint")
def test_interrupting_wait_stops_every_rank_then_propagates(tmp_path: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        run = ddpviz.launch(rank_fns.sleep_forever, 2, args=(str(tmp_path),))
    pids = recorded_pids(tmp_path, 2)
    timer = threading.Timer(0.2, _thread.interrupt_main)  # what interrupting the kernel does
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run.wait()
    assert time.monotonic() - start < 0.2 + STOP_WITHIN_S
    shown = err.getvalue().splitlines()
    assert shown[0] == "ddpviz: interrupted; where each rank was:"
    for rank in (0, 1):  # each rank's stack, down to the sleep it was in
        at = shown.index(f"[rank {rank}] Stack (most recent call last):")
        assert shown[at + 1].startswith(f"[rank {rank}]   ")
        assert shown[at + 1].endswith(" in sleep_forever: time.sleep(600)")
    assert still_alive(pids) == []
    assert run.status == "stopped"


def test_arguments_that_cannot_be_shipped_fail_at_launch() -> None:
    with pytest.raises(LaunchError, match=r"^ddpviz: cannot send 'reduce_and_report'"):
        ddpviz.launch(rank_fns.reduce_and_report, 2, args=(threading.Lock(),))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nprocs": 0}, "ddpviz: nprocs must be a positive int, got 0."),
    ({"timeout": -1}, "ddpviz: timeout must be positive seconds or None, got -1."),
])
def test_bad_arguments_are_rejected_before_anything_starts(kwargs: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(ValueError) as info:
        ddpviz.launch(rank_fns.reduce_and_report, **kwargs)
    assert str(info.value).splitlines()[0] == message
