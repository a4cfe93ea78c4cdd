"""The live replica check: do all ranks still hold the same bytes after each optimizer step?

[Note: replica digests]
DDP's contract: after each optimizer step every rank holds bitwise the same parameters, and
(broadcast_buffers=True) the same buffers right after the next forward's buffer broadcast.
Nothing in torch checks it after the constructor. On a checked step s (every `period`-th step,
`Recording(replicas=N)`):
  - at the end of backward s (after the reduction), each rank digests its gradients;
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
Narrowing: a divergence first seen at a sampled step lies somewhere after the last step that
agreed. From then on, every step is checked for `period` steps (the ranks agree on when that
window starts through the store): parameters that start to differ there, and the gradients of
each step, are then named at their exact step.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import torch

from ddpviz.events import FindingReported, Tap
from ddpviz.findings import DiagnosisWarning, Finding
from ddpviz.limits import MAX_PARAMS
from ddpviz.probes.digest import Snapshot
from ddpviz.probes.rendezvous import Board, Scope, as_text
from ddpviz.probes.replica_verdict import RankState, differing_names, judge
from ddpviz.recording import NEVER

HISTORY = 64  # checked steps each rank keeps (digests and sizes) for rank 0 to ask about
POLL_S = 0.05  # the thread looks at the store this often while it has work
IDLE_S = 0.25  # ... and this often when it has none
GIVE_UP_S = 120.0  # rank 0 stops waiting for a step's summaries or details after this
PRECISE_LEAD = 4  # the every-step window starts this many steps after rank 0 saw a divergence
MAX_FINDINGS = 8  # replicas_diverged findings per DDP (the first is also printed)
EXIT_S = 5.0  # at interpreter exit, how long the ranks wait for rank 0 to judge what is left


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
        # called (the check's thread) when `precise` changed: a plain-steps window is void
        self.on_change: Callable[[], None] | None = None

    # --- the training thread ------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether `step` is checked."""
        return step % self.period == 0 or self.precise[0] <= step < self.precise[1]

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
            return
        cap = self._pending if self._pending is not None and self._pending.step == previous \
            else _Capture(previous, True, None)
        self._pending = None
        cap.params = _take(self.params, stats=True)
        self._waiting = cap
        if not broadcasts():
            self.after_buffer_sync()

    def after_buffer_sync(self) -> None:
        """The forward's buffer broadcast is done (or there is none): digest the buffers."""
        cap, self._waiting = self._waiting, None
        if cap is None:
            return
        named = self._buffers()
        cap.buffer_names = [n for n, _ in named]
        cap.buffers = _take([b for _, b in named], stats=True) if named else None
        self._submit(cap)

    def _flush_waiting(self) -> None:
        if self._waiting is not None:  # no broadcast came (e.g. a forward without one)
            self.after_buffer_sync()

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
        self._queue.append(cap)

    def close(self) -> None:
        self._closed = True
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(Exception):
            if self.drain(EXIT_S) and self.rank == 0:
                self._exit_note = True  # the thread tells the others (its store connection)
                end = time.monotonic() + EXIT_S
                while getattr(self, "_exit_note", False) and time.monotonic() < end:
                    time.sleep(POLL_S)
            elif self.rank != 0:  # answer rank 0's questions until it is done
                end = time.monotonic() + EXIT_S
                while not self._judged_all and time.monotonic() < end and self.error is None:
                    time.sleep(POLL_S)
        self.close()
        # The thread must be out of torch and the store before the interpreter finalizes: a
        # daemon thread that returns from C++ then is ended by pthread_exit, whose unwinding
        # through C++ frames aborts the process (SIGABRT, "terminate called without an active
        # exception"), changing the job's exit code.
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(EXIT_S)

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
                time.sleep(POLL_S if self._busy() or self._queue else IDLE_S)
                self._idle = not self._queue
                while self._queue:
                    self._post(self._queue.popleft())
                if self._closed and not self._busy() and not self._queue:
                    return
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
            timed_out = time.monotonic() - self._started.get(step, 0) > GIVE_UP_S
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

    def _agreed(self, step: int) -> None:
        self._last_compared = max(self._last_compared, step)
        self.compared += 1

    def _conclude(self, step: int, have: list[int], timed_out: bool) -> bool:
        """Rank 0 has asked for `step`'s details: once every rank posted them, judge."""
        store = self._board.scope.store
        keys = {r: f"{self._base}/d/{step}/{r}" for r in have}
        ready = {r: k for r, k in keys.items() if store.check([k])}
        if len(ready) < len(keys) and not timed_out and \
                time.monotonic() - self._asked[step] < GIVE_UP_S:
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
        finding = judge(step, states, param_names=self.names,
                        broadcast_buffers=self._broadcast_buffers(),
                        last_agreed=self._last_compared, precise=False,
                        world_size=self.world_size, exclude=frozenset(self._known))
        self._agreed(step)
        if finding is None or len(self.findings) >= MAX_FINDINGS:
            return True
        self._known |= differing_names(states, self.names)
        if finding.severity != "info" and self.period > 1 and self.precise[1] <= step:
            start = self.latest + PRECISE_LEAD  # narrow: every step for one period
            self.precise = (start, start + self.period)
            self._changed()
            store.set(f"{self._base}/precise", f"{start},{start + self.period}")
        self._report(finding)
        return True

    def _report(self, finding: Finding) -> None:
        first = not self.findings
        self.findings.append(finding)
        if self.tap.enabled:
            self.tap.emit_as(finding.step, time.monotonic_ns(), FindingReported, finding)
        if first:
            with contextlib.suppress(Exception):  # an error filter must not stop the check
                warnings.warn(finding.text(), DiagnosisWarning, stacklevel=1)


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


def replica_check(period: int | None, board: Board | None, params: Sequence[torch.Tensor],
                  names: Sequence[str], module: torch.nn.Module, ignored: set[str],
                  broadcast_buffers: Callable[[], bool], tap: Tap) -> ReplicaCheck | None:
    """The DDP's replica check, or None: off (`period` None), a single rank, or no notice
    board (the watchdog is off: hang_timeout=0), where there is nowhere to compare."""
    if period is None or board is None or board.world_size < 2:
        return None

    def buffers() -> list[tuple[str, torch.Tensor]]:
        return [(n, b) for n, b in module.named_buffers() if n not in ignored]

    return ReplicaCheck(period, params, names, buffers, broadcast_buffers, board, tap)
