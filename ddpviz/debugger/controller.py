"""The rank side of the debugger: the `Controller` of this process takes the notebook's commands
(from the Sender's control messages), and at the safe points of the DDP it is attached to
(`Attachment`: ddpviz's DDP through engine/observers.py, torch's DDP through watch()) it agrees
with the other ranks where to stop, parks the training thread there and executes commands.

Unarmed it costs one attribute test at each safe point: `install()` runs only on ranks launched
with DDPVIZ_DEBUG=1, and until the first command arrives nothing else happens. Any failure
inside it steps aside, said once, and the job runs on (a rank is never left parked by it).
See [Note: claiming a boundary] in agreement.py for the agreement across ranks.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ddpviz import events as ev
from ddpviz.debugger import Aborted, protocol, run_code
from ddpviz.debugger.agreement import Board, Claim
from ddpviz.debugger.predicates import Predicates, loop_names
from ddpviz.debugger.tensor_summary import fetch_range, parts, summarize
from ddpviz.envvars import ENV_DEBUG
from ddpviz.probes import step_aside
from ddpviz.probes.nonfinite import nonfinite

ABORT_AFTER_S = 4.0  # a rank that is not parked is ended this long after an Abort arrived
_POLL_S = 0.005  # a parked rank's wait for its next command
_COMMAND_WAIT_S = 30.0  # an agreed break-set change waits this long for its command
MAX_SNAPSHOT = 1 << 24  # elements of local gradients a nonfinite_gradient break keeps
_NEEDS_HOOK = ("bucket", "after_backward")  # points only a DDP with bucket points has
_HOOKLESS_BUCKETS = ("break_at(bucket=...) needs safe points around each bucket's all-reduce, "
                     "which the default hook-less ddpviz.watch(ddp) does not have: use "
                     "ddpviz.watch(ddp, guard=True) (or ddpviz's own DDP), or break at "
                     "where='forward' / 'optimizer_step'")


class Attachment:
    """The safe points of one DDP on this rank, as its DDP (or watch()) calls them."""

    def __init__(self, controller: Controller, ddp: nn.Module, params: Sequence[nn.Parameter],
                 names: Sequence[str], tap: ev.Tap, *, kind: str, bucket_points: bool) -> None:
        self.c = controller
        self.ddp, self.params, self.names, self.tap = ddp, list(params), list(names), tap
        self.index = {n: i for i, n in enumerate(self.names)}
        self.kind, self.bucket_points = kind, bucket_points
        self.buffers: dict[int, torch.Tensor] = {}  # bucket -> its flat buffer, this step
        self.members: dict[int, list[int]] = {}  # bucket -> its parameters (indices)
        self.output: Any = None

    # Each safe point: one test when unarmed (the controller's `active`).
    def forward(self, step: int) -> None:
        if self.c.active:
            self.c.guarded(self.c.at_forward, self, step)

    def after_forward(self, step: int, output: Any) -> None:
        if self.c.active:
            self.output = output
            self.c.guarded(self.c.after_forward, self, step)

    def bucket(self, step: int, bucket: int, buffer: torch.Tensor,
               indices: Callable[[], Sequence[int]]) -> None:
        if self.c.active:
            self.c.guarded(self.c.at_bucket, self, step, bucket, buffer, indices)

    def after_backward(self, step: int) -> None:
        if self.c.active:
            self.c.guarded(self.c.at_after_backward, self, step)

    def optimizer_step(self, step: int) -> None:
        if self.c.active:
            self.c.guarded(self.c.at_optimizer_step, self, step)


class _FindingSpy:
    """The DDP's emitter, passing every event on, and telling the controller which findings
    this rank says (a break on a finding kind, a step to the next finding)."""

    def __init__(self, emitter: ev.Emitter, controller: Controller) -> None:
        self._emitter, self._controller = emitter, controller

    def __call__(self, event: ev.Event, /) -> None:
        self._emitter(event)
        if type(event) is ev.FindingReported:
            self._controller.finding_said(event.finding.kind, event.step)

    def flush(self, timeout: float = 1.0) -> None:
        flush = getattr(self._emitter, "flush", None)
        if callable(flush):
            flush(timeout)


def _spy_on(tap: ev.Tap, controller: Controller) -> None:
    emitter = tap._emitter
    if emitter is not None and not isinstance(emitter, _FindingSpy):
        tap._emitter = _FindingSpy(emitter, controller)


class Controller:
    """This process's debugger (one per rank; `install` makes it)."""

    def __init__(self, emitter: ev.Emitter, rank: int) -> None:
        self.rank = rank
        self._own_tap = ev.Tap(emitter, rank)
        self.att: Attachment | None = None
        self.active = False  # armed, or something to do at the next safe point
        self.dead = False
        self.armed = False
        self.parked = False
        self.start_paused = False  # park before the first forward (launch(debug="paused"))
        self._queue: collections.deque[protocol.Command | tuple[int, str]] = \
            collections.deque()
        self._last_request = 0
        self._abort = threading.Event()
        self._board: Board | None = None
        self._handled = ""  # the claim last acted on (its raw value)
        self._deferred: list[tuple[str, str, str]] = []  # claims to make: (id, kind, reason)
        self._breaks: dict[int, protocol.SetBreaks] = {}  # SetBreaks by request, not applied
        self._applied = 0  # the last SetBreaks applied (each holds the whole break set)
        self._at: set[tuple[int, str, int]] = set()  # (step, point, bucket) of break_at
        self._kinds: set[str] = set()
        self._answered: dict[str, int] = {}  # finding kind -> the step a stop for one parked at
        self._predicates = Predicates()
        self._step_to: str | None = None  # after a Step: where to park next
        self._where: tuple[str, int] = ("", -1)  # the park's point and bucket
        self._snapshot: dict[str, tuple[int, torch.Tensor]] = {}  # grad_before_allreduce
        self._namespace: dict[str, Any] = {}
        self._optimizer: Any = None
        self.step = -1

    @property
    def tap(self) -> ev.Tap:
        return self.att.tap if self.att is not None else self._own_tap

    def _emit(self, cls: type[ev.E], *fields: object) -> None:
        """An event stamped with the step this rank is at (watch() sets its tap's step only
        after the forward's safe point)."""
        self.tap.emit_as(self.step, time.monotonic_ns(), cls, *fields)

    # --- the shipping thread: commands in (queue only, never block) --------------------------

    def receive(self, commands: tuple[protocol.Command, ...]) -> None:
        """Sender.on_control's callback: refuse replays, queue the rest (an Abort also starts
        the end of this process)."""
        for c in commands:
            if c.request <= self._last_request:
                self._queue.append((c.request, f"replay: request {c.request} is not above "
                                    f"{self._last_request}, the last one this rank accepted"))
                continue
            self._last_request = c.request
            if isinstance(c, protocol.Abort):
                self._start_abort()
            self._queue.append(c)
        if not self.dead:
            self.active = True

    def finding_said(self, kind: str, step: int) -> None:
        """A finding this rank said (any thread): a triggered break claims the next forward
        from this rank's next safe point (the training thread)."""
        if step < self._answered.get(kind, -1):
            return  # said late about a step before the stop it caused: that stop answered it
        if self.armed and (kind in self._kinds or self._step_to == "finding"):
            self._deferred.append((f"t{self.rank}.{step}.{kind}", "trigger",
                                   f"finding {kind} (rank {self.rank}, step {step})"))
            self.active = True

    def _start_abort(self) -> None:
        if self._abort.is_set():
            return
        self._abort.set()

        def end() -> None:  # not parked in time (in a collective, or not training): end it
            time.sleep(ABORT_AFTER_S)
            self.tap.flush(0.5)
            os._exit(1)

        threading.Thread(target=end, name="ddpviz-debug-abort", daemon=True).start()

    # --- the training thread: safe points -----------------------------------------------------

    def guarded(self, fn: Callable[..., None], *args: Any) -> None:
        if self.dead:
            return
        try:
            fn(*args)
        except Aborted:
            raise
        except Exception as exc:
            self.dead, self.active = True, False
            step_aside.say(self.rank, "the debugger", exc, "no pausing from the notebook")

    def _attach_state(self, att: Attachment, step: int) -> None:
        if self.att is not att:
            self.att = att
        if step != self.step:
            self.step = step
            att.buffers.clear()

    def at_forward(self, att: Attachment, step: int) -> None:
        self._attach_state(att, step)
        if self._abort.is_set():
            self._raise_abort()
        if not self.armed:
            self._arm()
        assert self._board is not None
        raw, claim = self._board.read(step)
        if claim is not None and claim.step == step and raw != self._handled:
            self._handled = raw
            if self._act(claim, "forward", -1):
                return
        if self._queue or self._deferred:  # (a second read only when there is something)
            raw, claim = self._board.read(step + 1)
            self._serve_unparked(pending=claim is not None)
            if self._deferred and claim is None:
                self._claim(raw, step)
        if self.start_paused:  # every rank parks here: breaks can be set before anything runs
            self.start_paused = False
            self._park("forward", -1, "start paused", 0)
        elif (step, "forward", -1) in self._at:
            self._park("forward", -1, "break_at", 0)
        elif self._step_to == "step":
            self._park("forward", -1, "step", 0)

    def after_forward(self, att: Attachment, step: int) -> None:
        self._check_predicates(att, step)

    def _check_predicates(self, att: Attachment, step: int, *, claim_now: bool = True) -> None:
        """break_when: each predicate in the loop's names and ddpviz's (predicates.py)."""
        if not self._predicates or not self.armed:
            return
        hit, dropped = self._predicates.check(self._names(att, step))
        for reason in dropped:
            self._emit(ev.DebugRefused, 0, reason)
        if hit is not None:
            self._trigger(step, f"predicate: {hit}", claim_now=claim_now)

    def at_bucket(self, att: Attachment, step: int, bucket: int, buffer: torch.Tensor,
                  indices: Callable[[], Sequence[int]]) -> None:
        self._attach_state(att, step)
        if not self.armed:
            return
        att.buffers[bucket] = buffer
        att.members[bucket] = list(indices())
        if ("nonfinite_gradient" in self._kinds or self._step_to == "finding") \
                and buffer.is_floating_point() and bool(nonfinite(buffer)):
            self._keep_snapshot(att, step, att.members[bucket])
            self._trigger(step, f"finding nonfinite_gradient (rank {self.rank}, bucket "
                          f"{bucket})")
        if (step, "bucket", bucket) in self._at:
            self._park("bucket", bucket, "break_at", 0)
        elif self._step_to == "bucket":
            self._park("bucket", bucket, "step", 0)

    def at_after_backward(self, att: Attachment, step: int) -> None:
        """Every all-reduce of `step` is complete here (the reducer's finalize returned): the
        buffers kept at the bucket points hold their all-reduced values."""
        self._attach_state(att, step)
        if self.armed and (step, "after_backward", -1) in self._at:
            self._park("after_backward", -1, "break_at", 0)

    def at_optimizer_step(self, att: Attachment, step: int) -> None:
        if not self.armed:
            return
        # the loop's `loss` is this step's here; but this step's all-reduces are done, so
        # another rank may be past the next forward: claimed at the next forward (for s + 2)
        self._check_predicates(att, step, claim_now=False)
        if (step, "optimizer_step", -1) in self._at:
            self._park("optimizer_step", -1, "break_at", 0)

    def optimizer_stepped(self, optimizer: Any) -> None:
        """torch's global optimizer-step post-hook: the attached DDP's optimizer stepped."""
        att = self.att
        if att is None or not self.active or self.dead:
            return
        if self._optimizer is not optimizer:
            owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
            if not any(id(p) in owned for p in att.params):
                return
            self._optimizer = optimizer
        self.guarded(self.at_optimizer_step, att, self.step)

    # --- agreement ----------------------------------------------------------------------------

    def _arm(self) -> None:
        self._board = Board()
        self._board.arm()
        self.armed = True

    def _trigger(self, step: int, reason: str, *, claim_now: bool = True) -> None:
        """A triggered break (a finding, a predicate) on this rank's training thread: claim the
        next forward now (safe before this step's all-reduces: See [Note: claiming a
        boundary]), else at the next forward's safe point."""
        self._deferred.append((f"t{self.rank}.{step}", "trigger", reason))
        self.active = True
        if claim_now and self._board is not None:
            raw, claim = self._board.read(step + 1)
            if claim is None:
                self._claim(raw, step)

    def _claim(self, raw: str, step: int) -> None:
        assert self._board is not None
        if self.att is not None and not getattr(self.att.ddp, "require_backward_grad_sync",
                                                True):
            return  # under no_sync() no all-reduce holds the others back: a synced step's
        if self._board.armed() < _world_size():
            return  # a rank not armed yet would not see it: next boundary
        claim_id, kind, reason = self._deferred[0]
        got = self._board.claim(raw, claim_id, step + 1, kind, reason)
        if got is not None and got.id == claim_id:
            self._deferred.pop(0)
        elif got is not None and got.kind in ("pause", "trigger") and kind != "breaks":
            self._deferred.pop(0)  # another rank's pause or trigger stops every rank anyway

    def _act(self, claim: Claim, point: str, bucket: int) -> bool:
        """An agreed claim for this boundary: park, or apply a break-set change. True when the
        rank parked (and was resumed)."""
        self._deferred = [d for d in self._deferred if d[0] != claim.id]
        if claim.kind == "breaks":
            self._apply_agreed(int(claim.id) if claim.id.isdigit() else -1)
            return False
        if claim.reason.startswith("finding "):
            # a finding break stops at the first one: every rank drops it here, at the same
            # agreed boundary (the NaN it found would stop every later step again)
            kind = claim.reason.split()[1]
            self._kinds.discard(kind)
            self._answered[kind] = max(self._answered.get(kind, -1), claim.step)
        self._park(point, bucket, "pause" if claim.kind == "pause" else claim.reason,
                   int(claim.id) if claim.id.isdigit() else 0)
        return True

    def _apply_agreed(self, request: int) -> None:
        if request <= self._applied:
            return  # a park applied it (or a later whole set) already: every rank parked there
        deadline = time.monotonic() + _COMMAND_WAIT_S
        while request not in self._breaks:
            self._serve_unparked(pending=True)
            if self._abort.is_set():
                self._raise_abort()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the break set of request {request} that every rank agreed "
                                   f"on never arrived here in {_COMMAND_WAIT_S:.0f} s")
            time.sleep(_POLL_S)
        self._apply(self._breaks.pop(request))

    def _apply(self, command: protocol.SetBreaks) -> None:
        if command.request < self._applied:
            return  # an older whole break set than the one in force (a park applies in any order)
        self._applied = command.request
        for older in [r for r in self._breaks if r <= command.request]:
            del self._breaks[older]  # (superseded: an agreed claim of one returns at once)
        at: set[tuple[int, str, int]] = set()
        kinds: set[str] = set()
        predicates: list[str] = []
        for b in command.breaks:
            if isinstance(b, protocol.BreakAt):
                if b.where in _NEEDS_HOOK and not (self.att is not None
                                                   and self.att.bucket_points):
                    self._emit(ev.DebugRefused, command.request, _HOOKLESS_BUCKETS.replace(
                        "break_at(bucket=...)", f"break_at(where={b.where!r})"))
                    continue
                at.add((b.step, b.where, b.bucket if b.where == "bucket" else -1))
            elif isinstance(b, protocol.BreakOn):
                kinds.add(b.kind)
            else:
                try:
                    compile(b.predicate, "<predicate>", "eval")
                    predicates.append(b.predicate)
                except SyntaxError as exc:
                    self._emit(ev.DebugRefused, command.request,
                                  f"the predicate {b.predicate!r} is not a Python expression: "
                                  f"{exc.msg}")
        self._at, self._kinds, self._predicates = at, kinds, Predicates(tuple(predicates))

    # --- commands -----------------------------------------------------------------------------

    def _serve_unparked(self, pending: bool) -> None:
        """Commands that arrived while running: pause and break changes become claims; what
        needs a park is kept for it when one is agreed (`pending`), else refused."""
        keep: list[Any] = []
        while self._queue:
            c = self._queue.popleft()
            if isinstance(c, tuple):
                self._emit(ev.DebugRefused, c[0], c[1])
            elif isinstance(c, protocol.Arm):
                self._emit(ev.DebugArmed, c.request, self._bucket_points(), self._kind())
            elif isinstance(c, protocol.Pause):
                self._deferred.append((str(c.request), "pause", "pause"))
            elif isinstance(c, protocol.SetBreaks):
                self._breaks[c.request] = c
                # each set is whole: the newest supersedes the ones not claimed yet, so a
                # break set, cleared and set again before a boundary takes one boundary, with
                # the last set (claimed one a boundary, they would apply in turn, the first
                # in force at the next step). An older one another rank claimed still applies
                # where agreed (kept in _breaks until a newer one is applied).
                self._deferred = [d for d in self._deferred if d[1] != "breaks"]
                self._deferred.append((str(c.request), "breaks", "breaks"))
            elif isinstance(c, protocol.Abort):
                self._raise_abort()
            elif pending:
                keep.append(c)
            else:
                self._emit(ev.DebugRefused, c.request,
                              f"rank {self.rank} is not parked (it runs step {self.step}): "
                              f"{type(c).__name__} needs every rank paused; pause first")
        self._queue.extendleft(reversed(keep))
        if not self._queue and not self._deferred and not self._breaks:
            self.active = self.armed or self._abort.is_set()

    def _park(self, point: str, bucket: int, reason: str, request: int) -> None:
        att = self.att
        assert att is not None
        self.parked = True
        # Changes that arrived on the way here apply now: every rank applies them in its park.
        for change in [c for c in self._queue if isinstance(c, protocol.SetBreaks)]:
            self._queue.remove(change)
            self._apply(change)
        for request_id, c in sorted(self._breaks.items()):
            del self._breaks[request_id]
            self._apply(c)
        self._deferred = []  # every pause and trigger so far is answered by this park
        self._step_to = None
        self._where = (point, bucket)
        self._namespace = self._names(att, self.step)
        self._emit(ev.Parked, point, bucket, reason[:4000], request)
        self.tap.flush(1.0)
        try:
            while True:
                if self._abort.is_set():
                    self._raise_abort()
                if not self._queue:
                    time.sleep(_POLL_S)
                    continue
                if self._serve_parked(self._queue.popleft(), point, bucket):
                    return
        finally:
            self.parked = False

    def _serve_parked(self, c: protocol.Command | tuple[int, str], point: str,
                      bucket: int) -> bool:
        """One command in the park; True when it ends the park."""
        tap = self.tap
        if isinstance(c, tuple):
            self._emit(ev.DebugRefused, c[0], c[1])
        elif isinstance(c, protocol.Resume):
            self._emit(ev.Unparked, "resume", c.request)
            return True
        elif isinstance(c, protocol.Step):
            if c.to == "bucket" and not self._bucket_points():
                self._emit(ev.DebugRefused, c.request, _HOOKLESS_BUCKETS.replace(
                    "break_at(bucket=...)", "step('bucket')"))
                return False
            self._step_to = c.to
            self._emit(ev.Unparked, "step", c.request)
            return True
        elif isinstance(c, protocol.Abort):
            self._raise_abort()
        elif isinstance(c, protocol.SetBreaks):
            self._apply(c)
        elif isinstance(c, protocol.Pause):
            self._emit(ev.Parked, point, bucket, "already parked", c.request)
        elif isinstance(c, protocol.Arm):
            self._emit(ev.DebugArmed, c.request, self._bucket_points(), self._kind())
        elif isinstance(c, protocol.Inspect):
            self._inspect(c)
        elif isinstance(c, protocol.Fetch):
            self._fetch(c)
        elif isinstance(c, protocol.RunCode):
            out, result, error = run_code.run(c.code, self._namespace)
            self._emit(ev.CodeRan, c.request, out, result, error)
        elif isinstance(c, protocol.Stacks):
            threads, texts = run_code.stacks()
            self._emit(ev.StacksTaken, c.request, threads, texts)
        tap.flush(1.0)
        return False

    def _raise_abort(self) -> None:
        if self.parked:
            self._emit(ev.Unparked, "abort", 0)
        self.tap.flush(1.0)
        raise Aborted(f"ddpviz: rank {self.rank} aborted from the notebook's debugger at step "
                      f"{self.step}")

    def _tensor(self, name: str, what: str, bucket: int, state_key: str) -> torch.Tensor:
        """The tensor an Inspect/Fetch names, never one an all-reduce may be writing; ValueError
        saying what is missing."""
        t = self._named_tensor(name, what, bucket, state_key)
        att, sources = self.att, [t]
        if what == "bucket_grads" and att is not None:  # (a concatenation: its sources)
            sources = [g for g in (att.params[i].grad for i in att.members.get(bucket, ()))
                       if g is not None]
        busy = max((self._in_flight(s) for s in sources), default=-1)
        if busy >= 0:
            subject = (f"bucket {bucket}'s buffer" if what == "bucket_buffer" else
                       f"the {what} of {name or f'bucket {bucket}'} (in bucket {busy}'s buffer)")
            raise ValueError(
                f"{subject}: its all-reduce was launched before this park (before bucket "
                f"{self._where[1]}'s) and may still be running on rank "
                f"{self.rank}: reading it could see half-reduced values. Read it before its "
                f"all-reduce (break_at(step, bucket={busy})) or once every all-reduce of the "
                "step is complete (break_at(step, where='after_backward'))")
        return t

    def _in_flight(self, t: torch.Tensor) -> int:
        """The bucket whose launched all-reduce may still be writing `t`'s storage (-1: none):
        only in a park before bucket k, where the buckets before k were launched."""
        att = self.att
        point, current = self._where
        if att is None or point != "bucket" or t.is_sparse:
            return -1
        ptr = t.untyped_storage().data_ptr()
        for b, buffer in att.buffers.items():
            if b != current and not buffer.is_sparse and \
                    buffer.untyped_storage().data_ptr() == ptr:
                return b
        return -1

    def _named_tensor(self, name: str, what: str, bucket: int, state_key: str) -> torch.Tensor:
        att = self.att
        assert att is not None
        if what in ("bucket_buffer", "bucket_grads"):
            if what == "bucket_buffer":
                if bucket in att.buffers:
                    return att.buffers[bucket]
                raise ValueError(f"bucket {bucket}'s buffer was not seen at step {self.step} "
                                 f"on rank {self.rank} (seen: {sorted(att.buffers)}); its "
                                 "buffer is known from its safe point on")
            members = att.members.get(bucket)
            if members is None:
                raise ValueError(f"bucket {bucket} is not known on rank {self.rank} (known: "
                                 f"{sorted(att.members)})")
            grads = [att.params[i].grad for i in members]
            if any(g is None for g in grads):
                raise ValueError(f"bucket {bucket} has parameters without a gradient")
            return torch.cat([g.detach().reshape(-1) for g in grads if g is not None])
        if name not in att.index:
            close = [n for n in att.names if name.split(".")[-1] in n][:5]
            raise ValueError(f"no parameter {name!r} in this DDP"
                             + (f" (did you mean {', '.join(close)}?)" if close else ""))
        p = att.params[att.index[name]]
        if what == "value":
            return p.detach()
        if what == "grad":
            if p.grad is None:
                raise ValueError(f"{name} has no gradient (yet) at step {self.step}")
            return p.grad
        if what == "grad_before_allreduce":
            kept = self._snapshot.get(name)
            if kept is None:
                raise ValueError(f"no local gradient of {name} was kept on rank {self.rank}: "
                                 "one is kept only where a nonfinite_gradient break "
                                 "(break_on('nonfinite_gradient')) saw it non-finite")
            return kept[1]
        if what == "optimizer_state":
            opt = self._optimizer
            state = opt.state.get(p, {}) if opt is not None else {}
            tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
            if not tensors:
                raise ValueError(f"no optimizer state for {name} on rank {self.rank} (no "
                                 "optimizer step seen yet, or a stateless optimizer)")
            if state_key and state_key not in tensors:
                raise ValueError(f"no state {state_key!r} for {name}; it has "
                                 f"{sorted(tensors)}")
            return tensors[state_key or next(iter(tensors))]
        raise ValueError(f"unknown what={what!r}")

    def _inspect(self, c: protocol.Inspect) -> None:
        try:
            t = self._tensor(c.name, c.what, c.bucket, c.state_key)
        except ValueError as exc:
            self._emit(ev.Inspected, c.request, c.name, c.what, str(exc))
            return
        s = summarize(t)
        self._emit(ev.Inspected, c.request, c.name, c.what, "", *(s[f] for f in _SUMMARY))

    def _fetch(self, c: protocol.Fetch) -> None:
        try:
            t = self._tensor(c.name, c.what, c.bucket, c.state_key)
            start, stop = fetch_range(t, c.chunk, c.start, c.stop, c.max_elements)
        except ValueError as exc:
            self._emit(ev.Fetched, c.request, c.name, c.what, str(exc))
            return
        dtype = str(t.dtype).removeprefix("torch.")
        chunks = parts(t, start, stop)
        for i, (offset, data) in enumerate(chunks):
            self._emit(ev.Fetched, c.request, c.name, c.what, "", dtype, tuple(t.shape),
                          offset, i, len(chunks), data)

    # --- helpers ------------------------------------------------------------------------------

    def _keep_snapshot(self, att: Attachment, step: int, members: Sequence[int]) -> None:
        kept = sum(t.numel() for _, t in self._snapshot.values())
        for i in members:
            g = att.params[i].grad
            if g is None or bool(torch.isfinite(g).all()) or kept + g.numel() > MAX_SNAPSHOT:
                continue
            self._snapshot[att.names[i]] = (step, g.detach().clone())
            kept += g.numel()

    def _names(self, att: Attachment, step: int) -> dict[str, Any]:
        """A predicate's and a parked rank's namespace: the training loop's local names
        (`loss`, the batch...; read, never written back) under ddpviz's."""
        ddp = att.ddp
        return {**loop_names(), "ddp": ddp, "model": getattr(ddp, "module", ddp),
                "step": step, "rank": self.rank, "world_size": _world_size(),
                "output": att.output, "optimizer": self._optimizer, "torch": torch}

    def _bucket_points(self) -> bool:
        return self.att is not None and self.att.bucket_points

    def _kind(self) -> str:
        return self.att.kind if self.att is not None else ""


_SUMMARY = ("shape", "dtype", "device", "numel", "norm", "max_abs", "n_nan", "n_posinf",
            "n_neginf", "nonfinite_at", "finiteness", "digest", "chunk_elements",
            "chunk_digests", "head")


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


_current: Controller | None = None
_hook: Any = None


def install(sender: Any, rank: int) -> Controller:
    """Make this process's debugger, fed by `sender`'s control messages (a `Sender` from
    `ddpviz.connect()`); idempotent. Called on ranks launched with DDPVIZ_DEBUG=1."""
    global _current, _hook
    if _current is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _current = Controller(sender, rank)
        sender.on_control(_current.receive)
        ctl = _current
        _hook = register_optimizer_step_post_hook(
            lambda optimizer, args, kwargs: ctl.optimizer_stepped(optimizer))
    return _current


def wait_received(request: int, timeout: float) -> bool:
    """Wait until this process's debugger has received the notebook's command `request` (or a
    later one): a %%ddp cell starts only once the breaks set before it are in force on the rank.

    Args:
        request: the last request the notebook sent to every rank (0: none, returns at once).
        timeout: the most seconds to wait.

    Returns:
        Whether it arrived (True with no request to wait for); False without a debugger.
    """
    if request <= 0:
        return True
    ctl = _current  # installed before the rank takes cells, or never
    if ctl is None:
        return False
    deadline = time.monotonic() + timeout
    while ctl._last_request < request:
        if ctl.dead or time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def install_from_env(sender: Any, rank: int) -> Controller | None:
    """`install` where DDPVIZ_DEBUG=1 says so (launch(debug=True), `ddpviz record --debug`);
    DDPVIZ_DEBUG=paused (launch(debug="paused")) also parks the rank before its first forward."""
    mode = os.environ.get(ENV_DEBUG, "")
    if mode not in ("1", "paused") or not callable(getattr(sender, "on_control", None)):
        return None
    ctl = install(sender, rank)
    if mode == "paused" and ctl.step < 0:
        ctl.start_paused = ctl.active = True
    return ctl


def attach(ddp: nn.Module, params: Sequence[nn.Parameter], names: Sequence[str], tap: ev.Tap,
           *, kind: str, bucket_points: bool) -> Attachment | None:
    """The safe points of `ddp` for this process's debugger; None when none is installed (the
    DDP then calls nothing)."""
    if _current is None or _current.dead:
        return None
    _spy_on(tap, _current)
    return Attachment(_current, ddp, params, names, tap, kind=kind, bucket_points=bucket_points)
