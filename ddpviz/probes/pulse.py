"""A rank's heartbeat, posted from a daemon thread.

Each synced forward tells the other ranks where this rank is (a position on the DDP's notice
board, rendezvous.Board) and looks, every CHECK_S, for errors other ranks posted. Done on the
training thread, that is a store write per forward and a store round trip twice a second: ~7 us
and ~20-60 us on a quiet machine, but milliseconds when the rank hosting the store is starved
of CPU, which a debugger that is left on cannot afford. `Pulse` moves both onto one daemon
thread with its own store connection. The thread posts the latest position (positions are
coalesced, never queued) and sets `alerted` when another rank posted an alert, which the next
heartbeat raises. Steps 0-2 (iteration 0 and the bucket rebuild, where most hangs happen) wake
the thread and are posted at once. While steps keep coming after that, the thread looks every
POST_S and posts the latest one, and `beat()` is three attribute writes, with no Event.set (a
lock, and a wake-up of this thread on the rank's core) and no store round trip per step
(benchmarks/bench_heartbeat.py, quiet machine: median 0.2 us, mean 0.4 us a beat; 0.7 us when
every beat set the Event, 14 us inline). A rank killed outright is therefore seen where it
was at most POST_S before (a rank that exits through Python posts its last beat). Before the
training thread posts a "waiting" or "failed" position itself it calls `hold()`, which waits
out a post in flight, so a stale "running" position can never overwrite it.

At each look the thread also answers a waiting rank's request for this rank's stack and says
when the training thread has left the loop that calls the DDP (`tracker`, whereabouts.py:
nothing per step, a frame walk only while the training thread is quiet); `on_left`, when set,
is called when another rank said it left. When it cannot run at all (the training thread holds
the GIL in C code), a peer on the same host has it dumped by faulthandler instead (`beacon`,
stuck_stack.py: a time stamp written at each wake, 0.2-0.4 us).

`on_quiet`, when set, is called on this thread every CHECK_S with the board and the latest beat
(step, phase, time.time()) while the training thread is away: the watchdog's guard for waits it
cannot see (watch()'s levels without a comm hook; See [Note: the quiet guard] in quiet.py).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable

from ddpviz.events import Phase
from ddpviz.probes.rendezvous import Board, News, Position
from ddpviz.probes.stuck_stack import Beacon
from ddpviz.probes.whereabouts import Tracker

# The job is ending on this rank: an atexit handler of ddpviz's or destroy_process_group of the
# default group began (See quiet.py's `_exiting`). Set once, never cleared.
ENDING = threading.Event()

Beat = tuple[int, Phase, float]  # step, phase, time.time()

CHECK_S = 0.5  # other ranks' alerts are looked for at most this often
POST_S = 0.05  # from step EVERY_UNTIL on, the latest position is posted this often
EVERY_UNTIL = 3  # steps before this one are posted at once
_JOIN_S = 2.0  # how long close() waits for a store call in flight
# After its watch closed, the thread still runs its tasks this long (the NaN check composes
# the other ranks' last steps as they post them), then stops.
CLOSE_GRACE_S = 30.0

_LIVE: weakref.WeakSet[Pulse] = weakref.WeakSet()
_RETIRED: list[Board] = []  # boards of ended pulse threads, dropped on a training thread
_RETIRED_LOCK = threading.Lock()


class Pulse:
    """Posts this rank's latest position and watches for alerts, off the training thread.

    Args:
        board: the DDP's notice board, on the background threads' connection (a cloned
            Scope: See [Note: one background connection] in rendezvous.py).
        stack_source: the stacks it posts show source text (`Recording.stack_source`).
    """

    def __init__(self, board: Board, *, stack_source: bool = True) -> None:
        self.board = board
        self.alerted = False  # another rank posted an alert (the next heartbeat raises it)
        self.error: RuntimeError | None = None  # the store failed (its host exited)
        self._latest: Beat | None = None
        self.last: Beat | None = None  # the latest beat, posted or not
        self.on_quiet: Callable[[Board, Beat], None] | None = None
        self.quiet_error: Exception | None = None  # what stopped on_quiet, if anything
        # called on this thread after each post, with the board (probes/nonfinite.py's
        # exchange); one that raises is dropped, the heartbeat goes on
        self.tasks: list[Callable[[Board], None]] = []
        # where the training thread (the one creating the pulse) is, in code: whereabouts.py
        self.tracker = Tracker(threading.get_ident(), source=stack_source)
        # how a peer gets that stack when this thread cannot run (stuck_stack.py)
        self.beacon = Beacon(threading.get_ident(), source=stack_source)
        # a peer left the loop; returns whether to look again at this rank's next step
        self.on_left: Callable[[Board, Beat], bool] | None = None
        self._left_pending = False
        self._left_at = -1
        self.exiting = False  # closed at interpreter exit: say so on the board
        self._left_seen = 0
        self._held = False
        self._closed = False
        self._close_at: float | None = None  # close_soon(): monotonic time to stop at
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._polling = False  # beats are coming: the thread looks every POST_S, unwoken
        with _RETIRED_LOCK:  # (dropped here, on the training thread: See _run)
            _RETIRED.clear()
        self._thread = threading.Thread(target=self._run, name="ddpviz-pulse", daemon=True)
        _LIVE.add(self)
        self._thread.start()

    def beat(self, step: int, phase: Phase) -> None:
        """This rank reached `phase` of `step` (training thread; never blocks)."""
        self.last = self._latest = (step, phase, time.time())
        self._held = False
        if step < EVERY_UNTIL or not self._polling:
            self._wake.set()

    def hold(self) -> None:
        """Stop posting "running" positions until the next beat: the caller is about to post
        a position of its own. Returns once a post in flight has landed."""
        with self._lock:
            self._held = True
            self._latest = None

    def close(self, wait: bool = True) -> None:
        """Stop the thread once it has posted the last beat (waits up to _JOIN_S for that, if
        `wait`)."""
        self._closed = True
        self._wake.set()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)

    def close_soon(self, grace: float | None = None) -> None:
        """Stop the thread within `grace` seconds (CLOSE_GRACE_S by default), running its
        tasks until then: the watch is closed, but what the other ranks post about its last
        steps is still composed. Never waits."""
        self._close_at = time.monotonic() + (CLOSE_GRACE_S if grace is None else grace)

    def _run(self) -> None:
        checked = time.monotonic()
        try:
            self._start_beacon()
            while True:
                self._wake.wait(POST_S if self._polling else CHECK_S)
                self._wake.clear()
                self.beacon.stamp()
                with self._lock:  # closing still posts the last beat: a rank that exits
                    latest, self._latest = self._latest, None  # right after it is seen there
                    if latest is not None and not self._held:
                        step, phase, t = latest
                        self.board.post_position(Position("running", step, phase, t))
                    # a later step posted: keep looking without being woken; none: wait for one
                    # (a beat that raced this write waits at most CHECK_S)
                    self._polling = latest is not None and latest[0] >= EVERY_UNTIL
                for task in list(self.tasks):
                    try:
                        task(self.board)
                    except Exception:  # (a store error is seen by the next has_alerts)
                        self.tasks.remove(task)
                close_at = self._close_at
                if close_at is not None and time.monotonic() >= close_at:
                    self._closed = True
                if self._closed:
                    if self.exiting and self.last is not None:
                        self.tracker.exiting(self.board, self.last[0])
                    return
                now = time.monotonic()
                if now - checked >= CHECK_S:
                    checked = now
                    news = self.board.news()
                    if news.alerts:
                        self.alerted = True
                        return  # the next heartbeat raises; the slow paths read the board
                    self._whereabouts(news, latest is None)
                    self.beacon.check(self.board)
                    quiet, last = self.on_quiet, self.last
                    if quiet is not None and last is not None and latest is None:
                        try:
                            quiet(self.board, last)
                        except Exception as exc:  # (an emitter or warnings filter raising):
                            self.on_quiet = None  # the guard stops; the heartbeat goes on
                            self.quiet_error = exc
        except RuntimeError as exc:  # the store is gone (its host exited or was destroyed)
            self.error = exc
        finally:
            self.beacon.close()
            # This thread may hold the last reference to the pulse: its store connection (C++)
            # would then be destroyed here, and a daemon thread inside C++ when the interpreter
            # finalizes is ended by pthread_exit, which aborts the process (SIGABRT). Hand the
            # board to the training thread, which drops it at its next pulse or at exit.
            with _RETIRED_LOCK:
                _RETIRED.append(self.board)

    def _start_beacon(self) -> None:
        """Post how a peer gets this rank's stack without this thread (stuck_stack.py); an
        error there turns that off, not the heartbeat."""
        try:
            self.beacon.started(self.board)
        except RuntimeError:
            raise  # the store is gone: the loop's handler
        except Exception:
            self.beacon.close()

    def _whereabouts(self, news: News, quiet: bool) -> None:
        """Answer stack requests, say when the training thread left its loop, and look at
        peers that did (whereabouts.py); an error here stops these, not the heartbeat."""
        last = self.last
        try:
            self.tracker.tick(self.board, news, -1 if last is None else last[0], quiet)
            on_left = self.on_left
            if on_left is None or last is None:
                return
            # new news, or news this rank was not far enough to judge and it has moved on
            if news.left > self._left_seen or (self._left_pending and last[0] > self._left_at):
                self._left_seen, self._left_at = news.left, last[0]
                self._left_pending = on_left(self.board, last)
        except RuntimeError:
            raise  # the store is gone: the loop's handler
        except Exception as exc:  # (an emitter or warnings filter raising)
            self.on_left = None
            self.quiet_error = exc


@atexit.register
def _close_all() -> None:
    """No pulse thread may be inside a store call while the interpreter tears down."""
    for pulse in list(_LIVE):
        pulse.exiting = True
        pulse.close()
