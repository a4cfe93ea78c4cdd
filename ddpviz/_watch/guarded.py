"""watch() with the guard (`Recording(guard=True)`): watch's comm hook around each bucket
all-reduce (BucketReady, AllReduceLaunched, AllReduceDone, per-bucket summaries), its wait
settled on the training thread under the watchdog's deadline, a hang raised from backward() as
RankHangError; a post-accumulate-grad hook per parameter. See [Note: transparent by
construction] and [Note: settled on the training thread]."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddpviz import events as ev
from ddpviz._watch.base import Watch, _graph_task, _logger, _plain_wait_first
from ddpviz.engine.comm import LAUNCH
from ddpviz.probes import collectives

# [Note: transparent by construction]
# torch's reducer scales gradients itself only when NO comm hook is registered: it copies each
# gradient into its bucket with `mul_out(view, grad, 1/world_size)` (one pass), divides in
# place (`view.div_(world_size)`) when .grad already is the bucket view (gradient_as_bucket_view
# after the first iteration, unless .grad was set to None), divides the whole bucket after the
# batched copy (batched_grad_copy) and divides a sparse gradient; then its C++ hook all-reduces
# the bucket with SUM. Once any comm hook is registered it copies gradients unscaled and leaves
# the averaging to the hook. watch() must register a hook (to see buckets and to guard their
# all-reduce), so its default hook redoes exactly that scaling on the bucket (multiplying by the
# reciprocal is not dividing at world sizes that are not powers of two) and then runs torch's
# own C++ SUM all-reduce (`reducer._run_allreduce_hook`). Which gradients were bucket views is
# read from .grad after each synced forward (the rebuild re-points views before that). A user
# hook is called as is: the reducer behaves the same with any hook registered.

# [Note: settled on the training thread]
# torch's reducer takes a Python comm hook's result only as a Python object, so the future it
# waits on must be completed from Python. Completing it from a done-callback (or `.then`) runs
# Python on gloo's thread when the all-reduce finishes: that thread must take the GIL, and it
# cost 80-100 us a step with one bucket (benchmarks/bench_watch.py --worlds 1: "minimal hook,
# .then" against "minimal Python comm hook", on steps of 260-310 us). So the hook returns a
# fresh future and nothing runs on the collective's thread: a final callback queued on the
# backward (it runs after the last autograd node and before the reducer's finalize_backward,
# which is queued when the last bucket is ready) waits for each bucket's all-reduce in order on
# the training thread, a bounded C++ wait first (the GIL released, Ctrl-C honoured), then the
# watchdog's deadline, and completes the futures. AllReduceDone is therefore stamped when the
# training thread sees the all-reduce done (as ddpviz's own DDP stamps it, in finalize): for a
# bucket that finished while backward still ran, that is after the backward's last hook. A
# hook called with no autograd node running (static_graph's first backward runs every bucket
# from a final callback; join's shadow all-reduces run outside backward) waits right there.


# Why Recording(guard=True) steps aside (watch() raises NotObservableError, `ddpviz record`
# leaves the DDP unwatched and says so once): the guard's comm hook redoes torch's averaging,
# dividing the gradients that already were bucket views and multiplying the others. With
# torch 2.15's lazy_bucket_allocation and gradient_as_bucket_view, which ones those are is
# decided when each bucket is allocated inside backward (engine/bucket_views.allocate), out of
# the hook's sight; measured on torch 2.15.0 at world size 3, the guard changed the trained
# parameters. The hook-less recordings stay bitwise there.
LAZY_VIEWS_UNGUARDED = (
    "Recording(guard=True) cannot watch a DDP built with lazy_bucket_allocation=True and "
    "gradient_as_bucket_view=True without changing its gradients (torch 2.15 decides inside "
    "backward which gradients are averaged in place); watch it with the default recording "
    "(guard=False), or drop one of the two arguments")


class GuardedWatch(Watch):
    """watch's comm hook around each bucket all-reduce; See the Notes above."""

    _nf_each_step = True
    _contract_canaries = False  # its per-parameter hooks feed the sync contract

    def _init_strategy(self) -> None:
        ddp = self.ddp
        self._hooks_called = 0
        # gradient_as_bucket_view: .grad of every parameter after the synced forward (which
        # ones already are bucket views decides divide vs multiply; see the Note).
        self._batched = bool(getattr(ddp, "batched_grad_copy", False))
        self._track_views = bool(ddp.gradient_as_bucket_view) and not self._batched
        self._grads_before: list[torch.Tensor | None] | None = None
        self._scale = 1.0 / self.world_size
        self._user_hook: Callable[..., torch.futures.Future] | None = None
        self._user_state: Any = None
        self._delivered: BaseException | None = None
        self._error: BaseException | None = None  # diagnosed while settling; raised after
        self._interrupt: BaseException | None = None  # Ctrl-C while settling; raised after
        self._abandoned: list[_Pending] = []  # all-reduces an interrupt left running
        self._pending: list[_Pending] = []  # this backward's all-reduces, in launch order

    def _refuse(self, hook: Callable[..., torch.futures.Future] | None,
                existing: list[Any]) -> None:
        if existing and hook is not None:
            raise RuntimeError(
                f"ddpviz: watch(hook={getattr(hook, '__qualname__', hook)}) but this DDP already "
                f"has the comm hook {getattr(existing[-1][0], '__qualname__', existing[-1][0])}"
                "; torch runs one hook per DDP.\nPass hook= only for a DDP without a hook "
                "(watch() wraps a registered one by itself).")

    def _take_hook(self, hook: Callable[..., torch.futures.Future] | None, state: Any,
                   existing: list[Any]) -> None:
        ddp = self.ddp
        if existing:
            if getattr(ddp, "_lazy_init_ran", False):
                raise RuntimeError(
                    f"ddpviz: this DDP already has the comm hook "
                    f"{getattr(existing[-1][0], '__qualname__', existing[-1][0])} and has run a "
                    "forward; torch allows one hook per reducer, so watch() can wrap a "
                    "registered hook only before the first forward.\nCall ddpviz.watch(ddp) "
                    "right after constructing the DDP (before or after register_comm_hook).")
            self._user_hook, self._user_state = existing[-1]
            self._rebuild_reducer()
        elif hook is not None:
            self._user_hook, self._user_state = hook, (state if state is not None
                                                       else self.group)
            ddp._comm_hooks.append((hook, self._user_state))
            _logger(ddp)._set_comm_hook_name(getattr(hook, "__qualname__", str(hook)))

    def _hook_params(self) -> None:
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(
                functools.partial(self._grad_ready, i)))

    def _guard(self) -> None:
        ddp = self.ddp
        try:
            # A lambda: torch rejects string annotations (this module's `from __future__`).
            dist._register_comm_hook(ddp.reducer, None,
                                     lambda state, bucket: self._comm_hook(bucket))
        except RuntimeError as exc:
            self.close()
            raise RuntimeError(
                "ddpviz: this DDP already has a built-in comm hook "
                "(_register_builtin_comm_hook), which watch() cannot wrap.\nCall "
                "ddpviz.watch(ddp) before registering it: watch() then wraps it.") from exc
        # Later registrations land in watch's hook (torch allows one hook per reducer).
        ddp.register_comm_hook = self._register_comm_hook  # type: ignore[method-assign]
        ddp._register_builtin_comm_hook = self._register_builtin  # type: ignore[method-assign]

    def _settle_previous(self) -> None:
        self._deliver()  # an error diagnosed after the last backward returned
        if self._abandoned:
            self._finish_abandoned()

    def _backward_begins(self) -> None:
        if self._pending:  # a backward that raised before its final callbacks: never settled
            self._abandon(self._pending)
            self._pending = []
        self._hooks_called = 0
        self._opt.set(self._summary.per_param)  # See [Note: optimizer-step tap]

    def _after_hooks(self) -> None:
        try:
            super()._after_hooks()
        finally:
            pending, self._pending = self._pending, []
            self._settle(pending)

    def _nf_arm(self, step: int, now: bool) -> None:
        if self.ddp.require_backward_grad_sync:  # the comm hook sees every bucket
            self._nf.checking(step)

    def _backward_done(self) -> None:
        self._nf.backward_done(self.tap.step)
        if self._learning and self.buckets:
            self._learning = False
            if self.tap.enabled:
                # learned from the comm hook's buckets: their caps are not known (none said)
                self.tap.emit(ev.BucketAssigned, tuple(tuple(b) for b in self.buckets), (),
                              False)
        self._grads_before = None

    def _after_reducer(self) -> None:
        super()._after_reducer()
        self._deliver()
        if self._debug is not None and self.ddp.require_backward_grad_sync:
            # the debugger's safe point: torch's finalize_backward waited for every bucket
            self._debug.after_backward(self.tap.step)

    # --- attach -------------------------------------------------------------------------------

    def _rebuild_reducer(self) -> None:
        """Replace the DDP's reducer by an identical one without a comm hook (torch allows one
        per reducer and cannot remove it), before the first forward, as DDP's constructor
        built it. The old reducer's autograd hooks are removed first."""
        ddp: Any = self.ddp  # private torch API below
        old = ddp.reducer
        parameters, expect_sparse = ddp._build_params_for_reducer()
        mapping = ddp._build_debug_param_to_name_mapping(parameters)
        old._remove_autograd_hooks()
        ddp._ddp_init_helper(parameters, expect_sparse, mapping, ddp.static_graph)
        if ddp.static_graph:
            ddp.reducer._set_static_graph()
            ddp.logger._set_static_graph()
        if getattr(ddp, "mixed_precision", None) is not None:
            ddp.reducer._set_mixed_precision_param_dtype(ddp.mixed_precision.param_dtype)
        hook = self._user_hook
        ddp.logger._set_comm_hook_name(getattr(hook, "__qualname__", str(hook)))

    def _register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """`ddp.register_comm_hook` while watched: torch's checks, then watch calls it."""
        if self._user_hook is not None:
            raise RuntimeError(
                "ddpviz: register_comm_hook or register_builtin_comm_hook can only be called "
                f"once; {getattr(self._user_hook, '__qualname__', self._user_hook)} is "
                "registered already (ddpviz.watch wraps it).\nCombine the hooks into one "
                "function.")
        self.ddp._check_comm_hook(hook)
        _logger(self.ddp)._set_comm_hook_name(hook.__qualname__)
        self.ddp._comm_hooks.append((hook, state))
        self._user_hook, self._user_state = hook, state

    def _register_builtin(self, comm_hook_type: Any) -> None:
        """`ddp._register_builtin_comm_hook` while watched: the same arithmetic in Python."""
        builtin = {dist.BuiltinCommHookType.ALLREDUCE: _builtin_allreduce,
                   dist.BuiltinCommHookType.FP16_COMPRESS: _builtin_fp16_compress}
        if comm_hook_type not in builtin:
            raise ValueError(f"ddpviz: unknown built-in comm hook {comm_hook_type!r}; expected "
                             "dist.BuiltinCommHookType.ALLREDUCE or FP16_COMPRESS.")
        if self._user_hook is not None:
            self._register_comm_hook(self.group, builtin[comm_hook_type])  # raises: one hook
        _logger(self.ddp)._set_comm_hook_name(str(comm_hook_type))
        self._user_hook, self._user_state = builtin[comm_hook_type], self.group

    def _grad_ready(self, index: int, _param: torch.Tensor) -> None:
        task = _graph_task()
        if task != self._task and task != -1:
            self._begin_backward(task)
            self._contract.accumulated()  # once a backward (See [Note: the gradient-sync
            # contract] in probes/sync_contract.py)
        summary = self._summary
        if not summary.per_param:  # See [Note: detail levels] (recording.py)
            if self.tap.enabled:  # (nothing to summarize for: no event would carry it)
                summary.add(index, self._bucket_of.get(index, -1), self._nbytes[index])
            return
        self._fired.add(index)
        if self.tap.enabled:
            self.tap.emit(ev.GradReady, index, self._bucket_of.get(index, -1))

    def _deliver(self) -> None:
        """Raise the error the watchdog diagnosed in a guarded all-reduce, once, here in Python
        (from the end-of-backward callback: torch's reducer is done with the bucket futures by
        then), so that it reaches the caller of backward() with its own type and text."""
        error = self._error
        if error is not None and self._delivered is None:
            self._delivered = error
            raise error
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt

    def _abandon(self, items: list[_Pending]) -> None:
        """All-reduces no backward will settle: waited for at the next forward, so that they
        cannot write into the next backward's buckets."""
        self._abandoned += [p for p in items if p.work is not None]

    def _finish_abandoned(self) -> None:
        """Wait (under the watchdog) for the all-reduces an interrupted backward left running:
        the peers still complete them, into this rank's buckets."""
        items, self._abandoned = self._abandoned, []
        for item in items:
            self._await(item)

    # --- the comm hook ------------------------------------------------------------------------

    def _comm_hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        in_node = torch._C._current_autograd_node() is not None
        task = _graph_task()
        if task != self._task and task != -1:
            self._begin_backward(task)  # no parameter hook fired first
        b = self._hooks_called  # bucket.index() is 0 for every bucket in static_graph's 1st
        self._hooks_called += 1
        buffer = bucket.buffer()
        if self._learning:
            with self._lock:
                members = [self._index[id(p)] for p in bucket.parameters()]
                self.buckets.append(members)
                self._bucket_of.update((p, b) for p in members)
        if self._closed:
            return self._unwrapped(self._reduce(bucket, buffer)[0])
        # the local buffer, before the all-reduce: See [Note: finding where a NaN starts]
        self._nf.bucket(self.tap.step, lambda: [self._index[id(p)] for p in bucket.parameters()],
                        buffer, bucket.gradients)
        if self.tap.enabled:
            if not self._summary.per_param:
                self._summary.emit(b)
            self.tap.emit(ev.BucketReady, b)
            self.tap.emit(ev.AllReduceLaunched, b, buffer.numel() * buffer.element_size(),
                          str(buffer.dtype).removeprefix("torch."))
        out: torch.futures.Future = torch.futures.Future()
        if self._error is not None:  # failed already: no more collectives, raise at the end
            out.set_result(buffer)
            return out
        scaled = False
        if self._debug is not None:  # the debugger's safe point: before this all-reduce, the
            # buffer as it is all-reduced (torch's averaging done first, as its own reducer
            # does before its built-in all-reduce; a user's hook gets it unscaled)
            if self._user_hook is None:
                self._scale_bucket(bucket, buffer)
                scaled = True
            self._debug.bucket(self.tap.step, b, buffer,
                               lambda: [self._index[id(p)] for p in bucket.parameters()])
        LAUNCH.bucket = b  # the job's collectives ledger names this all-reduce as bucket b's
        try:
            fut, work = self._reduce(bucket, buffer, scaled=scaled)
        except RuntimeError as exc:  # a peer is gone already: the watchdog names it
            fut, work = torch.futures.Future(), None
            fut.set_exception(exc)
        finally:
            LAUNCH.bucket = -1
        item = _Pending(fut, work, out, buffer, b, self.tap.step)
        if in_node:  # settled by _after_hooks; See [Note: settled on the training thread]
            self._pending.append(item)
        else:
            self._settle([item])
        return out

    def _settle(self, items: list[_Pending]) -> None:
        """Complete each item's future with its all-reduce's result, waited for on this thread
        under the watchdog's deadline. After an error or an interrupt the rest complete with
        their own bucket (local gradients), so that torch's reducer finishes; _deliver raises it
        after the reducer (an error stays: no collective follows it; an interrupt is raised
        once)."""
        for n, item in enumerate(items):
            try:
                value = self._await(item)
            except BaseException as exc:
                for rest in items[n:]:
                    if not rest.out.done():
                        rest.out.set_result(rest.fallback)
                if not isinstance(exc, Exception):  # KeyboardInterrupt: once, after the reducer
                    self._interrupt = exc
                    self._abandon(items[n:])
                elif self._error is None:
                    self._error = exc
                return
            if self.tap.enabled and item.bucket >= 0:
                self.tap.emit(ev.AllReduceDone, item.bucket)
            item.out.set_result(value)

    def _await(self, item: _Pending) -> Any:
        fut, work, dog = item.fut, item.work, self.watchdog
        if dog.board is not None:
            dog.step, dog.phase = item.step, "backward"
            if work is not None and not fut.done():
                _plain_wait_first(work)
            if fut.done():  # (wait(): on CUDA it makes this stream wait for the collective)
                with contextlib.suppress(RuntimeError):  # failed: the watchdog names who left
                    return _tensor(fut.wait())
            dog.wait(work if work is not None else fut, collective="all-reduce",
                     bucket=item.bucket, params=self._bucket_names(item.bucket))
        return _tensor(fut.wait())  # raises the collective's error without a watchdog

    def _bucket_names(self, b: int) -> list[str]:
        with self._lock:
            members = self.buckets[b] if 0 <= b < len(self.buckets) else []
        return [self.names[i] for i in members]

    def _reduce(self, bucket: dist.GradBucket, buffer: torch.Tensor, *, scaled: bool = False
                ) -> tuple[torch.futures.Future, Any]:
        """The user's hook, or torch's default reduction (see the Note): its future, and the
        process group's work where watch launched the all-reduce itself (bounded waits).
        `scaled`: the buffer was averaged already (_scale_bucket)."""
        if self._user_hook is not None:
            return self._user_hook(self._user_state, bucket), None
        if not scaled:
            self._scale_bucket(bucket, buffer)
        # What torch's C++ default hook does (reducer._run_allreduce_hook): a SUM all-reduce
        # of the bucket on the DDP's process group; here with its Work, for bounded waits.
        collectives.mark_bucket(self.group, self.tap.step, LAUNCH.bucket)
        work = self.group.allreduce([buffer])
        return work.get_future(), work

    def _scale_bucket(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> None:
        if torch.is_grad_enabled():  # backward(create_graph=True): record none of it
            with torch.no_grad():
                self._average(bucket, buffer)
        else:
            self._average(bucket, buffer)

    def _average(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> None:
        if buffer.is_sparse:
            buffer.div_(self.world_size)
        elif self._batched:
            # batched_grad_copy: torch divides the whole bucket once it is full, bucket views
            # and copied gradients alike (ddpviz's reducer: _flush_batched).
            buffer.div_(self.world_size)
        elif self._grads_before is None:
            buffer.mul_(self._scale)
        else:
            self._scale_by_view(bucket, buffer)

    def _was_view(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> list[bool]:
        before = self._grads_before
        if before is None:
            return [False] * len(bucket.parameters())
        storage = buffer.untyped_storage().data_ptr()
        flags = []
        for p in bucket.parameters():
            g = before[self._index[id(p)]]
            flags.append(g is not None and g.untyped_storage().data_ptr() == storage)
        return flags

    def _scale_by_view(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> None:
        flags = self._was_view(bucket, buffer)
        if not any(flags):
            buffer.mul_(self._scale)
        elif all(flags):
            buffer.div_(self.world_size)
        else:
            for view, was_view in zip(bucket.gradients(), flags, strict=True):
                if was_view:
                    view.div_(self.world_size)
                else:
                    view.mul_(self._scale)

    def _unwrapped(self, fut: torch.futures.Future) -> torch.futures.Future:
        """`fut` as torch's reducer takes a Python hook's result (after close(): no events, no
        watchdog)."""
        if self._user_hook is not None:
            return fut
        return fut.then(lambda f: _tensor(f.value()))


def _builtin_allreduce(group: dist.ProcessGroup, bucket: dist.GradBucket
                       ) -> torch.futures.Future:
    # c10d's AllReduceCommHook: divide the bucket by the group size, then SUM all-reduce.
    buffer = bucket.buffer()
    buffer.div_(group.size())
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(
        lambda f: f.value()[0])


def _builtin_fp16_compress(group: dist.ProcessGroup, bucket: dist.GradBucket
                           ) -> torch.futures.Future:
    # c10d's FP16CompressCommHook: to fp16, divide, SUM all-reduce, copy back into the bucket.
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16)
    compressed.div_(group.size())

    def decompress(f: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(f.value()[0])
        return buffer

    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(
        decompress)


def _tensor(value: Any) -> Any:
    """A hook future's value as torch's reducer takes it (torch's C++ all-reduce yields
    [bucket buffer])."""
    return value[0] if isinstance(value, list) else value


class _Pending:
    """One bucket's all-reduce: torch's reducer waits on `out`; `fallback` (the bucket) completes
    it when the all-reduce cannot."""

    __slots__ = ("bucket", "fallback", "fut", "out", "step", "work")

    def __init__(self, fut: torch.futures.Future, work: Any, out: torch.futures.Future,
                 fallback: torch.Tensor, bucket: int, step: int) -> None:
        self.fut, self.work, self.out, self.fallback = fut, work, out, fallback
        self.bucket, self.step = bucket, step
