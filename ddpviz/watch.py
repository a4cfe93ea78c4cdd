"""`watch(ddp)`: ddpviz's events, findings and hang watchdog on a stock
`torch.nn.parallel.DistributedDataParallel`, so the same widgets and diagnosis work on torch's
own DDP.

What is observable from Python, and used: the reducer's parameter list (the same rule as
ddpviz's engine, params.py), its bucket map (`reducer._get_zeros_like_grad_buckets()`, once at
attach and once after the rebuild), a post-accumulate-grad hook per parameter (GradReady), a
comm hook wrapping the all-reduce (BucketReady, AllReduceLaunched, AllReduceDone; its future is
guarded by the watchdog, so a hang fails the backward with RankHangError instead of blocking in
C++), forward hooks on the DDP module (steps, heartbeats, the rebuild), a pre-forward buffer
comm hook doing torch's buffer broadcast under the watchdog, and an end-of-backward callback
(parameters that got no gradient).
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddpviz import events as ev
from ddpviz.engine.broadcast import broadcast_coalesced
from ddpviz.engine.buffer_identity import BufferIdentity
from ddpviz.engine.params import build_buffers, build_params_for_reducer
from ddpviz.engine.rendezvous import Board, Scope
from ddpviz.engine.watchdog import Watchdog, resolve_hang_timeout
from ddpviz.events import Emitter, Tap
from ddpviz.findings import DiagnosisWarning, Finding

_FIX_UNUSED = ("Pass find_unused_parameters=True to DistributedDataParallel, or use every "
               "parameter in every forward (and make every output that depends on them part of "
               "the loss).")


def watch(ddp: nn.parallel.DistributedDataParallel, *, emitter: Emitter | None = None,
          hook: Callable[[Any, dist.GradBucket], torch.futures.Future] | None = None,
          state: Any = None, hang_timeout: float | None = None) -> Watch:
    """Attach ddpviz to a torch DDP (call on every rank, after constructing it, before training
    and before registering any comm hook: watch registers the comm hook itself).

    Args:
        ddp: a `torch.nn.parallel.DistributedDataParallel`.
        emitter: where events go (default: the process's default emitter, which
            `ddpviz.launch` and `ddpviz.connect()` install).
        hook: your comm hook, if you use one (`hook(state, bucket) -> Future`); watch wraps
            it. Default: torch's `allreduce_hook` (divide by world size, all-reduce), which is
            what DDP does without a hook.
        state: the hook's state (default: the DDP's process group).
        hang_timeout: seconds before a bucket all-reduce that does not complete is diagnosed
            (default $DDPVIZ_HANG_TIMEOUT, else 0.6 x the process group's timeout, at most
            300 s; 0 turns the watchdog off).

    Returns:
        A `Watch`; `.close()` removes the hooks it added (the comm hook stays: torch cannot
        unregister one).
    """
    return Watch(ddp, emitter=emitter, hook=hook, state=state, hang_timeout=hang_timeout)


class Watch:
    """ddpviz's observation of one torch DDP on this rank. Created by `watch`."""

    def __init__(self, ddp: nn.parallel.DistributedDataParallel, *, emitter: Emitter | None,
                 hook: Callable[..., torch.futures.Future] | None, state: Any,
                 hang_timeout: float | None) -> None:
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            raise TypeError(f"ddpviz: watch() takes a torch.nn.parallel.DistributedDataParallel, "
                            f"got {type(ddp).__name__}.\nA ddpviz.DistributedDataParallel "
                            "reports its events itself: pass it emitter= instead.")
        if getattr(ddp, "_comm_hooks", None):
            raise RuntimeError("ddpviz: this DDP already has a comm hook, and torch allows only "
                               "one.\nCall ddpviz.watch(ddp, hook=your_hook, state=your_state) "
                               "instead of ddp.register_comm_hook(...).")
        self.ddp = ddp
        self.group = ddp.process_group
        self.world_size = self.group.size()
        self.tap = Tap(emitter if emitter is not None else ev.default_emitter(),
                       rank=self.group.rank())
        entries = build_params_for_reducer(ddp.module, set(ddp.parameters_to_ignore))
        self.params = [e.param for e in entries]
        self.names = [e.name for e in entries]
        self._sparse = [e.sparse_grad for e in entries]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.buckets: list[list[int]] = []
        self._bucket_of: dict[int, int] = {}
        self._forwards = 0
        self._fired: set[int] = set()
        self._callback_queued = False
        self._rebuilt_seen = False
        self._handles: list[Any] = []
        self._buffer_identity = BufferIdentity(self.group.rank(), self.world_size)
        self._lock = threading.Lock()
        timeout = resolve_hang_timeout(hang_timeout, self.group)
        self.watchdog = Watchdog(self.group, timeout=timeout, tap=self.tap)
        self.watchdog.start("ddpviz.watch()")
        self._monitor: _Monitor | None = None
        if self.watchdog.board is not None:
            twin = Watchdog(self.group, timeout=timeout, tap=self.tap, clone=True)
            twin.board = Board(Scope(self.group, clone=True), self.watchdog.board.epoch)
            self._monitor = _Monitor(twin)
        self._emit_params()
        self._read_buckets(rebuilt=False)
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, i=i: self._grad_ready(i)))
        self._handles.append(ddp.register_forward_pre_hook(self._pre_forward))
        self._handles.append(ddp.register_forward_hook(self._post_forward))
        if not hasattr(ddp, "buffer_hook") and len(getattr(ddp, "modules_buffers", ())) > 0:
            from torch.nn.parallel.distributed import _BufferCommHookLocation

            ddp._register_buffer_comm_hook(
                None, lambda state, buffers: self._sync_buffers(buffers),
                _BufferCommHookLocation.PRE_FORWARD)
        self._user_hook = hook
        self._user_state = state if state is not None else self.group
        # A lambda: torch rejects string annotations (this module's `from __future__`).
        ddp.register_comm_hook(None, lambda state, bucket: self._comm_hook(state, bucket))

    # --- attach -------------------------------------------------------------------------------

    def _emit_params(self) -> None:
        if not self.tap.enabled:
            return
        infos = tuple(ev.ParamInfo(i, n, tuple(p.shape), str(p.dtype).removeprefix("torch."),
                                   str(p.device), sparse)
                      for i, (n, p, sparse) in enumerate(zip(self.names, self.params,
                                                             self._sparse, strict=True)))
        buffers = tuple(n for n, _ in build_buffers(self.ddp.module,
                                                    set(self.ddp.parameters_to_ignore)))
        self.tap.emit(ev.ParamsBuilt, infos, buffers, tuple(sorted(self.ddp.parameters_to_ignore)))

    def _read_buckets(self, *, rebuilt: bool) -> None:
        buckets = self.ddp.reducer._get_zeros_like_grad_buckets()
        indices = [[self._index[id(p)] for p in b.parameters()] for b in buckets]
        with self._lock:
            self.buckets = indices
            self._bucket_of = {p: b for b, members in enumerate(indices) for p in members}
        if self.tap.enabled:
            limits = tuple(int(b.buffer().numel() * b.buffer().element_size()) for b in buckets)
            if rebuilt:
                order = tuple(p for members in indices for p in members)
                self.tap.emit(ev.BucketsRebuilt, order)
            self.tap.emit(ev.BucketAssigned, tuple(tuple(b) for b in indices), limits, rebuilt)

    # --- hooks --------------------------------------------------------------------------------

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            return
        self.tap.step = self._forwards
        self._forwards += 1
        self._fired = set()
        if self.tap.enabled:
            self.tap.emit(ev.ForwardStarted)
        self.watchdog.heartbeat(self.tap.step, "forward")
        if self.tap.step == self._rebuild_step() and not self.ddp._has_rebuilt_buckets:
            # torch rebuilds the buckets in this forward with a blocking broadcast that ddpviz
            # cannot guard: meet first, so a rank that never comes is named instead.
            self.watchdog.exchange("rebuild", "", f"the bucket rebuild at step {self.tap.step}")

    def _rebuild_step(self) -> int:
        if self.ddp.static_graph:
            return 2
        return -2 if self.ddp.find_unused_parameters else 1

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._rebuilt_seen and getattr(self.ddp, "_has_rebuilt_buckets", False):
            self._rebuilt_seen = True
            self._read_buckets(rebuilt=True)

    def _grad_ready(self, index: int) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            if self.tap.enabled:
                self.tap.emit(ev.BackwardStarted)
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._fired.add(index)
        if self.tap.enabled:
            self.tap.emit(ev.GradReady, index, self._bucket_of.get(index, -1))

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        missing = [i for i in range(len(self.params)) if i not in self._fired
                   and self.params[i].requires_grad]
        if missing and self.ddp.require_backward_grad_sync:
            names = tuple(self.names[i] for i in missing)
            if self.tap.enabled:
                self.tap.emit(ev.UnusedParametersFound, tuple(missing), names)
            if not self.ddp.find_unused_parameters and not self.ddp.static_graph:
                self._warn_unused(missing)
        if self.tap.enabled:
            self.tap.emit(ev.BackwardFinished)

    def _warn_unused(self, missing: list[int]) -> None:
        buckets = sorted({self._bucket_of.get(i, -1) for i in missing})
        rank = self.group.rank()
        step = self.tap.step
        shown = ", ".join(repr(self.names[i]) for i in missing[:6])
        finding = Finding(
            kind="unused_parameter", severity="error",
            title=f"{len(missing)} of {len(self.params)} parameters got no gradient on rank "
                  f"{rank} at step {step} (find_unused_parameters=False): {shown}",
            ranks=(rank,), param=missing[0], name=self.names[missing[0]], field="unused",
            bucket=buckets[0], step=step,
            detail=(f"torch DDP did not all-reduce bucket(s) {', '.join(map(str, buckets))} "
                    "in this iteration: these gradients stay local to each rank, silently; "
                    "torch raises at the next forward",),
            fix=_FIX_UNUSED, world_size=self.world_size)
        # The iteration is broken: ranks that used the parameter wait for this bucket forever,
        # and torch fails at the next forward. Post it, so waiting ranks stop now, named.
        self.watchdog.fail(finding.text(), [finding])
        warnings.warn(finding.text(), DiagnosisWarning, stacklevel=2)

    def _sync_buffers(self, buffers: dict[str, torch.Tensor]) -> None:
        # torch's own buffer sync (a coalesced broadcast from rank 0 before forward), with the
        # watchdog's deadline: a rank that never comes to this forward is named, not waited for.
        for finding in self._buffer_identity.check(buffers, self.tap.step):
            if self.tap.enabled:
                self.tap.emit(ev.FindingReported, finding)
            warnings.warn(finding.text(), DiagnosisWarning, stacklevel=2)
        tensors = list(buffers.values())
        dog = self.watchdog
        wait = None
        if dog.board is not None:
            def wait(work: Any) -> None:
                dog.wait(work, collective="buffer broadcast")
        try:
            broadcast_coalesced(tensors, self.group, src=0, chunk_bytes=int(
                getattr(self.ddp, "broadcast_bucket_size", 250 << 20)), tap=self.tap, wait=wait)
        except RuntimeError as exc:
            raise dog.failed(exc, collective="buffer broadcast") from exc
        if self.tap.enabled:
            self.tap.emit(ev.BuffersSynced, len(tensors),
                          sum(t.numel() * t.element_size() for t in tensors))

    def _comm_hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
        b = bucket.index()
        if self.tap.enabled:
            buffer = bucket.buffer()
            self.tap.emit(ev.BucketReady, b)
            self.tap.emit(ev.AllReduceLaunched, b, buffer.numel() * buffer.element_size(),
                          str(buffer.dtype).removeprefix("torch."))
        try:
            if self._user_hook is not None:
                fut = self._user_hook(self._user_state, bucket)
            else:
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                    allreduce_hook,
                )

                fut = allreduce_hook(self.group, bucket)
        except RuntimeError as exc:  # a peer is gone already: the monitor names it
            if self._monitor is None:
                raise
            fut = torch.futures.Future()
            fut.set_exception(exc)
        step = self.tap.step

        def done(f: torch.futures.Future) -> torch.Tensor:
            if self.tap.enabled:
                self.tap.emit(ev.AllReduceDone, b)
            return f.value()

        fut = fut.then(done)
        if self._monitor is None:
            return fut
        with self._lock:
            members = self.buckets[b] if b < len(self.buckets) else []
        pending = [self.names[i] for i in members]
        return self._monitor.guard(fut, step=step, bucket=b, params=pending)

    @property
    def error(self) -> Exception | None:
        """The RankHangError the watchdog raised on this rank, if any (inside backward, torch
        re-raises it as a RuntimeError carrying the same text)."""
        twin = self._monitor.watchdog if self._monitor is not None else None
        return self.watchdog.raised or (twin.raised if twin is not None else None)

    def close(self) -> None:
        """Remove the hooks (the comm hook stays registered: torch cannot remove one) and stop
        the watchdog thread."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._monitor is not None:
            self._monitor.close()

    def __repr__(self) -> str:
        return (f"<ddpviz.Watch rank {self.group.rank()}/{self.world_size}: {len(self.params)} "
                f"parameters, {len(self.buckets)} buckets, {self._forwards} forwards>")


class _Monitor:
    """One thread that waits for each guarded all-reduce in launch order with the watchdog,
    so torch's C++ reducer (which waits on the returned future) fails instead of hanging."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ddpviz-watch", daemon=True)
        self._thread.start()

    def guard(self, fut: torch.futures.Future, *, step: int, bucket: int,
              params: list[str]) -> torch.futures.Future:
        out: torch.futures.Future = torch.futures.Future()
        self._queue.put((fut, out, step, bucket, params))
        return out

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, out, step, bucket, params = item
            dog = self.watchdog
            dog.step, dog.phase = step, "backward"
            try:
                dog.wait(fut, collective="all-reduce", bucket=bucket, params=params)
                out.set_result(fut.value())
            except BaseException as exc:
                # torch's reducer re-raises this as "RuntimeError: Unable to cast <text> to
                # Tensor"; the newlines keep ddpviz's message on lines of its own.
                out.set_exception(type(exc)(f"\n{exc}\n(diagnosed by ddpviz.watch)") if
                                  isinstance(exc, RuntimeError) else exc)

    def close(self) -> None:
        self._queue.put(None)
