"""`watch(ddp)`: ddpviz's events, findings and hang watchdog on a stock
`torch.nn.parallel.DistributedDataParallel`, so the same widgets and diagnosis work on torch's
own DDP, without changing what it computes. See [Note: transparent by construction].

What is observable from Python, and used: the reducer's parameter list (the same rule as
ddpviz's engine, params.py), its bucket map (`reducer._get_zeros_like_grad_buckets()`, once at
attach and once after the rebuild), a hook per parameter (a post-accumulate-grad hook: GradReady
or a per-bucket aggregate; without the guard, the default, a tensor gradient hook on sampled
steps only, whose bucket's last one is its BucketReady), a comm hook around the all-reduce
(`Recording(guard=True)`: BucketReady, AllReduceLaunched, AllReduceDone; see [Note: settled on
the training thread]; without it the hang guard is engine/quiet.py), a wrapper of the DDP's forward
(steps, heartbeats, the rebuild; See [Note: forward wrapped, not hooked]), a pre-forward buffer
comm hook doing torch's buffer broadcast under the watchdog, and end-of-backward callbacks
(parameters that got no gradient; errors).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddpviz import events as ev
from ddpviz.engine.broadcast import broadcast_coalesced
from ddpviz.engine.buffer_identity import BufferIdentity
from ddpviz.engine.compiler import keep_ddpviz_eager, not_observable
from ddpviz.engine.detail import (
    DetailPolicy,
    FindingObserver,
    GradSummary,
    Recording,
    resolve_recording,
)
from ddpviz.engine.params import build_buffers, build_params_for_reducer
from ddpviz.engine.watchdog import Watchdog, resolve_hang_timeout
from ddpviz.events import Emitter, Tap
from ddpviz.findings import DiagnosisWarning, Finding, fix_for

_WATCHED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # DDPs with a live Watch

# an all-reduce still running after this plain wait goes to the watchdog's deadline
_FIRST_WAIT = datetime.timedelta(seconds=0.25)

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


def watch(ddp: nn.parallel.DistributedDataParallel, *, emitter: Emitter | None = None,
          hook: Callable[[Any, dist.GradBucket], torch.futures.Future] | None = None,
          state: Any = None, hang_timeout: float | None = None,
          recording: Recording | None = None, detail: str | None = None) -> Watch:
    """Attach ddpviz to a torch DDP (call on every rank, after constructing it, best before
    the first forward).

    Parameters, gradients and buffers stay bitwise what the unwatched DDP computes: tested
    against an unwatched twin at world sizes 2, 3 and 4 with fp32/bf16/fp16 parameters, with and
    without a comm hook, gradient_as_bucket_view (.grad reset or kept), static_graph,
    find_unused_parameters, no_sync, batched_grad_copy and sparse gradients
    (tests/dist/test_watch_transparency.py). Not bit-exact, untested: `ddp.join()` with
    `divide_by_initial_world_size=False` once a rank has joined (torch then averages over the
    ranks still training, watch over the whole world), and backward(create_graph=True) with
    gradient_as_bucket_view and kept gradients. Errors watch diagnoses inside backward (a hang,
    a peer that failed) are raised from backward() as `ddpviz.RankHangError`. The training thread
    itself waits for the bucket all-reduces at the end of backward (See [Note: settled on the
    training thread]): Ctrl-C there is raised from backward() within 0.25 s, and an all-reduce
    it left running is waited for at the next forward.

    A comm hook registered before watch() is wrapped (watch() must then come before the first
    forward: torch allows one hook per reducer, so watch rebuilds the reducer once); one
    registered after it with `ddp.register_comm_hook(state, hook)` or
    `ddp._register_builtin_comm_hook(type)` is wrapped too.

    Args:
        ddp: a `torch.nn.parallel.DistributedDataParallel`.
        emitter: where events go (default: the process's default emitter, which
            `ddpviz.launch` and `ddpviz.connect()` install).
        hook: your comm hook, if you use one (`hook(state, bucket) -> Future`); the same as
            registering it with `ddp.register_comm_hook(state, hook)`. Default: none, i.e.
            DDP's own averaging, reproduced bit for bit.
        state: the hook's state (default: the DDP's process group).
        hang_timeout: seconds before a bucket all-reduce that does not complete is diagnosed
            (default $DDPVIZ_HANG_TIMEOUT, else 0.6 x the process group's timeout, at most
            300 s; 0 turns the watchdog off).
        recording: what is observed, and at what cost (a `ddpviz.Recording`; measured:
            benchmarks/bench_watch.py and the README; See [Note: recording policy] in
            engine/detail.py). `guard=False` (the default): no comm hook, so torch's C++
            reduction runs untouched; per-parameter hooks only on the steps `every` picks
            (default 100: 0-2, the rebuild step, every 100th, the step after a finding), which
            record GradReady, BucketReady, the launches in bucket order, every all-reduce done
            after the backward and the unused-parameter diagnosis; the other steps record the
            forward only. A hang in the backward's all-reduces is named by the pulse thread
            (See [Note: the quiet guard] in engine/quiet.py) as a `rank_hang` finding and a
            warning at hang_timeout, but torch itself waits until the process group's timeout
            and raises its own error. `guard=True`: watch's comm hook around each bucket
            all-reduce, which raises a hang from backward() as RankHangError at hang_timeout,
            records per-bucket all-reduce times and, on the steps without per-parameter
            events, a GradsSummarized per bucket (count, bytes, first and last ready time).
            `every=1`: a GradReady per parameter on every step; `every=None`: on none. Every
            recording keeps per-forward heartbeats, the bucket maps, the guarded buffer
            broadcast and bucket rebuild. Default: $DDPVIZ_RECORDING, else `Recording()`.
        detail: deprecated (one release): the old level names ("light", "sampled", "full",
            ...), mapped to `recording=` with a DeprecationWarning naming it.

    Returns:
        A `Watch`; `.close()` removes the hooks it added (the comm hook stays, passing
        through: torch cannot unregister one).
    """
    if recording is None and detail is not None:  # the warning points at watch()'s caller
        recording, detail = resolve_recording(None, detail, where="watch()", stacklevel=2), None
    return Watch(ddp, emitter=emitter, hook=hook, state=state, hang_timeout=hang_timeout,
                 recording=recording, detail=detail)


class NotObservableError(RuntimeError):
    """watch() cannot observe this DDP (how it was built bypasses what ddpviz watches);
    `ddpviz record` then leaves it unwatched, saying why once."""

    PREFIX = "watch() cannot observe this DDP: "


class Watch:
    """ddpviz's observation of one torch DDP on this rank. Created by `watch`."""

    def __init__(self, ddp: nn.parallel.DistributedDataParallel, *, emitter: Emitter | None,
                 hook: Callable[..., torch.futures.Future] | None, state: Any,
                 hang_timeout: float | None, recording: Recording | None = None,
                 detail: str | None = None,
                 names: list[str] | None = None, driven: bool = False,
                 where: str = "ddpviz.watch()") -> None:
        """`names`: the parameters' dotted names when the DDP's module does not carry them
        (torch's composable replicate() wraps a ParameterList); `driven`: the DDP's
        `_pre_forward` is called directly (replicate()), never its forward; `where`: the
        place every rank meets first, as a missing rank's finding names it."""
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            raise TypeError(f"ddpviz: watch() takes a torch.nn.parallel.DistributedDataParallel, "
                            f"got {type(ddp).__name__}.\nA ddpviz.DistributedDataParallel "
                            "reports its events itself: pass it emitter= instead.")
        rec = resolve_recording(recording, detail, where="watch()", stacklevel=2)
        policy = DetailPolicy.of(rec)
        keep_ddpviz_eager()  # See [Note: ddpviz under torch.compile] (engine/compiler.py)
        unobservable = not_observable(ddp)
        if unobservable:
            raise NotObservableError(f"ddpviz: {NotObservableError.PREFIX}{unobservable}.")
        if ddp in _WATCHED:
            raise RuntimeError("ddpviz: this DDP is watched already (watch() was called on it "
                               "before).\nUse the Watch that call returned, or .close() it "
                               "first.")
        existing = list(getattr(ddp, "_comm_hooks", ()))
        hookless = not rec.guard  # See [Note: recording policy] (engine/detail.py)
        if existing and hook is not None and not hookless:
            raise RuntimeError(
                f"ddpviz: watch(hook={getattr(hook, '__qualname__', hook)}) but this DDP already "
                f"has the comm hook {getattr(existing[-1][0], '__qualname__', existing[-1][0])}"
                "; torch runs one hook per DDP.\nPass hook= only for a DDP without a hook "
                "(watch() wraps a registered one by itself).")
        self.ddp = ddp
        self.recording = rec
        self.group = ddp.process_group
        self.world_size = self.group.size()
        target = emitter if emitter is not None else ev.default_emitter()
        if target is not None and policy.level == "sampled":
            target = FindingObserver(target, self._on_finding)
        self.tap = Tap(target, rank=self.group.rank())
        self._summary = GradSummary(policy, self.tap)
        entries = build_params_for_reducer(ddp.module, set(ddp.parameters_to_ignore))
        self.params = [e.param for e in entries]
        self.names = [e.name for e in entries] if names is None or len(names) != len(
            entries) else list(names)
        self._driven = driven
        self._sparse = [e.sparse_grad for e in entries]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.buckets: list[list[int]] = []
        self._bucket_of: dict[int, int] = {}
        self._forwards = 0
        self._fired: set[int] = set()
        self._task = -1  # the backward (graph task) this watch's callbacks are queued in
        self._hooks_called = 0
        self._rebuilt_seen = False
        self._learning = False
        self._closed = False
        self._light = hookless and rec.every is not None  # per-parameter hooks, armed per step
        self._steps_only = hookless and rec.every is None  # neither hook: forwards only
        self._armed: list[Any] = []  # light: this step's per-parameter hooks
        self._fresh: list[torch.Tensor] = []  # light: parameters whose hook dict _arm made
        self._sync = True  # light: the backward all-reduces (not under no_sync)
        self._left: list[int] = []  # light: per bucket, gradients not ready yet (0: ready)
        self._next_launch = 0
        self._bucket_meta: list[tuple[int, str]] = []  # per bucket: bytes, dtype
        self._handles: list[Any] = []
        self._post_needed = True  # _post_forward has something to look at
        self._forward: Callable[..., Any] | None = None  # the DDP's forward, before watch's
        self._buffer_identity = BufferIdentity(self.group.rank(), self.world_size)
        self._lock = threading.Lock()
        # gradient_as_bucket_view: .grad of every parameter after the synced forward (which
        # ones already are bucket views decides divide vs multiply; see the Note).
        self._batched = bool(getattr(ddp, "batched_grad_copy", False))
        self._track_views = not hookless and bool(ddp.gradient_as_bucket_view) and \
            not self._batched
        self._grads_before: list[torch.Tensor | None] | None = None
        self._scale = 1.0 / self.world_size
        self._user_hook: Callable[..., torch.futures.Future] | None = None
        self._user_state: Any = None
        self._delivered: BaseException | None = None
        self._error: BaseException | None = None  # diagnosed while settling; raised after
        self._interrupt: BaseException | None = None  # Ctrl-C while settling; raised after
        self._abandoned: list[_Pending] = []  # all-reduces an interrupt left running
        self._pending: list[_Pending] = []  # this backward's all-reduces, in launch order
        timeout = resolve_hang_timeout(hang_timeout, self.group)
        self.watchdog = Watchdog(self.group, timeout=timeout, tap=self.tap)
        self.watchdog.start(where)
        try:
            self._install(hook, state, existing, hookless)
        except BaseException:
            self.close()  # nothing of a failed attach stays on the DDP
            raise

    def _install(self, hook: Callable[..., torch.futures.Future] | None, state: Any,
                 existing: list[Any], hookless: bool) -> None:
        ddp = self.ddp
        if hookless:
            if hook is not None:  # torch's own registration: watch adds no comm hook
                ddp.register_comm_hook(state if state is not None else self.group, hook)
        elif existing:
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
        self._emit_params()
        self._read_buckets(rebuilt=False)
        self._nbytes = [p.numel() * p.element_size() for p in self.params]
        if not hookless:
            for i, p in enumerate(self.params):
                self._handles.append(p.register_post_accumulate_grad_hook(
                    functools.partial(self._grad_ready, i)))
        self._wrap_forward()
        if not hasattr(ddp, "buffer_hook") and len(getattr(ddp, "modules_buffers", ())) > 0:
            from torch.nn.parallel.distributed import _BufferCommHookLocation

            ddp._register_buffer_comm_hook(
                None, lambda state, buffers: self._sync_buffers(buffers),
                _BufferCommHookLocation.PRE_FORWARD)
        _WATCHED.add(ddp)
        if hookless:
            self.watchdog.guard_quiet()  # See [Note: the quiet guard] (engine/quiet.py)
            return
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

    def _emit_params(self) -> None:
        if not self.tap.enabled:
            return
        infos = tuple(ev.ParamInfo(i, n, tuple(p.shape), str(p.dtype).removeprefix("torch."),
                                   str(p.device), sparse, p.element_size())
                      for i, (n, p, sparse) in enumerate(zip(self.names, self.params,
                                                             self._sparse, strict=True)))
        buffers = tuple(n for n, _ in build_buffers(self.ddp.module,
                                                    set(self.ddp.parameters_to_ignore)))
        self.tap.emit(ev.ParamsBuilt, infos, buffers, tuple(sorted(self.ddp.parameters_to_ignore)))

    def _read_buckets(self, *, rebuilt: bool) -> None:
        try:
            buckets = self.ddp.reducer._get_zeros_like_grad_buckets()
        except RuntimeError:  # a sparse bucket has no tensor before its first backward
            with self._lock:  # learn the map from the comm hook's buckets instead
                self.buckets, self._bucket_of, self._learning = [], {}, True
            return
        indices = [[self._index[id(p)] for p in b.parameters()] for b in buckets]
        self._bucket_meta = [(int(b.buffer().numel() * b.buffer().element_size()),
                              str(b.buffer().dtype).removeprefix("torch.")) for b in buckets]
        with self._lock:
            self._learning = False
            self.buckets = indices
            self._bucket_of = {p: b for b, members in enumerate(indices) for p in members}
        if self.tap.enabled:
            limits = tuple(nbytes for nbytes, _ in self._bucket_meta)
            if rebuilt:
                order = tuple(p for members in indices for p in members)
                self.tap.emit(ev.BucketsRebuilt, order)
            self.tap.emit(ev.BucketAssigned, tuple(tuple(b) for b in indices), limits, rebuilt)

    # --- forward ------------------------------------------------------------------------------

    # [Note: forward wrapped, not hooked]
    # watch() puts its per-forward work in the DDP instance's `forward` (a plain function that
    # calls the one it replaced), not in forward hooks: any forward hook on a module sends
    # every call through nn.Module's slow path, which cost 4 us a step on torch's DDP
    # (training-thread CPU, 2 gloo ranks), more than watch's own work at its default level.
    # nn.Module.__call__ reads `self.forward`, so the wrapper runs after the user's forward
    # pre-hooks and before DDP's forward; close() restores the attribute.

    # A DDP driven by torch's composable replicate() (and so torchtitan) never runs its
    # forward: module hooks call its `_pre_forward`/`_post_forward`. watch() then wraps
    # `_pre_forward` instead; everything watch does after forward (the rebuild, which gradients
    # are bucket views) is settled once torch's `_pre_forward` returned.

    def _wrap_forward(self) -> None:
        ddp = self.ddp
        self._wrapped = "_pre_forward" if self._driven else "forward"
        inner = getattr(ddp, self._wrapped)
        self._forward = inner

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self._closed:
                return inner(*args, **kwargs)
            self._pre_forward(ddp, args)
            output = inner(*args, **kwargs)
            if self._post_needed:
                self._post_forward(ddp, args, output)
            return output

        self._own_forward = forward
        self._had_forward = self._wrapped in ddp.__dict__
        setattr(ddp, self._wrapped, forward)

    def _unwrap_forward(self) -> None:
        ddp = self.ddp
        wrapped = getattr(self, "_wrapped", "forward")
        if ddp.__dict__.get(wrapped) is not getattr(self, "_own_forward", None):
            return  # wrapped again on top: the wrapper passes through once closed
        if self._had_forward:
            setattr(ddp, wrapped, self._forward)
        else:
            del ddp.__dict__[wrapped]

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            return
        self._deliver()  # an error diagnosed after the last backward returned
        if self._abandoned:
            self._finish_abandoned()
        self.tap.step = self._forwards
        self._forwards += 1
        self._fired = set()
        if self.tap.enabled:
            self.tap.emit(ev.ForwardStarted)
        self.watchdog.heartbeat(self.tap.step, "forward")
        if self._light:
            self._arm(self._summary.policy.full(self.tap.step))
        if not self._rebuilt_seen and self.tap.step == self._rebuild_step() and \
                not self.ddp._has_rebuilt_buckets:
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
            self._summary.policy.note_rebuild(self.tap.step)
            self._read_buckets(rebuilt=True)
            if self._light:
                self._arm(True)
        if self._track_views:
            if torch.is_grad_enabled() and self.ddp.require_backward_grad_sync:
                self._grads_before = [p.grad for p in self.params]
        elif self._rebuilt_seen or self._rebuild_step() < 0:
            self._post_needed = False  # nothing left to look at after forward

    # --- backward -----------------------------------------------------------------------------

    def _begin_backward(self, task: int) -> None:
        if self._pending:  # a backward that raised before its final callbacks: never settled
            self._abandon(self._pending)
            self._pending = []
        self._task = task
        self._hooks_called = 0
        self._summary.begin(self.tap.step)
        if self._light:
            self._sync = bool(self.ddp.require_backward_grad_sync)
            self._left = [len(members) for members in self.buckets]
            self._next_launch = 0
        if self.tap.enabled:
            self.tap.emit(ev.BackwardStarted)
        torch.autograd.Variable._execution_engine.queue_callback(self._after_hooks)

    def _grad_ready(self, index: int, _param: torch.Tensor) -> None:
        task = _graph_task()
        if task != self._task and task != -1:
            self._begin_backward(task)
        summary = self._summary
        if not summary.per_param:  # See [Note: detail levels] (engine/detail.py)
            if self.tap.enabled:  # (nothing to summarize for: no event would carry it)
                summary.add(index, self._bucket_of.get(index, -1), self._nbytes[index])
            return
        self._fired.add(index)
        if self.tap.enabled:
            self.tap.emit(ev.GradReady, index, self._bucket_of.get(index, -1))

    # --- the light level: per-parameter hooks on sampled steps only, no comm hook ------------

    def _arm(self, on: bool) -> None:
        """Light: per-parameter hooks for this step (a sampled one) or none (the others).

        Tensor gradient hooks, not post-accumulate-grad hooks: a removed hook of either kind
        leaves its (empty) Python dict installed in C++, which every later backward still
        calls, with the GIL, once per parameter (measured: +0.2 us per parameter and backward,
        +90-200 us a backward at 500 parameters), and only a tensor's `_backward_hooks` can
        be reset to None, which uninstalls it. The hook runs just before the gradient is
        accumulated, right before torch's reducer sees it."""
        if on == bool(self._armed) or self._closed:
            return
        if not on:
            self._disarm()
            return
        self._fresh = [p for p in self.params if p._backward_hooks is None]
        self._armed = [p.register_hook(functools.partial(self._grad_ready_light, i))
                       for i, p in enumerate(self.params)]

    def _disarm(self) -> None:
        for h in self._armed:
            h.remove()
        self._armed = []
        for p in self._fresh:  # only dicts this watch created, and only if nobody added one
            if not p._backward_hooks:
                p._backward_hooks = None
        self._fresh = []

    def _grad_ready_light(self, index: int, _grad: torch.Tensor) -> None:
        # A parameter's gradient hook runs just before its AccumulateGrad node, whose post
        # hook is torch's reducer marking it ready: the bucket's last one is its BucketReady,
        # and torch launches ready buckets in index order.
        task = _graph_task()
        if task != self._task and task != -1:
            self._begin_backward(task)
        self._fired.add(index)
        if not self.tap.enabled:
            return
        b = self._bucket_of.get(index, -1)
        self.tap.emit(ev.GradReady, index, b)
        if b >= 0 and self._sync:
            self._left[b] -= 1
            if self._left[b] == 0:
                self._bucket_ready(b)

    def _bucket_ready(self, b: int) -> None:
        self._left[b] = 0
        self.tap.emit(ev.BucketReady, b)
        while self._next_launch < len(self._left) and not self._left[self._next_launch]:
            nbytes, dtype = self._bucket_meta[self._next_launch]
            self.tap.emit(ev.AllReduceLaunched, self._next_launch, nbytes, dtype)
            self._next_launch += 1

    def _light_finish(self) -> None:
        """Light, after torch's finalize_backward (which waited for every all-reduce): buckets
        torch marked ready itself (find_unused_parameters) are launched as of now, and every
        launched all-reduce is done."""
        if not self._sync or not self._left:
            return
        for b, left in enumerate(self._left):
            if left:
                self._bucket_ready(b)
        for b in range(self._next_launch):
            self.tap.emit(ev.AllReduceDone, b)
        self._left = []

    def _on_finding(self, step: int) -> None:
        summary = self.__dict__.get("_summary")
        if summary is not None:
            summary.note_finding(step)

    def _after_hooks(self) -> None:
        # Runs before torch's finalize_backward (queued when the last bucket is ready, after
        # this); queue the last word after it, and settle the all-reduces the reducer waits on.
        torch.autograd.Variable._execution_engine.queue_callback(self._after_reducer)
        try:
            self._check_unused()  # (warns: an error filter makes that raise)
        finally:
            pending, self._pending = self._pending, []
            self._settle(pending)

    def _check_unused(self) -> None:
        if not self._summary.per_param or self._steps_only or \
                not self.ddp.require_backward_grad_sync:
            return
        missing = [i for i in range(len(self.params)) if i not in self._fired
                   and self.params[i].requires_grad]
        if missing:
            names = tuple(self.names[i] for i in missing)
            if self.tap.enabled:
                self.tap.emit(ev.UnusedParametersFound, tuple(missing), names)
            if not self.ddp.find_unused_parameters and not self.ddp.static_graph:
                self._warn_unused(missing)

    def _after_reducer(self) -> None:
        self._task = -1
        if self._light:
            if self._learning:  # a sparse bucket: readable once a backward has run
                self._read_buckets(rebuilt=False)
            elif self.tap.enabled:
                self._light_finish()
        if self._learning and self.buckets:
            self._learning = False
            if self.tap.enabled:
                self.tap.emit(ev.BucketAssigned, tuple(tuple(b) for b in self.buckets),
                              tuple(-1 for _ in self.buckets), False)
        self._grads_before = None
        if self.tap.enabled:
            self.tap.emit(ev.BackwardFinished)
        self._deliver()

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
            fix=fix_for("unused_parameter"), world_size=self.world_size)
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
                _plain_wait_first(work)
                dog.wait(work, collective="buffer broadcast")
        try:
            broadcast_coalesced(tensors, self.group, src=0, chunk_bytes=int(
                getattr(self.ddp, "broadcast_bucket_size", 250 << 20)), tap=self.tap, wait=wait)
        except RuntimeError as exc:
            raise dog.failed(exc, collective="buffer broadcast") from exc
        if self.tap.enabled:
            self.tap.emit(ev.BuffersSynced, len(tensors),
                          sum(t.numel() * t.element_size() for t in tensors))

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
        try:
            fut, work = self._reduce(bucket, buffer)
        except RuntimeError as exc:  # a peer is gone already: the watchdog names it
            fut, work = torch.futures.Future(), None
            fut.set_exception(exc)
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

    def _reduce(self, bucket: dist.GradBucket, buffer: torch.Tensor
                ) -> tuple[torch.futures.Future, Any]:
        """The user's hook, or torch's default reduction (see the Note): its future, and the
        process group's work where watch launched the all-reduce itself (bounded waits)."""
        if self._user_hook is not None:
            return self._user_hook(self._user_state, bucket), None
        if torch.is_grad_enabled():  # backward(create_graph=True): record none of it
            with torch.no_grad():
                self._average(bucket, buffer)
        else:
            self._average(bucket, buffer)
        # What torch's C++ default hook does (reducer._run_allreduce_hook): a SUM all-reduce
        # of the bucket on the DDP's process group; here with its Work, for bounded waits.
        work = self.group.allreduce([buffer])
        return work.get_future(), work

    def _average(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> None:
        if buffer.is_sparse:
            buffer.div_(self.world_size)
        elif self._batched:
            if not self._all_views(bucket, buffer):
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

    def _all_views(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> bool:
        # batched_grad_copy: torch divides the bucket once after its batched copy, which only
        # happens when some gradient was not a bucket view yet.
        return self.ddp.gradient_as_bucket_view and all(self._was_view(bucket, buffer))

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

    # --- public -------------------------------------------------------------------------------

    @property
    def error(self) -> Exception | None:
        """The ddpviz error this rank raised or is about to raise (RankHangError), if any."""
        return self.watchdog.raised

    def close(self) -> None:
        """Remove the hooks (the comm hook stays registered, passing through: torch cannot
        remove one) and stop the watchdog thread."""
        self._closed = True
        _WATCHED.discard(self.ddp)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._disarm()
        self._unwrap_forward()

    def __repr__(self) -> str:
        return (f"<ddpviz.Watch rank {self.group.rank()}/{self.world_size}: {len(self.params)} "
                f"parameters, {len(self.buckets)} buckets, {self._forwards} forwards, "
                f"recording={self.recording}>")


def _logger(ddp: nn.parallel.DistributedDataParallel) -> Any:
    return ddp.logger


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


def _plain_wait_first(work: Any) -> None:
    """Wait for `work` up to _FIRST_WAIT in C++ (the GIL released, no Python callback, no store
    traffic); one still running, or failed, is then the watchdog's (`Watchdog.wait`, which
    returns at once for a completed one)."""
    with contextlib.suppress(RuntimeError):
        work.wait(_FIRST_WAIT)


def _graph_task() -> int:
    """The running backward's autograd graph task id (-1 outside backward)."""
    return torch._C._current_graph_task_id()


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
