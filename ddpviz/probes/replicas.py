"""The live replica check: do all ranks still hold the same bytes after each optimizer step?

[Note: replica digests]
DDP's contract: after each optimizer step every rank holds bitwise the same parameters, and
(broadcast_buffers=True) the same buffers right after the next forward's buffer broadcast.
Nothing in torch checks it after the constructor. On a checked step s (every `period`-th step,
`Recording(replicas=N)`):
  - at the end of backward s (after the reduction), each rank digests its gradients (where
    the hook-less watch arms that step anyway, or in an every-step mode: `grads_due`);
  - at the start of forward s+1 (after the optimizer step), its parameters, and its buffers
    right after that forward's broadcast (before it, without one).
A digest (probes/digest.py) is two int64 sums over a tensor's raw bytes, computed on the
tensors' device by a few ops for all tensors at once; the training thread only launches them
(on a GPU, the copy to the host is non-blocking with an event the check's thread waits for).
The check's own daemon thread, with its own store connection, posts each step's summary (a
hash of every digest) under the DDP's notice board (rendezvous.Board) and never touches the
user's process group. Rank 0's thread compares the summaries; when they differ it asks every
rank for the per-tensor digests and sizes of that step (kept for the last HISTORY checks),
names the differing tensors, the groups of ranks and the likely cause
(probes/replica_verdict.py), and emits a `replicas_diverged` finding as a FindingReported
event, warning once on stderr. It never raises into the job.
Buffers are compared only right after a broadcast (or with broadcast_buffers=False): a forward
without one (require_forward_param_sync off) leaves them out. The job's end and checkpoints:
See [Note: the job's end and checkpoints].
Narrowing: a divergence first seen at a sampled step lies somewhere after the last step that
agreed. From then on, every step is checked for `period` steps (the ranks agree on when that
window starts through the store): parameters that start to differ there, and the gradients of
each step, are then named at their exact step.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import torch

from ddpviz.events import FindingReported, Tap
from ddpviz.findings import Finding, warning_of
from ddpviz.limits import MAX_PARAMS
from ddpviz.probes.digest import Snapshot
from ddpviz.probes.pulse import ENDING
from ddpviz.probes.rendezvous import Board, Scope, as_text
from ddpviz.probes.replica_verdict import RankState, differing_names, judge
from ddpviz.recording import NEVER

HISTORY = 64  # checked steps each rank keeps (digests and sizes) for rank 0 to ask about
POLL_S = 0.05  # the thread looks at the store this often while it has work
IDLE_S = 0.25  # ... and this often when it has none
GIVE_UP_S = 120.0  # rank 0 stops waiting for a step's summaries or details after this
PRECISE_LEAD = 4  # the every-step window starts this many steps after rank 0 saw a divergence
MAX_FINDINGS = 8  # replicas_diverged findings per DDP (the first is also printed)
FINAL_S = 2.0  # at the job's end, how long a rank waits for the final comparison (bounded)


class _Capture:
    """One checked step on this rank: device tensors (launched), read on the thread."""

    __slots__ = ("buffer_names", "buffers", "event", "grads", "params", "step", "synced")

    def __init__(self, step: int, synced: bool, grads: Snapshot | Digests | None) -> None:
        self.step = step
        self.synced = synced
        self.grads = grads
        self.params: Snapshot | Digests | None = None
        self.buffers: Snapshot | Digests | None = None
        self.buffer_names: list[str] = []
        self.event: Any = None


Digests = tuple[torch.Tensor, torch.Tensor | None]


def _take(tensors: Sequence[torch.Tensor | None], stats: bool) -> Snapshot | Digests:
    """On the CPU, a snapshot (one copy; the check's thread digests it, so the training
    thread only copies); on a GPU, the digests themselves, launched there and copied to the
    host without waiting (the check's thread waits for the event)."""
    snap = Snapshot(tensors)
    if snap.device.type == "cpu":
        return snap
    digests, sizes = snap.digest(stats=stats)
    return (digests.to("cpu", non_blocking=True),
            None if sizes is None else sizes.to("cpu", non_blocking=True))


def _digests(taken: Snapshot | Digests | None, stats: bool) -> Digests | None:
    if taken is None or not isinstance(taken, Snapshot):
        return taken
    return taken.digest(stats=stats)


class _Summary(msgspec.Struct, frozen=True):
    params: str
    grads: str
    buffers: str


class _Detail(msgspec.Struct, frozen=True):
    params: bytes
    param_stats: bytes
    grads: bytes
    grad_stats: bytes
    buffers: bytes
    buffer_stats: bytes
    buffer_names: list[str]
    synced: bool


def _hash(a: np.ndarray | None) -> str:
    return "" if a is None else hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()


class ReplicaCheck:
    """One DDP's replica check on this rank (created by watch() and ddpviz's DDP).

    Args:
        period: check every `period`-th step (1: every step).
        params: the DDP's parameters, in its order; `names` their dotted names.
        buffers: returns the DDP's (name, buffer) pairs as of now.
        broadcast_buffers: whether DDP broadcasts buffers before each forward.
        board: the DDP's notice board (the watchdog's; None: no check, the store is off).
        tap: where rank 0's finding goes.
    """

    def __init__(self, period: int, params: Sequence[torch.Tensor], names: Sequence[str],
                 buffers: Callable[[], list[tuple[str, torch.Tensor]]],
                 broadcast_buffers: Callable[[], bool], board: Board, tap: Tap) -> None:
        self.period = period
        self.params = list(params)
        self.names = list(names)
        self._buffers = buffers
        self._broadcast_buffers = broadcast_buffers
        self.tap = tap
        self.rank = board.rank
        self.world_size = board.world_size
        self._board = Board(Scope(board.scope.group, store=board.scope.store, clone=True),
                            board.epoch)
        self._base = f"{board.base}/rep"
        self._pending: _Capture | None = None  # grads taken, waiting for the next forward
        self._waiting: _Capture | None = None  # parameters taken, waiting for the broadcast
        self.precise: tuple[int, int] = (0, 0)  # every step in [from, to) is checked
        self.latest = -1  # the latest forward step seen (rank 0: where the window starts)
        self.findings: list[Finding] = []  # rank 0: what the check reported
        self.compared = 0  # rank 0: checked steps whose digests it compared
        self.error: Exception | None = None  # what stopped the thread, if anything
        # appended by the training thread, taken by the check's thread, which looks every
        # POLL_S: waking it per step (a queue's put) cost ~0.3 ms a step in GIL hand-offs
        self._queue: deque[_Capture] = deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._judging: list[int] = []  # rank 0: steps to compare, in order
        self._judged_all = False  # (ranks > 0) rank 0 said it judged everything at exit
        self._idle = False  # the thread found nothing queued in its last look
        self._last_taken = -1  # the latest step whose parameters this rank took
        self._checkpoints: list[int] = []  # steps after which a state_dict was taken
        self._want_window = False  # a checkpoint asks every rank to check a step soon
        self._final = -1  # the step of the final comparison (finish), once taken
        self._deadline: float | None = None  # (finish) nothing is waited for past this
        self._stopping = False  # the thread returns once it has posted what is queued
        self._submitted = 0  # captures queued so far ...
        self._judged = 0  # ... and (rank 0) judged so far
        self.group = board.scope.group  # (destroy_process_group of it ends the check)
        self._hooks: list[Any] = []  # the state_dict hook (removed by finish)
        # (set by watch) whether the DDP's next backward all-reduces, read at a checked forward
        self.synced: Callable[[], bool] | None = None
        # called (the check's thread) when `precise` changed: a plain-steps window is void
        self.on_change: Callable[[], None] | None = None

    # --- the training thread ------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether `step` is checked."""
        return step % self.period == 0 or self.precise[0] <= step < self.precise[1]

    def grads_due(self, step: int) -> bool:
        """Whether `step`'s reduced gradients are worth a hook at the end of its backward (the
        hook-less watch arms per-parameter hooks for it): in the precise mode and the
        every-step window only. A periodic step takes them only when something else armed it
        (the sampled steps 0-2 and every `every`-th); else its finding says they were not
        checked. See [Note: replica digests]."""
        return self.period == 1 or self.precise[0] <= step < self.precise[1]

    def plain_until(self, step: int) -> int:
        """Steps from `step` up to the one returned (exclusive) neither are checked nor follow
        a checked one, as far as is known now (`on_change` says when that changes): their
        before_forward only writes `latest`. See [Note: plain steps] (_watch/base.py)."""
        if self._closed:
            return NEVER
        if self._waiting is not None or self._pending is not None:
            return step
        due = -(-(step - 1) // self.period) * self.period  # the first checked step >= step-1
        end = due if due >= step else step
        start, stop = self.precise
        if stop >= step:  # an every-step window not over yet
            end = min(end, start) if start >= step else step
        return end

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def after_backward(self, step: int, synced: bool) -> None:
        """The backward of `step` finished, its reduction included: digest the gradients."""
        if self._closed or not self.due(step):
            return
        grads = [p.grad for p in self.params]  # (their sizes are never shown: no stats)
        self._pending = _Capture(step, synced, _take(grads, stats=False))

    def unsynced(self, step: int) -> None:
        """Forward `step` runs under no_sync(): its backward will not all-reduce (ddpviz's
        DDP, whose reducer reports only backwards that reduced)."""
        if not self._closed and self.due(step):
            self._pending = _Capture(step, False, None)

    def before_forward(self, step: int, broadcasts: Callable[[], bool]) -> None:
        """Forward `step` starts (the previous step's optimizer step is done): digest the
        parameters; the buffers now, or after the broadcast (if `broadcasts()`, asked on a
        checked step only: the call is torch's, and every forward comes here)."""
        self.latest = step
        self._flush_waiting()
        previous = step - 1
        if self._closed or previous < 0 or not self.due(previous):
            self._pending = None
        else:
            self._take_previous(previous, broadcasts)
        if not self._closed and self.synced is not None and self.due(step):
            # whether this checked step's backward will all-reduce, known now: its gradients
            # are digested only where the step is armed (grads_due), this tells no_sync apart
            self._pending = _Capture(step, bool(self.synced()), None)

    def _take_previous(self, previous: int, broadcasts: Callable[[], bool]) -> None:
        cap = self._pending if self._pending is not None and self._pending.step == previous \
            else _Capture(previous, True, None)
        self._pending = None
        cap.params = _take(self.params, stats=True)
        self._last_taken = previous
        self._waiting = cap
        if not broadcasts():
            # buffers agree only right after DDP's broadcast: without one in this forward
            # (broadcast_buffers=True, but require_forward_param_sync off: Lightning's manual
            # optimization, the forward after a no_sync() step) they are not compared;
            # with broadcast_buffers=False they are (each rank's own: an info finding)
            self.after_buffer_sync(buffers=not self._broadcast_buffers())

    def after_buffer_sync(self, buffers: bool = True) -> None:
        """The forward's buffer broadcast is done (or there is none): digest the buffers
        (`buffers` False: not compared at this step)."""
        cap, self._waiting = self._waiting, None
        if cap is None:
            return
        named = self._buffers() if buffers else []
        cap.buffer_names = [n for n, _ in named]
        cap.buffers = _take([b for _, b in named], stats=True) if named else None
        self._submit(cap)

    def _flush_waiting(self) -> None:
        if self._waiting is not None:  # no broadcast came (e.g. a forward without one)
            self.after_buffer_sync(buffers=not self._broadcast_buffers())

    def _submit(self, cap: _Capture) -> None:
        if any(x is not None and not isinstance(x, Snapshot)
               for x in (cap.grads, cap.params, cap.buffers)):
            cap.event = torch.cuda.Event()  # (digests launched on a GPU: wait for them there)
            cap.event.record()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ddpviz-replicas",
                                            daemon=True)
            self._thread.start()
            # the last checks of a job that ends now are still judged (before atexit handlers
            # registered earlier, such as the trace's flush, run)
            atexit.register(self._at_exit)
        self._submitted += 1
        self._queue.append(cap)

    def close(self) -> None:
        """The final comparison (`finish`), then the check stops."""
        self.finish()

    def _at_exit(self) -> None:
        ENDING.set()  # (the quiet guard names no wait while the job ends: quiet.py)
        # A rank leaving on an uncaught exception waits for no judgement: its peers learn of
        # the crash when it exits, so every second here is a second later for them. It still
        # posts its final digests; only its thread's way out is waited for. See [Note: the
        # job's end and checkpoints].
        self.finish(0.0 if left_on_an_exception() else FINAL_S)

    def checkpoint(self) -> None:
        """A state_dict of the DDP's module was taken (a checkpoint, usually): compare the
        replicas as they are now. This rank digests its parameters now, as of after step
        `latest`'s optimizer step (unless that step is checked anyway), and asks every rank to
        check one of the next steps (through the store: ranks that do not save, e.g. all but
        rank 0, need not call anything). See [Note: the job's end and checkpoints]."""
        if self._closed or self.latest < 0:
            return
        step = self.latest
        self._checkpoints.append(step)
        del self._checkpoints[:-HISTORY]
        self._want_window = True  # (the check's thread posts the window)
        if not self.due(step) and self._last_taken != step and self._waiting is None:
            self._capture_now(step)

    def _capture_now(self, step: int) -> None:
        """Post this rank's parameters as of now as step `step`'s (after its optimizer step);
        its gradients if the step is checked (taken at its backward); no buffers (they agree
        only right after a broadcast)."""
        cap = self._pending if self._pending is not None and self._pending.step == step \
            else _Capture(step, True, None)
        self._pending = None
        cap.params = _take(self.params, stats=True)
        self._last_taken = step
        self._submit(cap)

    def finish(self, timeout: float = FINAL_S) -> None:
        """The job ends (destroy_process_group, interpreter exit, close()): the final
        comparison of the latest state every rank posts, waiting at most about `timeout`
        seconds for the other ranks (which may be gone already); then the check stops. Never
        raises."""
        if self._closed:
            return
        self._closed = True  # (no more captures; the thread finishes what is queued)
        _ACTIVE.discard(self)
        atexit.unregister(self._at_exit)
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if not _ACTIVE:
            _unwrap_destroy()
        end = time.monotonic() + timeout
        with contextlib.suppress(Exception):
            self._flush_waiting()
            step = self.latest
            if step >= 0 and self._last_taken != step:
                self._final = step
                self._capture_now(step)
            self._deadline = end  # (read by rank 0's thread: nothing waits past it)
            if self.rank == 0:
                while self._judged < self._submitted and self.error is None and \
                        time.monotonic() < end and self._alive():
                    time.sleep(POLL_S / 5)
                self._exit_note = True  # the thread tells the others (its store connection)
                while getattr(self, "_exit_note", False) and self.error is None and \
                        time.monotonic() < end + POLL_S * 4 and self._alive():
                    time.sleep(POLL_S / 5)
            else:  # answer rank 0's questions until it is done
                while not self._judged_all and self.error is None and \
                        time.monotonic() < end and self._alive():
                    time.sleep(POLL_S / 5)
        self._stopping = True
        # The thread must be out of torch and the store before the interpreter finalizes: a
        # daemon thread that returns from C++ then is ended by pthread_exit, whose unwinding
        # through C++ frames aborts the process (SIGABRT, "terminate called without an active
        # exception"), changing the job's exit code.
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, end - time.monotonic()) + 2 * IDLE_S)

    def _alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    # --- the check's thread -------------------------------------------------------------------

    def _run(self) -> None:
        self._history: dict[int, _Detail] = {}
        self._asked: dict[int, float] = {}  # rank 0: steps whose details it asked for, since
        self._last_compared = -1  # the last step whose digests rank 0 compared
        self._known: set[str] = set()  # tensors already reported
        self._posted_details: set[int] = set()
        self._started: dict[int, float] = {}
        try:
            while True:
                time.sleep(POLL_S if self._busy() or self._queue or self._closed else IDLE_S)
                self._idle = not self._queue
                while self._queue:
                    self._post(self._queue.popleft())
                if self._stopping and not self._queue:
                    return
                if self._want_window:
                    self._want_window = False
                    self._open_window(self.latest + PRECISE_LEAD, self.period)
                self._serve()
                if self.rank == 0:
                    self._judge_ready()
                    if getattr(self, "_exit_note", False) and not self._judging:
                        self._board.scope.store.set(f"{self._base}/judged", "1")
                        self._exit_note = False
        except Exception as exc:  # the store is gone, or a bug: the check stops, the job not
            self.error = exc

    def _busy(self) -> bool:
        return bool(self._judging)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every step submitted so far is posted and (rank 0) judged; False when
        `timeout` passed first or the check stopped. Other ranks must keep their check running
        meanwhile (they answer rank 0's questions): close() them after rank 0 drained."""
        self._flush_waiting()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            thread = self._thread
            if thread is None:
                return True
            if self.error is not None or not thread.is_alive():
                return False
            if not self._queue and not self._judging and self._idle:
                return True
            time.sleep(POLL_S)
        return False

    def _post(self, cap: _Capture) -> None:
        if cap.event is not None:
            cap.event.synchronize()
        grads = _digests(cap.grads, stats=False)
        params = _digests(cap.params, stats=True)
        buffers = _digests(cap.buffers, stats=True)
        g = None if grads is None else grads[0].numpy()
        p = params[0].numpy() if params is not None else np.zeros((0, 2), np.int64)
        b = buffers[0].numpy() if buffers is not None else np.zeros((0, 2), np.int64)

        def stats(pair: Digests | None) -> bytes:
            return b"" if pair is None or pair[1] is None else pair[1].numpy().tobytes()

        self._history[cap.step] = _Detail(
            params=p.tobytes(), param_stats=stats(params),
            grads=b"" if g is None else g.tobytes(), grad_stats=stats(grads),
            buffers=b.tobytes(), buffer_stats=stats(buffers),
            buffer_names=cap.buffer_names, synced=cap.synced)
        for old in sorted(self._history)[:-HISTORY]:
            del self._history[old]
        names = hashlib.blake2b("\0".join(cap.buffer_names).encode(), digest_size=8).hexdigest()
        summary = _Summary(_hash(p), _hash(g) + ("" if cap.synced else "/nosync"),
                           _hash(b) + names)
        store = self._board.scope.store
        store.set(f"{self._base}/s/{cap.step}/{self.rank}", msgspec.json.encode(summary).decode())
        store.set(f"{self._base}/last/{self.rank}", str(cap.step))
        if self.rank == 0:
            self._judging.append(cap.step)
            self._started[cap.step] = time.monotonic()

    def _serve(self) -> None:
        """Post the details rank 0 asked for; follow the every-step window it set."""
        store = self._board.scope.store
        key = f"{self._base}/want"
        if store.check([key]):
            for text in as_text(store.get(key)).split(","):
                with contextlib.suppress(ValueError):
                    step = int(text)
                    detail = self._history.get(step)
                    if detail is not None and step not in self._posted_details:
                        self._posted_details.add(step)
                        store.set(f"{self._base}/d/{step}/{self.rank}",  # (bytes: fine)
                                  msgspec.msgpack.encode(detail))  # type: ignore[arg-type]
        if self.rank != 0 and store.check([f"{self._base}/judged"]):
            self._judged_all = True
        key = f"{self._base}/precise"
        if store.check([key]):
            with contextlib.suppress(ValueError):
                start, end = (int(x) for x in as_text(store.get(key)).split(",")[:2])
                if (start, end) != self.precise:
                    self.precise = (start, end)
                    self._changed()

    def _last(self, rank: int) -> int:
        store = self._board.scope.store
        key = f"{self._base}/last/{rank}"
        if not store.check([key]):
            return -1
        with contextlib.suppress(ValueError):
            return int(as_text(store.get(key)))
        return -1

    def _judge_ready(self) -> None:
        """Rank 0: compare the oldest step every rank posted (or moved past)."""
        store = self._board.scope.store
        while self._judging:
            step = self._judging[0]
            keys = [f"{self._base}/s/{step}/{r}" for r in range(self.world_size)]
            # each rank's latest step before its summary: a rank posts the summary, then the
            # step, so a rank past `step` without a summary of it skipped it (not: is late)
            lasts = {r: self._last(r) for r in range(self.world_size)
                     if not store.check([keys[r]])}
            have = [r for r, k in enumerate(keys) if r not in lasts or store.check([k])]
            missing = [r for r in range(self.world_size) if r not in have]
            timed_out = self._late(self._started.get(step, 0))
            if missing and not timed_out and any(lasts[r] < step for r in missing):
                return  # a rank has not got there yet
            if step in self._asked:
                if not self._conclude(step, have, timed_out):
                    return
            else:
                summaries = {r: as_text(store.get(keys[r])) for r in have}
                if len(set(summaries.values())) <= 1:
                    if not missing:
                        self._agreed(step)
                else:
                    self._asked[step] = time.monotonic()
                    store.set(f"{self._base}/want", str(step))
                    self._serve()  # rank 0's own details
                    return
            for k in (keys[r] for r in have):
                with contextlib.suppress(RuntimeError):
                    store.delete_key(k)
            self._judging.pop(0)
            self._judged += 1

    def _agreed(self, step: int) -> None:
        self._last_compared = max(self._last_compared, step)
        self.compared += 1

    def _conclude(self, step: int, have: list[int], timed_out: bool) -> bool:
        """Rank 0 has asked for `step`'s details: once every rank posted them, judge."""
        store = self._board.scope.store
        keys = {r: f"{self._base}/d/{step}/{r}" for r in have}
        ready = {r: k for r, k in keys.items() if store.check([k])}
        if len(ready) < len(keys) and not timed_out and not self._late(self._asked[step]):
            return False
        states: dict[int, RankState] = {}
        for r, k in ready.items():
            state = _state(store.get(k), len(self.names))
            if state is not None:
                states[r] = state
            with contextlib.suppress(RuntimeError):
                store.delete_key(k)
        del self._asked[step]
        if len(states) < 2:
            return True
        if len({tuple(x.buffer_names) for x in states.values()}) > 1 and \
                any(not x.buffer_names for x in states.values()):
            for x in states.values():  # some ranks took no buffers here (not after a broadcast)
                x.buffers, x.buffer_stats, x.buffer_names = [], [], []
        before = self._last_compared
        finding = judge(step, states, param_names=self.names,
                        broadcast_buffers=self._broadcast_buffers(),
                        last_agreed=before, precise=False,
                        world_size=self.world_size, exclude=frozenset(self._known))
        self._agreed(step)
        if finding is None or len(self.findings) >= MAX_FINDINGS:
            return True
        self._known |= differing_names(states, self.names)
        if finding.severity != "info" and self.period > 1 and self.precise[1] <= step and \
                step != self._final:
            self._open_window(self.latest + PRECISE_LEAD, self.period)  # narrow
        saved = [c for c in self._checkpoints if before < c <= step]
        if saved:
            finding = msgspec.structs.replace(finding, detail=(*finding.detail, (
                f"a checkpoint (state_dict) was taken after step {saved[-1]}, "
                + ("when these replicas already differed" if saved[-1] == step else
                   f"at or after the last step that agreed ({before}): "
                   "it may hold one rank's diverged replica") + "; "
                "compare it with the other ranks' state before resuming from it")))
        if step == self._final:  # (the job ends: no every-step window follows)
            finding = msgspec.structs.replace(finding, detail=(*(
                line for line in finding.detail
                if not line.startswith("checked every step from now on")), (
                f"found by the final comparison when the job ended (after step {step}); "
                f"the checks before it last agreed after step {before}")))
        self._report(finding)
        return True

    def _open_window(self, start: int, length: int) -> None:
        """Every rank checks every step in [start, start + length) (through the store)."""
        if self.precise[1] > start:
            return  # a window already covers it
        self.precise = (start, start + length)
        self._changed()
        self._board.scope.store.set(f"{self._base}/precise", f"{start},{start + length}")

    def _late(self, since: float) -> bool:
        now = time.monotonic()
        return now - since > GIVE_UP_S or (self._deadline is not None and now > self._deadline)

    def _report(self, finding: Finding) -> None:
        first = not self.findings
        self.findings.append(finding)
        if self.tap.enabled:
            self.tap.emit_as(finding.step, time.monotonic_ns(), FindingReported, finding)
        if first:
            with contextlib.suppress(Exception):  # an error filter must not stop the check
                warnings.warn(warning_of(finding), stacklevel=1)


def _state(raw: bytes, n_params: int) -> RankState | None:
    """A rank's posted details, checked against the sizes they must have (None: malformed)."""
    try:
        d = msgspec.msgpack.decode(raw, type=_Detail)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    n_buffers = len(d.buffer_names)
    if n_params > MAX_PARAMS or n_buffers > MAX_PARAMS:
        return None

    def pairs(data: bytes, n: int) -> list[tuple[int, int]] | None:
        if len(data) != n * 16:
            return None
        return [(int(a), int(b)) for a, b in np.frombuffer(data, np.int64).reshape(n, 2)]

    def sizes(data: bytes, n: int) -> list[tuple[float, float]]:
        if len(data) != n * 16:
            return [(float("nan"), float("nan"))] * n
        return [(float(a), float(b)) for a, b in np.frombuffer(data, np.float64).reshape(n, 2)]

    params = pairs(d.params, n_params)
    buffers = pairs(d.buffers, n_buffers)
    grads = pairs(d.grads, n_params) if d.grads else None
    if params is None or buffers is None:
        return None
    return RankState(params=params, param_stats=sizes(d.param_stats, n_params),
                     grads=grads, grad_stats=sizes(d.grad_stats, n_params) if grads else None,
                     buffers=buffers, buffer_stats=sizes(d.buffer_stats, n_buffers),
                     buffer_names=list(d.buffer_names), synced=d.synced)


# [Note: the job's end and checkpoints]
# A job shorter than the period, or one that diverged after its last checked step, would end
# unchecked. So each check compares once more when the job ends: at destroy_process_group (of
# its group, or all), which ddpviz wraps while a check is active; at interpreter exit
# (atexit); and at close(). Each rank digests its parameters as they are then (after the last
# optimizer step: the step of its latest forward), posts them like a checked step, and rank
# 0's thread compares; the waits are bounded by FINAL_S (a peer may be gone already, its store
# connection with it), and nothing is raised into the job. A rank waits only while a judgement
# is pending: rank 0 while a posted step is not judged yet, the others until rank 0 says it
# judged everything; a rank whose script ended on an uncaught exception waits for none (its
# peers fail when it exits), only for its thread to leave torch and the store (IDLE_S or so).
# A checkpoint is a state_dict of the DDP's module (torch.save(ddp.state_dict()), Lightning's,
# torch.distributed.checkpoint's get_state_dict): a post-hook that never changes what
# state_dict returns digests this rank's parameters as of then, and asks every rank, through
# the store, to check one step soon (PRECISE_LEAD steps after the latest forward): ranks that
# do not save (`if rank == 0: torch.save(...)`) need not call anything. Where every rank
# saves at the same step, that step itself is compared; else the finding of the next checked
# step says that a checkpoint was taken between the last agreeing step and it.

def left_on_an_exception() -> bool:
    """Whether the script ended on an uncaught exception (in an exit handler: Python has then
    set sys.last_value for the traceback it printed)."""
    return getattr(sys, "last_value", None) is not None


_ACTIVE: weakref.WeakSet[ReplicaCheck] = weakref.WeakSet()  # checks not yet finished
_ORIGINAL: dict[str, Callable[..., Any]] = {}  # torch's destroy_process_group, while wrapped


def _destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
    """torch.distributed.destroy_process_group, after the final replica comparison of the
    checks on `group` (None: every group). See [Note: the job's end and checkpoints]."""
    original = _ORIGINAL.get("destroy") or torch.distributed.distributed_c10d.destroy_process_group
    if group is None or group is _world():
        ENDING.set()  # (the job ends: the quiet guard names no wait now, quiet.py)
    for check in list(_ACTIVE):
        if group is None or group is check.group or (
                check.group is None and group is _world()):
            with contextlib.suppress(Exception):
                check.finish()
    return original(group, *args, **kwargs)


def _world() -> Any:
    with contextlib.suppress(Exception):
        return torch.distributed.group.WORLD
    return None


def _wrap_destroy() -> None:
    import torch.distributed.distributed_c10d as c10d

    if "destroy" in _ORIGINAL:
        return
    _ORIGINAL["destroy"] = c10d.destroy_process_group
    for where in (torch.distributed, c10d):
        if getattr(where, "destroy_process_group", None) is _ORIGINAL["destroy"]:
            setattr(where, "destroy_process_group", _destroy_process_group)  # noqa: B010


def _unwrap_destroy() -> None:
    import torch.distributed.distributed_c10d as c10d

    original = _ORIGINAL.pop("destroy", None)
    if original is None:
        return
    for where in (torch.distributed, c10d):
        if getattr(where, "destroy_process_group", None) is _destroy_process_group:
            setattr(where, "destroy_process_group", original)  # noqa: B010


def _inert(*_: Any) -> None:
    """What a pickled or deep-copied module gets in place of `_OnStateDict`: nothing."""


def _as_inert() -> Any:
    return _inert


class _OnStateDict:
    """The state_dict post-hook of a checked DDP's module: a checkpoint compares replicas (See
    ReplicaCheck.checkpoint). Returns None, so state_dict's result is unchanged. The job may
    pickle or deep-copy its module (torch.save(ddp), copy.deepcopy(model)): the copy holds an
    inert function instead, never the check."""

    def __init__(self, check: ReplicaCheck) -> None:  # (no __slots__: torch sets an attribute)
        self._ref = weakref.ref(check)

    def __call__(self, *_: Any) -> None:
        found = self._ref()
        if found is not None:
            with contextlib.suppress(Exception):
                found.checkpoint()

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _as_inert, ()


def replica_check(period: int | None, board: Board | None, params: Sequence[torch.Tensor],
                  names: Sequence[str], module: torch.nn.Module, ignored: set[str],
                  broadcast_buffers: Callable[[], bool], tap: Tap) -> ReplicaCheck | None:
    """The DDP's replica check, or None: off (`period` None), a single rank, or no notice
    board (the watchdog is off: hang_timeout=0), where there is nowhere to compare."""
    if period is None or board is None or board.world_size < 2:
        return None

    def buffers() -> list[tuple[str, torch.Tensor]]:
        return [(n, b) for n, b in module.named_buffers() if n not in ignored]

    check = ReplicaCheck(period, params, names, buffers, broadcast_buffers, board, tap)
    check._hooks.append(module.register_state_dict_post_hook(_OnStateDict(check)))
    _ACTIVE.add(check)
    _wrap_destroy()
    return check
