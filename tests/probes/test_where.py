"""Where a thread is, read from another thread (probes/where.py), and the verdicts built on it
(probes/whereabouts.py), without ranks: a real thread parked in a sleep, in a loop or after
it, read the way the pulse thread reads the training thread. The jobs are
tests/record/test_where.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import torch.distributed as dist

from ddpviz.probes import stack_text as st
from ddpviz.probes import where as wh
from ddpviz.probes import whereabouts as wa
from ddpviz.probes.rendezvous import Board, Position, Scope
from tests.polling import eventually
from tests.probes.ranks_in_threads import FakeGroup


class Parked:
    """A thread running `body(self)`; `at` names where it is parked now."""

    def __init__(self, body: Callable[[Parked], None]) -> None:
        self.at = ""
        self.go = threading.Event()
        self.chain: list[Any] = []
        self.thread = threading.Thread(target=body, args=(self,), daemon=True)
        self.thread.start()

    def wait_at(self, at: str) -> None:
        assert eventually(lambda: self.at == at, 30), (self.at, at)
        time.sleep(0.05)  # (from setting `at` into the call that parks it)

    def frame(self) -> Any:
        assert self.thread.ident is not None
        return wh.thread_frame(self.thread.ident)


def ddp_call(p: Parked) -> None:
    """Stands for the DDP's forward: notes its caller as the watchdog's heartbeat does."""
    import sys

    p.chain = wh.caller_chain(sys._getframe(1))


def training(p: Parked) -> None:
    for step in range(3):
        ddp_call(p)
        if step == 1:
            p.at = "in the loop"
            p.go.wait()
            p.go.clear()
    p.at = "after the loop"
    p.go.wait()
    p.go.clear()
    for i in range(2):  # a second loop: it may call the DDP again
        p.at = f"in a later loop {i}"
        p.go.wait()
        p.go.clear()
    p.at = "returning"


def test_a_thread_in_its_loop_after_it_in_a_later_loop_and_returned() -> None:
    p = Parked(training)
    p.wait_at("in the loop")
    loop = wh.find_loop(p.chain)
    assert loop is not None and loop.code is training.__code__
    source = training.__code__.co_firstlineno
    assert loop.start == source + 1  # the `for step in range(3):` line
    assert wh.left_loop(loop, p.frame()) == ""
    p.go.set()
    p.wait_at("after the loop")
    assert wh.left_loop(loop, p.frame()) == "after"
    p.go.set()
    p.wait_at("in a later loop 0")
    assert wh.left_loop(loop, p.frame()) == ""  # not told apart: no verdict
    p.go.set()
    p.wait_at("in a later loop 1")
    p.go.set()
    p.thread.join(30)
    assert not p.thread.is_alive()
    other = Parked(lambda q: (setattr(q, "at", "elsewhere"), q.go.wait()))
    other.wait_at("elsewhere")
    assert wh.left_loop(loop, other.frame()) == "returned"  # the loop's function is gone
    other.go.set()


def micro_batches(p: Parked) -> None:
    for _ in range(2):  # the DDP called from a helper's own loop (gradient accumulation)
        ddp_call(p)


def accumulating(p: Parked) -> None:
    for step in range(3):
        p.at = f"loading {step}"  # the helper returned: its caller's loop goes on
        p.go.wait()
        p.go.clear()
        micro_batches(p)
    p.at = "after the loop"
    p.go.wait()


def test_a_helper_that_loops_over_micro_batches_does_not_hide_the_caller_s_loop() -> None:
    p = Parked(accumulating)
    p.wait_at("loading 0")
    p.go.set()
    p.wait_at("loading 1")
    loop = wh.find_loop(p.chain)
    assert loop is not None and loop.code is micro_batches.__code__  # the innermost loop
    assert wh.left_loop(loop, p.frame()) == ""  # not left: loading data in the caller's loop
    p.go.set()
    p.wait_at("loading 2")
    p.go.set()
    p.wait_at("after the loop")
    assert wh.left_loop(loop, p.frame()) == "returned"
    p.go.set()


def sleeper(p: Parked) -> None:
    def load_batch() -> None:
        p.at = "asleep"
        time.sleep(30)

    load_batch()


def test_a_sleeping_thread_is_read_with_its_line_and_the_plumbing_folded() -> None:
    p = Parked(sleeper)
    p.wait_at("asleep")
    stack = wh.frames(p.frame())
    text = st.summary(stack)
    assert text.startswith("tests/probes/test_where.py:"), text
    assert " in load_batch <- tests/probes/test_where.py:" in text and " in sleeper" in text
    lines = st.stack_lines(stack)
    assert any("in load_batch: time.sleep(30)" in line for line in lines), lines
    assert lines[0].startswith("... ") and "stdlib" in lines[0]  # threading's frames, folded
    assert len(lines) <= st.MAX_SHOWN and all(len(line) <= st.MAX_LINE for line in lines)


def test_a_deep_stack_is_bounded() -> None:
    def deep(n: int, p: Parked) -> None:
        if n:
            deep(n - 1, p)
        else:
            p.at = "deep"
            p.go.wait()

    p = Parked(lambda q: deep(200, q))
    p.wait_at("deep")
    stack = wh.frames(p.frame())
    assert len(stack) == wh.MAX_FRAMES
    lines = st.stack_lines(stack)
    assert len(lines) == st.MAX_SHOWN and any(" more lines" in line for line in lines)
    assert len(st.summary(stack)) <= st.MAX_LINE
    p.go.set()


def where(step: int, left: str = "", blocked: str = "") -> wa.Where:
    return wa.Where(step, time.time(), "train.py:9 in main", ("train.py:9 in main: x",),
                    left=left, loop="the loop at train.py:5 in main (lines 5-8)",
                    blocked=blocked)


def running(step: int) -> Position:
    return Position("running", step, "forward", time.time())


def test_left_verdicts_name_only_ranks_that_left_before_this_step() -> None:
    # blocked after its loop: it cannot come back; an error naming the step counts
    f = wa.left_finding(0, 7, 3, {1: running(6), 2: running(7)},
                        {1: where(6, "after", "barrier")}, waiting="in the all-reduce")
    assert f is not None and (f.severity, f.ranks, f.step, f.field) == (
        "error", (1,), 7, "left_loop")
    assert f.title.startswith("rank 1 left the training loop after 7 steps while rank 0 went "
                              "on to step 7: it is blocked in torch.distributed's barrier")
    assert dict((rs, v) for v, rs in f.values)[(0,)] == "runs step 7, waiting in the all-reduce"
    # left but not blocked (it may still come back): a warning, never an error
    f = wa.left_finding(0, 7, 2, {1: running(6)}, {1: where(6, "returned")})
    assert f is not None and f.severity == "warning"
    # at the same step (every rank finished), came back since, or crashed: no verdict
    assert wa.left_finding(0, 6, 2, {1: running(6)}, {1: where(6, "exited")}) is None
    assert wa.left_finding(0, 9, 2, {1: running(8)}, {1: where(6, "after", "barrier")}) is None
    assert wa.left_finding(0, 9, 2, {1: running(6)}, {1: where(6, "crashed")}) is None


def test_stacks_are_asked_for_and_answered_through_the_board() -> None:
    store = dist.HashStore()
    boards = [Board(Scope(FakeGroup(r, 2), store=store), 0)  # type: ignore[arg-type]
              for r in range(2)]
    p = Parked(sleeper)
    p.wait_at("asleep")
    assert p.thread.ident is not None
    tracker = wa.Tracker(p.thread.ident)
    answered: list[int] = []

    def answer() -> None:  # rank 1's pulse thread, looking every 50 ms
        while not answered:
            news = boards[1].news()
            if news.requests:
                tracker.tick(boards[1], news, 4, quiet=True)
                answered.append(news.requests)
            time.sleep(0.05)

    threading.Thread(target=answer, daemon=True).start()
    got = wa.collect(boards[0], [1], grace=30)
    assert list(got) == [1] and got[1].step == 4 and got[1].answers == 1
    assert " in load_batch <- " in got[1].summary
    lines = wa.stack_detail(got, (1,), 0, None, 2)
    assert lines[0].startswith("rank 1 is at tests/probes/test_where.py:")
    assert any("time.sleep(30)" in line for line in lines)
    # a rank that never answers is said so, within the grace
    assert wa.stack_detail(wa.collect(boards[1], [0], grace=0.2), (0,), 1, None, 2) == (
        f"rank 0 did not post its stack within {wa.ANSWER_S:g}s (busy in C code holding the "
        "GIL, or gone)",)
    # ... and, when its contact says it cannot be dumped by faulthandler from here, why not
    # (a rank that can is tests/probes/test_stuck_stack.py's)
    import os
    import signal

    from ddpviz.probes import stuck_stack, thread_state

    far = stuck_stack.Contact("gpu-node-7 another-boot 1", os.getpid(), "1",
                              signal=signal.SIGRTMAX, dump="/x", thread=1, tid=1, pulse_tid=1)
    boards[0].post(stuck_stack.KEY, msgspec.json.encode(far).decode())
    assert wa.hang_detail(boards[1], (0,), None, 4, grace=0.2) == (
        f"rank 0 did not post its stack within {wa.ANSWER_S:g}s (busy in C code holding the "
        "GIL, or gone; it runs on another host (or pid namespace): its stack is dumped only "
        "from the same one (gpu-node-7))",)
    gone = msgspec.structs.replace(far, host=thread_state.host_key(), start="not-this-one")
    boards[0].post(stuck_stack.KEY, msgspec.json.encode(gone).decode())
    assert wa.hang_detail(boards[1], (0,), None, 4, grace=0.2) == (
        f"rank 0 did not post its stack within {wa.ANSWER_S:g}s (its process (pid "
        f"{os.getpid()}) has exited)",)


def test_a_left_rank_is_named_once_this_rank_runs_a_later_step() -> None:
    """The news that rank 1 left comes while rank 0 is at the same step: nothing to say yet;
    rank 0's pulse looks again when rank 0 moves on, and names it then."""
    import types
    import warnings

    from ddpviz.events import Tap
    from ddpviz.findings import DiagnosisWarning
    from ddpviz.probes.pulse import Pulse
    from ddpviz.probes.quiet import QuietGuard
    from ddpviz.probes.rendezvous import LEFT_NEWS
    from ddpviz.probes.watchdog import Watchdog

    store = dist.HashStore()
    boards = [Board(Scope(FakeGroup(r, 2), store=store), 0)  # type: ignore[arg-type]
              for r in range(2)]
    events: list[Any] = []
    dog: Any = types.SimpleNamespace(timeout=30.0, rank=0, world_size=2, guarding=False,
                                     tap=Tap(events.append, rank=0))
    dog.waiting_finding = types.MethodType(Watchdog.waiting_finding, dog)
    guard = QuietGuard(dog, pg_timeout=60.0)
    pulse = Pulse(Board(Scope(FakeGroup(0, 2), store=store), 0))  # type: ignore[arg-type]
    pulse.on_left = guard.left
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiagnosisWarning)
        try:
            pulse.beat(2, "forward")
            boards[1].post_position(running(2))
            wa.post(boards[1], where(2, "after", "barrier"))
            boards[1].news(LEFT_NEWS)
            assert eventually(lambda: pulse._left_seen == 1)
            assert guard.findings == [] and pulse._left_pending  # the same step: not yet
            pulse.beat(3, "forward")
            assert eventually(lambda: bool(guard.findings))
            assert [(f.kind, f.severity, f.ranks, f.step) for f in guard.findings] == [
                ("uneven_iterations", "error", (1,), 3)]
        finally:
            pulse.close()
    assert pulse.quiet_error is None


def secret_keeper(p: Parked) -> None:
    def load_batch() -> None:
        p.at = "asleep"
        time.sleep(30)  # token = "hunter2-SECRET"

    load_batch()


def test_without_stack_source_a_stack_has_file_line_and_function_but_no_source() -> None:
    """Recording(stack_source=False) (issue #37, D1): the pulse thread's stacks and the
    launcher's keep where a rank is and drop the line's text, which may hold a secret."""
    from ddpviz.launcher.stacks import format_stack

    p = Parked(secret_keeper)
    p.wait_at("asleep")
    stack = wh.frames(p.frame())
    shown = st.stack_lines(stack)
    assert any("in load_batch: time.sleep(30)  # token = \"hunter2-SECRET\"" in line
               for line in shown), shown  # the default, as before
    hidden = st.stack_lines(stack, source=False)
    assert not any("hunter2" in line or "time.sleep" in line for line in hidden), hidden
    assert any(line.startswith("tests/probes/test_where.py:") and line.endswith(" in load_batch")
               for line in hidden), hidden
    assert len(hidden) == len(shown)
    assert p.thread.ident is not None
    taken = wa.Tracker(p.thread.ident, source=False).take(3)
    assert taken.stack == tuple(hidden) and " in load_batch <- " in taken.summary
    frames = [(f.file, f.line, f.func) for f in reversed(stack)]
    launcher = format_stack(1, [frames], source=False)
    assert not any("hunter2" in line for line in launcher)
    assert any(" in load_batch" in line for line in launcher)
    assert any("hunter2" in line for line in format_stack(1, [frames]))


def test_a_hang_finding_without_stack_source_names_the_line_without_its_text() -> None:
    """Two ranks as threads around one store: rank 1 sleeps in its data loading on a line
    holding a secret while rank 0 waits in the all-reduce; rank 1's watchdog was built with
    its recording's stack_source=False, so the hang finding names its file:line and function
    and leaves the text out."""
    import torch

    from ddpviz.errors import RankHangError
    from ddpviz.events import Tap
    from ddpviz.probes.watchdog import Watchdog
    from tests.probes.ranks_in_threads import in_threads

    def rank_fn(rank: int, store: dist.Store) -> Any:
        d = Watchdog(FakeGroup(rank, 2), timeout=0.5, tap=Tap(None, rank=rank),  # type: ignore[arg-type]
                     store=store, stack_source=rank == 0)
        d.start()

        def load_batch() -> None:
            time.sleep(2.5)  # password = "hunter2-SECRET"

        if rank == 1:
            d.heartbeat(1, "forward")
            load_batch()
        d.heartbeat(2, "forward")
        try:
            d.wait(torch.futures.Future(), collective="all-reduce", bucket=0, params=["w"])
        except RankHangError as exc:
            return exc
        return None

    results = in_threads(rank_fn, [0, 1], dist.HashStore())
    err = results[0]
    assert isinstance(err, RankHangError), results
    text = str(err)
    assert "hunter2" not in text and "time.sleep(2.5)" not in text, text
    detail = [line for f in err.findings for line in f.detail]
    assert any(line.startswith("rank 1 is at tests/probes/test_where.py:") and
               " in load_batch <- " in line for line in detail), detail
    assert any(line.strip().startswith("tests/probes/test_where.py:")
               and line.endswith(" in load_batch") for line in detail), detail
