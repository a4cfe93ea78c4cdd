"""A rank's stack when none of its Python threads can run (probes/stuck_stack.py), and what the
kernel says of its threads (probes/thread_state.py), without ranks: a real process holds the GIL
in C code (tests/probes/gil_holder.py) while this one, as its waiting peer, has faulthandler dump
it. The jobs are tests/record/test_where.py (torchrun) and tests/launch/test_launch.py."""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from ddpviz.probes import stack_text as st
from ddpviz.probes import stuck_stack as ss
from ddpviz.probes import thread_state as ts
from ddpviz.probes import whereabouts as wa
from tests.polling import eventually

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, tgkill")

ROOT = Path(__file__).resolve().parents[2]
HOLDER = ROOT / "tests" / "probes" / "gil_holder.py"


class Child:
    """gil_holder.py running in MODE; its stdout and stderr read on threads."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.proc = subprocess.Popen([sys.executable, str(HOLDER), *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout, self.proc.stderr
        self._readers = [threading.Thread(target=lambda: self.lines.extend(out), daemon=True),
                         threading.Thread(target=lambda: self.err.extend(err), daemon=True)]
        for reader in self._readers:
            reader.start()

    def line(self, prefix: str, timeout: float = 60) -> str:
        assert eventually(lambda: any(x.startswith(prefix) for x in self.lines), timeout), (
            prefix, self.lines, self.err)
        return next(x for x in self.lines if x.startswith(prefix))[len(prefix):].strip()

    def contacts(self, count: int = 1) -> list[ss.Contact]:
        assert eventually(lambda: sum(x.startswith("contact ") for x in self.lines) >= count,
                          60), (self.lines, self.err)
        return [msgspec.json.decode(x[len("contact "):], type=ss.Contact)
                for x in self.lines if x.startswith("contact ")]

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        """Its exit status and stderr, once it exited."""
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for reader in self._readers:
            reader.join(10)
        return self.proc.returncode, "".join(self.err)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()


def planted_line() -> int:
    return next(n for n, t in enumerate(HOLDER.read_text().splitlines(), 1)
                if t.rstrip().endswith("# PLANTED gil"))


def test_a_process_holding_the_gil_in_c_code_is_dumped_without_interrupting_its_call(
        children: list[Child]) -> None:
    hold = 12
    child = Child("hold", str(hold))
    children.append(child)
    (contact,) = child.contacts()
    assert contact.signal == signal.SIGRTMAX and contact.pid == child.proc.pid
    assert contact.host == ts.host_key() and contact.pulse_tid and contact.thread
    # once its pulse thread has not run for STALE_S, it cannot: the GIL is held in C code
    assert eventually(lambda: (ss._stamp_age(contact.stamp) or 0) >= ss.STALE_S + 0.5, 30)
    got = ss.rescue_contacts({1: contact})[1]
    assert got.why == "" and got.stack, got
    inner = got.stack[0]
    assert (Path(inner.file).name, inner.line, inner.func) == (
        "gil_holder.py", planted_line(), "load_batch")
    assert got.holds_gil(), got  # its pulse thread waits on a futex, its training thread not
    assert all(t.state in ("S", "R") for t in got.training), got
    now = got.training_now()
    assert now is not None and now.state == "S", got
    lines = ss.lines(1, got, wa.ANSWER_S)
    assert lines[0].startswith("rank 1's training thread has held the GIL in C code for about ")
    assert lines[0].endswith("its Python stack, dumped by faulthandler:")
    assert lines[1].startswith(f"rank 1 is at tests/probes/gil_holder.py:{planted_line()} in "
                               "load_batch <- ")
    assert "  tests/probes/gil_holder.py:" + str(planted_line()) + \
        " in load_batch: left = libc.sleep(seconds)  # PLANTED gil" in lines
    assert lines[-1].startswith("  its training thread, per /proc: sleeping (S)")
    # the same through stack_detail, as a hang finding shows it: no "did not post"
    detail = wa.stack_detail({}, (1,), 0, None, 2, {1: got})
    assert list(detail) == lines
    # the signal went to the pulse thread: the C call ran its full time, not cut short
    code, err = child.finish()
    assert code == 0, err
    left, elapsed = child.line("slept ").split()
    assert int(left) == 0 and float(elapsed) >= hold - 0.5, (left, elapsed)


def test_a_job_that_set_its_own_faulthandler_is_left_alone(
        children: list[Child], tmp_path: Path) -> None:
    """The job enabled faulthandler, registered it on SIGRTMAX, put a Python handler on
    SIGRTMAX-1 and armed dump_traceback_later: ddpviz takes SIGRTMAX-2 and changes none of
    them; its own dump goes to its own file only."""
    job_file = tmp_path / "job-faulthandler.txt"
    later = 2.0
    child = Child("own", str(later), str(job_file), "30")
    children.append(child)
    (contact,) = child.contacts()
    job = json.loads(child.line("job "))
    assert contact.signal == signal.SIGRTMAX - 2, contact
    assert job == {"enabled": True, "handler": True}
    # ddpviz's dump (the child's pulse thread runs: no "held the GIL")
    got = ss.rescue_contacts({1: contact})[1]
    assert got.stack and not got.holds_gil() and not got.starved(), got
    assert ss.lines(1, got, 2.0)[0] == (
        "rank 1 did not post its stack within 2s; its training thread's Python stack, dumped by "
        "faulthandler:")
    assert "Thread 0x" not in job_file.read_text()  # nothing of it in the job's file
    # the job's own signals still do what the job set them to
    os.kill(child.proc.pid, signal.SIGRTMAX)
    assert eventually(lambda: "Thread 0x" in job_file.read_text(), 30)
    os.kill(child.proc.pid, signal.SIGRTMAX - 1)
    child.line("job handler ran")
    # and its dump_traceback_later was not cancelled by ddpviz's arming
    child.line("done")
    assert "Timeout (0:00:02)!" in job_file.read_text()
    assert Path(contact.dump).read_text().count("Thread 0x") >= 1  # ddpviz's, in its file


def test_with_no_free_signal_ddpviz_steps_aside_saying_so_once(children: list[Child]) -> None:
    child = Child("none")
    children.append(child)
    contacts = child.contacts(2)
    code, err = child.finish()
    assert code == 0, err
    assert err.count("ddpviz: rank stacks: every real-time signal is caught, ignored or "
                     "blocked in this process") == 1, err
    assert all(c.signal == 0 and "every real-time signal" in c.why for c in contacts)
    got = ss.rescue_contacts({1: contacts[0]})[1]
    assert not got.stack
    assert wa.stack_detail({}, (1,), 0, None, 2, {1: got}) == (
        f"rank 1 did not post its stack within {wa.ANSWER_S:g}s (busy in C code holding the GIL, "
        "or gone; ddpviz could not dump it there: every real-time signal is caught, ignored or "
        "blocked in this process, and ddpviz takes none the job may use)",)


def test_a_handler_the_job_installs_later_withdraws_the_contact(children: list[Child]) -> None:
    """The job puts its own Python handler on ddpviz's signal after ddpviz armed: the pulse
    thread's next look withdraws the contact (said once), and no peer sends it."""
    child = Child("takeover", "1")
    children.append(child)
    armed, withdrawn = child.contacts(2)
    assert armed.signal and not withdrawn.signal
    assert withdrawn.why == (f"the job installed its own handler for signal {armed.signal}, "
                             "which ddpviz had registered faulthandler on")
    got = ss.rescue_contacts({1: withdrawn})[1]
    assert not got.stack and withdrawn.why in got.why
    code, err = child.finish()
    assert code == 0, err
    assert err.count("ddpviz no longer signals this rank") == 1, err
    assert "job handler ran" not in child.lines


def test_a_contact_that_cannot_be_reached_says_why() -> None:
    here = ts.host_key()
    base = ss.Contact(here, os.getpid(), ts.start_time(os.getpid()), signal=signal.SIGRTMAX,
                      dump="/nonexistent", stamp="", thread=1, tid=1, pulse_tid=1)
    far = msgspec.structs.replace(base, host="gpu-node-7 other-boot 1")
    assert ss.rescue_contacts({3: far})[3].why.startswith("it runs on another host (or pid "
                                                          "namespace)")
    gone = msgspec.structs.replace(base, start="not-this-process")
    assert ss.rescue_contacts({3: gone})[3].why == f"its process (pid {os.getpid()}) has exited"
    assert wa.stack_detail({}, (3,), 0, None, 4, ss.rescue_contacts({3: gone})) == (
        f"rank 3 did not post its stack within {wa.ANSWER_S:g}s (its process (pid "
        f"{os.getpid()}) has exited)",)
    # a signal that is not a real-time one is never sent (SIGTERM would run the job's handler)
    term = msgspec.structs.replace(base, signal=signal.SIGTERM)
    assert ss.rescue_contacts({3: term})[3].why == (
        f"its contact names signal {int(signal.SIGTERM)}, which ddpviz never uses")
    # no contact at all (a rank without a pulse thread yet): the words of before
    assert ss.rescue_contacts({3: None})[3].why == ""


def test_the_gil_is_named_only_on_the_evidence() -> None:
    """"Held the GIL" needs: ddpviz's thread there stale, asleep on futexes only (a state read
    as asleep with no kernel function and no system call woke between the reads), or barely on
    a CPU; and the training thread never on a futex."""
    futex = ts.ThreadState("S", "futex_do_wait", 202)
    woke = ts.ThreadState("S", "", ts.NOT_IN_A_SYSCALL)
    runnable = ts.ThreadState("R", "", ts.NOT_IN_A_SYSCALL)
    store = ts.ThreadState("S", "do_sys_poll", 7)
    asleep = ts.ThreadState("S", "hrtimer_nanosleep", 230)

    def rescue(quiet: float, pulse: tuple[ts.ThreadState, ...],
               training: tuple[ts.ThreadState, ...], cpu: float | None = None) -> ss.Rescue:
        return ss.Rescue((st.Frame("t.py", 1, "f"),), "", quiet, pulse, training, True, cpu)

    assert rescue(5, (futex, woke, runnable), (asleep, runnable)).holds_gil()
    assert rescue(5, (runnable,) * 8, (runnable,), cpu=0.01).holds_gil()  # (under load)
    assert not rescue(5, (runnable,) * 8, (runnable,), cpu=0.9).starved()  # it runs Python
    assert not rescue(5, (runnable,) * 8, (runnable,)).starved()  # (no CPU time: unknown)
    assert not rescue(1, (futex,), (asleep,)).starved()  # not stale: it may be just late
    assert not rescue(5, (futex, store), (asleep,)).starved()  # it waits for the store
    starved = rescue(5, (futex,), (asleep, futex))  # the training thread waits too
    assert starved.starved() and not starved.holds_gil()
    assert ss.lines(1, starved, 2.0)[0].startswith("no Python thread of rank 1 has run for "
                                                   "about 5s (a thread holds the GIL in C code)")
    assert not woke.asleep_elsewhere and store.asleep_elsewhere and not futex.asleep_elsewhere


def test_the_sampling_ends_early_only_on_a_conclusive_sleep() -> None:
    """The dump's sampling stops before _WINDOW_S only once the pulse thread was read asleep on
    something: a state read as asleep that woke between the reads (as a thread waiting for the
    GIL does every 5 ms) must leave the window open, or under load neither a futex nor a CPU
    share is known and "held the GIL" is not said (a CI failure: one ambiguous sample ended the
    window after 50 ms, pulse_cpu None)."""
    contact = types.SimpleNamespace(pid=1, tid=1, pulse_tid=1)
    one = ss._Sent(contact, 0, 5.0)  # type: ignore[arg-type]
    one.pulse = [ts.ThreadState("R", "", ts.NOT_IN_A_SYSCALL), ts.ThreadState("S", "", None),
                 ts.ThreadState("S", "", ts.NOT_IN_A_SYSCALL)]
    assert not one.seen_asleep()
    one.pulse.append(ts.ThreadState("S", "futex_do_wait", None))
    assert one.seen_asleep()
    one.pulse = [ts.ThreadState("S", "do_sys_poll", 7)]  # asleep elsewhere: conclusive too
    assert one.seen_asleep()


def test_faulthandler_dumps_parse_into_threads_with_their_ids(tmp_path: Path) -> None:
    path = tmp_path / "dump.txt"
    with path.open("w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    threads = dict(st.faulthandler_threads(path.read_text()))
    mine = threads[threading.get_ident()]
    here = test_faulthandler_dumps_parse_into_threads_with_their_ids.__code__
    assert (mine[0].file, mine[0].func) == (here.co_filename, here.co_name)  # innermost first
    frames: list[tuple[str, str]] = []
    frame: types.FrameType | None = sys._getframe()
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    assert [(f.file, f.func) for f in mine] == frames[:100]  # (faulthandler shows 100)


def test_the_kernel_state_of_a_sleeping_and_a_locked_thread() -> None:
    lock = threading.Lock()
    lock.acquire()
    tids: dict[str, int] = {}

    def sleeper() -> None:
        tids["sleep"] = threading.get_native_id()
        time.sleep(30)

    def locked() -> None:
        tids["lock"] = threading.get_native_id()
        lock.acquire()

    for target in (sleeper, locked):
        threading.Thread(target=target, daemon=True).start()
    assert eventually(lambda: len(tids) == 2)
    def asleep(tid: int) -> bool:
        state = ts.thread_state(os.getpid(), tid)
        return state is not None and state.state == "S"

    for tid in tids.values():
        assert eventually(functools.partial(asleep, tid), 30)
    sleeping = ts.thread_state(os.getpid(), tids["sleep"])
    assert sleeping is not None and not sleeping.waits_on_futex
    assert sleeping.describe().startswith("sleeping (S)")
    waiting = ts.thread_state(os.getpid(), tids["lock"])
    assert waiting is not None and waiting.state == "S"
    assert waiting.waits_on_futex or (waiting.wchan == "" and waiting.syscall is None)
    lock.release()
    assert ts.thread_state(os.getpid(), 1 << 30) is None  # no such thread
