"""`Watch`: what watch() does at every recording (parameters and bucket maps, the wrapped
forward, heartbeats, the guarded buffer broadcast and the bucket rebuild's meeting point, the
end-of-backward checks). A Watch is always one of its strategies, `HooklessWatch` (hookless.py)
or `GuardedWatch` (guarded.py), which `new_watch` (__init__.py) picks once from the recording;
the methods the strategies fill in do nothing here."""

from __future__ import annotations

import contextlib
import datetime
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddpviz import events as ev
from ddpviz.debugger import controller as debugger
from ddpviz.engine.broadcast import broadcast_coalesced
from ddpviz.engine.buckets import BucketCapacity, initial_buckets, rebuilt_buckets
from ddpviz.engine.buffer_identity import BufferIdentity
from ddpviz.engine.comm import LAUNCH, buffer_sync
from ddpviz.engine.compiler import keep_ddpviz_eager, not_observable
from ddpviz.engine.params import build_buffers, build_params_for_reducer
from ddpviz.events import Emitter, Tap
from ddpviz.findings import Finding, fix_for, warning_of
from ddpviz.probes import collective_check, collectives
from ddpviz.probes.nonfinite import NonfiniteCheck
from ddpviz.probes.optimizer_step import OptimizerStepTap
from ddpviz.probes.replicas import ReplicaCheck, replica_check
from ddpviz.probes.sync_contract import SYNCED, SyncContract, adopt
from ddpviz.probes.watchdog import Watchdog, resolve_hang_timeout
from ddpviz.recording import DetailPolicy, FindingObserver, GradSummary, Recording

_WATCHED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # DDPs with a live Watch

# an all-reduce still running after this plain wait goes to the watchdog's deadline
_FIRST_WAIT = datetime.timedelta(seconds=0.25)


class NotObservableError(RuntimeError):
    """watch() cannot observe this DDP (how it was built bypasses what ddpviz watches);
    `ddpviz record` then leaves it unwatched, saying why once."""

    PREFIX = "watch() cannot observe this DDP: "


class Watch:
    """ddpviz's observation of one torch DDP on this rank. Created by `watch` (as the strategy
    its recording picks: a subclass)."""

    def __init__(self, ddp: nn.parallel.DistributedDataParallel, *, emitter: Emitter | None,
                 hook: Callable[..., torch.futures.Future] | None, state: Any,
                 hang_timeout: float | None, recording: Recording,
                 names: list[str] | None = None, driven: bool = False,
                 where: str = "ddpviz.watch()") -> None:
        """`recording`: resolved (new_watch resolves and warns once); `names`: the parameters'
        dotted names when the DDP's module does not carry them (torch's composable replicate()
        wraps a ParameterList); `driven`: the DDP's `_pre_forward` is called directly
        (replicate()), never its forward; `where`: the place every rank meets first, as a
        missing rank's finding names it."""
        if type(self) is Watch:  # the strategies fill in what a recording observes
            raise TypeError("ddpviz: a Watch is made by ddpviz.watch(ddp), which picks the "
                            "strategy its recording needs.\nCall ddpviz.watch(ddp, ...) instead "
                            "of Watch(...).")
        self.recording = recording
        policy = DetailPolicy.of(self.recording)
        keep_ddpviz_eager()  # See [Note: ddpviz under torch.compile] (engine/compiler.py)
        unobservable = not_observable(ddp)
        if unobservable:
            raise NotObservableError(f"ddpviz: {NotObservableError.PREFIX}{unobservable}.")
        if ddp in _WATCHED:
            raise RuntimeError("ddpviz: this DDP is watched already (watch() was called on it "
                               "before).\nUse the Watch that call returned, or .close() it "
                               "first.")
        existing = list(getattr(ddp, "_comm_hooks", ()))
        self._refuse(hook, existing)
        self.ddp = ddp
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
        self._rebuilt_seen = False
        self._learning = False
        self._closed = False
        self._bucket_meta: list[tuple[int, str]] = []  # per bucket: bytes, dtype
        self._handles: list[Any] = []
        self._post_needed = True  # _post_forward has something to look at
        self._forward: Callable[..., Any] | None = None  # the DDP's forward, before watch's
        self._buffer_identity = BufferIdentity(self.group.rank(), self.world_size)
        self._lock = threading.Lock()
        self._plan_lock = threading.Lock()
        # armed with the per-parameter hooks: See [Note: optimizer-step tap]
        self._opt = OptimizerStepTap(self.tap, self.params)
        self._init_strategy()
        timeout = resolve_hang_timeout(hang_timeout, self.group)
        self.watchdog = Watchdog(self.group, timeout=timeout, tap=self.tap,
                                 stack_source=self.recording.stack_source)
        self.watchdog.start(where)
        # the job's own collectives, compared across ranks: See [Note: comparing histories]
        self._ledger = collective_check.start(self.tap)
        # See [Note: finding where a NaN starts] (probes/nonfinite.py)
        self._nf = NonfiniteCheck(self.params, self.names, self.group.rank(), self.world_size,
                                  self.tap, "guarded" if self.recording.guard else "hook-less")
        self._nf.local = not self.watchdog.add_pulse_task(self._nf.pulse)
        self._nf.on_change = self._replan
        # the debugger's safe points (ddpviz/debugger/): None unless launched for it; bucket
        # points only where a comm hook wraps each bucket's all-reduce (guard=True)
        self._debug = debugger.attach(
            ddp, self.params, self.names, self.tap, bucket_points=bool(self.recording.guard),
            kind="torch-guarded" if self.recording.guard else "torch-hookless")
        self._replicas: ReplicaCheck | None = replica_check(
            self.recording.replicas, self.watchdog.board, self.params, self.names,
            ddp.module, set(ddp.parameters_to_ignore),
            lambda: bool(ddp.broadcast_buffers), self.tap)
        if self._replicas is not None:
            self._replicas.on_change = self._replan
            self._replicas.synced = lambda: bool(ddp.require_backward_grad_sync)
        # See [Note: the gradient-sync contract] (probes/sync_contract.py): `ddpviz record`
        # made one at the DDP's construction; the guarded strategy feeds it from its own hooks
        source = self.recording.stack_source
        self._contract: SyncContract = adopt(ddp, self.tap, source=source,
                                             canaries=self._contract_canaries) or SyncContract(
            ddp, self.params, self.names, self.tap, world_size=self.world_size,
            canaries=self._contract_canaries, source=source)
        try:
            self._install(hook, state, existing)
        except BaseException:
            self.close()  # nothing of a failed attach stays on the DDP
            raise

    # --- what the strategies fill in ---------------------------------------------------------

    _nf_each_step = False  # the strategy checks local gradients on every step (guarded)
    _contract_canaries = True  # the sync contract needs hooks of its own (not guarded.py's)
    _armed: Any = ()  # (hookless.py) this step's per-parameter hooks
    _track_views = False  # the guarded strategy's gradient_as_bucket_view bookkeeping
    _grads_before: list[torch.Tensor | None] | None  # (guarded.py) .grad after the forward

    def _init_strategy(self) -> None:
        """The strategy's own state (before anything is installed)."""

    def _refuse(self, hook: Callable[..., torch.futures.Future] | None,
                existing: list[Any]) -> None:
        """Raise for a combination of hooks the strategy cannot run (before the first meeting)."""

    def _take_hook(self, hook: Callable[..., torch.futures.Future] | None, state: Any,
                   existing: list[Any]) -> None:
        """Take the user's comm hook (`hook=`, or one registered before watch())."""

    def _hook_params(self) -> None:
        """Per-parameter hooks installed once, at attach."""

    def _guard(self) -> None:
        """The hang guard of the backward's all-reduces, last."""

    def _settle_previous(self) -> None:
        """At a forward (grad enabled), before anything else: what the last backward left."""

    def _arm_step(self, step: int) -> None:
        """At a forward, after its heartbeat: per-parameter hooks for `step`."""

    def _on_rebuild(self) -> None:
        """The forward that rebuilt the buckets (its step is now full)."""

    def _backward_begins(self) -> None:
        """A backward starts (its first hook ran)."""

    def _backward_done(self) -> None:
        """After torch's reducer finished the backward, before BackwardFinished."""

    def _disarm(self) -> None:
        """Remove per-step hooks (close())."""

    def _nf_arm(self, step: int, now: bool) -> None:
        """After the forward of `step`: `now`, its local gradients must be checked (the
        output was non-finite here); tell the check whether they will be."""

    # --- attach -------------------------------------------------------------------------------

    def _install(self, hook: Callable[..., torch.futures.Future] | None, state: Any,
                 existing: list[Any]) -> None:
        ddp = self.ddp
        self._take_hook(hook, state, existing)
        self._emit_params()
        self._read_buckets(rebuilt=False)
        self._nbytes = [p.numel() * p.element_size() for p in self.params]
        self._hook_params()
        self._wrap_forward()
        if not hasattr(ddp, "buffer_hook") and len(getattr(ddp, "modules_buffers", ())) > 0:
            from torch.nn.parallel.distributed import _BufferCommHookLocation

            ddp._register_buffer_comm_hook(
                None, lambda state, buffers: self._sync_buffers(buffers),
                _BufferCommHookLocation.PRE_FORWARD)
        _WATCHED.add(ddp)
        self._guard()

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
            limits = self._caps(indices, rebuilt=rebuilt)
            if rebuilt:
                order = tuple(p for members in indices for p in members)
                self.tap.emit(ev.BucketsRebuilt, order)
            self.tap.emit(ev.BucketAssigned, tuple(tuple(b) for b in indices), limits, rebuilt)

    def _caps(self, indices: list[list[int]], *, rebuilt: bool) -> tuple[int, ...]:
        """Each bucket's byte cap (bucket_cap_mb, and DDP's first-bucket cap), as torch's
        constructor or rebuild used it: torch's assignment replayed with the DDP's settings
        (the twin's, exact) and kept where it gives the map torch built. () when it does not,
        or torch's settings cannot be read: the caps are then not recorded (never the sizes)."""
        try:
            ddp, config = self.ddp, self.ddp._bucket_config
            limits = BucketCapacity(config.bucket_bytes_cap, tuple(config.per_bucket_bytes_caps),
                                    config.first_bucket_bytes_cap).limits(
                find_unused_parameters=ddp.find_unused_parameters,
                static_graph=ddp.static_graph)
            if rebuilt:
                if limits.rebuild is None:
                    return ()
                order = [p for members in indices for p in members]
                _, buckets, caps = rebuilt_buckets(self.params, order, limits.rebuild,
                                                   self._sparse, limits.set_last_bucket_cap)
            else:
                _, buckets, caps = initial_buckets(self.params, limits.initial, self._sparse)
        except Exception:  # another torch's attributes: the caps are left out, never guessed
            return ()
        if [list(b) for b in buckets] != indices:
            return ()
        return tuple(int(c) for c in caps)

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

        watchdog, tap, nf, replicas = self.watchdog, self.tap, self._nf, self._replicas
        # both made before the wrapper and kept for the watch's life: held here, not looked up
        pulse, nf_open = watchdog.pulse, nf.open_steps
        grad_enabled = torch.is_grad_enabled
        mark = collectives.step_marker(self.group)  # See [Note: the step mark's hot path]
        contract = self._contract
        # the every-step output sum (hook-less): See [Note: every step, one hook a bucket]
        each = None if self._driven else self.__dict__.get("_buckets_nf")
        budget: Any = None if each is None else each.budget
        driven = self._driven  # (its wrapper returns before the module's forward runs)
        debug = self._debug

        def forward(*args: Any, **kwargs: Any) -> Any:
            step = self._forwards
            if debug is not None and grad_enabled():  # a safe point: before any collective
                debug.forward(step)
            # See [Note: plain steps]
            if step < self._plain_until and grad_enabled() and not watchdog.failing and (
                    pulse is None or (pulse.error is None and not pulse.alerted)):
                self._forwards = step + 1
                tap.step = watchdog.step = step
                watchdog.phase = "forward"
                mark(step)
                if replicas is not None:
                    replicas.latest = step
                if tap.enabled:
                    tap.emit(ev.ForwardStarted)
                if pulse is not None:
                    pulse.beat(step, "forward")
                # two calls inlined: See [Note: the plain wrapper's calls]
                if ddp.require_backward_grad_sync:  # (SyncContract.forward(True))
                    contract.last, contract.dirt = SYNCED, None
                else:
                    contract.forward(False)
                output = inner(*args, **kwargs)
                if pulse is not None and not driven:  # its forward returned: See [Note: a
                    pulse.beat(step, "backward")  # rank still in its forward] (quiet.py)
                nf.last = step
                if each is not None and budget.due(step):  # (the rest of each.output's)
                    each.output(step, output)
                if debug is not None:
                    debug.after_forward(step, output)
                return output
            if self._closed:
                return inner(*args, **kwargs)
            grad = grad_enabled()
            self._pre_forward(ddp, args)
            output = inner(*args, **kwargs) if grad else evaluation(inner, args, kwargs)
            if self._post_needed:
                self._post_forward(ddp, args, output)
            if grad:  # (the step _pre_forward counted)
                step = tap.step
                if pulse is not None and not driven:
                    pulse.beat(step, "backward")
                if each is not None:
                    each.output(step, output)
                if step >= nf.quiet_from and step % nf.output_every and not nf_open \
                        and not self._nf_each_step and not self._armed:
                    nf.last = step  # the usual step: See NonfiniteCheck.quiet_from
                else:
                    self._nf_arm(step, nf.forward(step, None if self._driven else output,
                                                  armed=bool(self._armed)))
                if self._plain_steps:
                    self._plan(step + 1)
                if debug is not None:
                    debug.after_forward(step, output)
            return output

        def evaluation(inner: Callable[..., Any], args: Any, kwargs: Any) -> Any:
            # a forward without gradients: its buffer broadcast reads as an evaluation's (See
            # [Note: an evaluation on some ranks only], probes/collective_check.py)
            LAUNCH.evaluating = True
            try:
                return inner(*args, **kwargs)
            finally:
                LAUNCH.evaluating = False

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
        # Every forward comes here, on the training thread, cold (the step's torch work has
        # evicted it from the caches): ~11 us a step (2 gloo ranks, ~10k parameters, thread
        # CPU time around this call) against 0.9 us in a warm timeit loop. Fewer statements
        # here measured no gain (benchmarks/bench_watch_parts.py takes the default apart).
        self._settle_previous()
        # (read before the module runs: Lightning's manual optimization turns it off inside)
        self._contract.forward(bool(self.ddp.require_backward_grad_sync))
        tap = self.tap
        step = tap.step = self._forwards
        self._forwards = step + 1
        if self._fired:
            self._fired = set()
        replicas = self._replicas
        if replicas is not None:  # See [Note: replica digests] (probes/replicas.py)
            replicas.before_forward(step, self.ddp.will_sync_module_buffers)
        if tap.enabled:
            tap.emit(ev.ForwardStarted)
        self.watchdog.heartbeat(step, "forward")
        collectives.mark_ddp_step(self.group, step)
        self._arm_step(step)
        if not self._rebuilt_seen and step == self._rebuild_step() and \
                not self.ddp._has_rebuilt_buckets:
            # torch rebuilds the buckets in this forward with a blocking broadcast that ddpviz
            # cannot guard: meet first, so a rank that never comes is named instead.
            self.watchdog.exchange("rebuild", "", f"the bucket rebuild at step {step}")

    def _rebuild_step(self) -> int:
        if self.ddp.static_graph:
            return 2
        return -2 if self.ddp.find_unused_parameters else 1

    # [Note: plain steps]
    # Most forwards under the default recording are plain: nothing is armed, checked or
    # captured, and watch() only counts the step, posts the heartbeat and (recording) emits
    # ForwardStarted. _pre_forward's questions (is the step sampled, is a replica check due,
    # is the NaN check precise, is it the rebuild step...) cost ~10 us a step, cold, at steps
    # of ~0.5 ms. So after each full forward, `_plan` asks every part for how long the steps
    # stay plain (their `plain_until`: the sampling policy, the replica check, the NaN check,
    # the heartbeat's every-64th-step stack note) and the wrapper runs the steps before
    # `_plain_until` on the short path. What changes that from another thread (a finding,
    # the replica check's every-step window, a peer's non-finite step) calls `_replan`, which
    # voids the window under the same lock `_plan` writes it under, so a stale plan never
    # overwrites the void; the heartbeat's alert and error flags are read on every step.

    # [Note: the plain wrapper's calls]
    # Each Python call on a plain step meets the training thread cold (~1-4 us where a warm
    # loop measures 0.1-0.3). The wrapper inlines the two that are one line on the usual step:
    # the contract's synced forward (SyncContract.forward(True): two attribute writes) and the
    # NaN check's skipped step (its budget says the step is not checked: BucketCheck.output
    # is not called). benchmarks/bench_plain_calls.py counts ddpviz's Python calls and lines
    # a plain step (exact counts, unlike times on a shared machine).

    _plain_steps = False  # the strategy may run plain steps (hookless.py)
    _plain_until = 0

    def _plan(self, step: int) -> None:
        with self._plan_lock:
            self._plain_until = self._plain_end(step)

    def _replan(self) -> None:
        with self._plan_lock:
            self._plain_until = 0

    def _plain_end(self, step: int) -> int:
        """The first step from `step` on that is not plain (`step`: none is)."""
        if self._closed or self._armed or self._post_needed or self._fired or step < 3 or (
                not self._rebuilt_seen and self._rebuild_step() >= step):
            return step
        end = min(self._arm_plain_until(step), self._nf.plain_until(step),
                  -(-step // 64) * 64)  # (the heartbeat's stack note: probes/watchdog.py)
        replicas = self._replicas
        return end if replicas is None else min(end, replicas.plain_until(step))

    def _arm_plain_until(self, step: int) -> int:
        """The strategy's first step from `step` on that arms per-parameter hooks."""
        return step

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._rebuilt_seen and getattr(self.ddp, "_has_rebuilt_buckets", False):
            self._rebuilt_seen = True
            self._summary.policy.note_rebuild(self.tap.step)
            self._read_buckets(rebuilt=True)
            self._on_rebuild()
        if self._track_views:
            if torch.is_grad_enabled() and self.ddp.require_backward_grad_sync:
                self._grads_before = [p.grad for p in self.params]
        elif self._rebuilt_seen or self._rebuild_step() < 0:
            self._post_needed = False  # nothing left to look at after forward

    # --- backward -----------------------------------------------------------------------------

    def _begin_backward(self, task: int) -> None:
        self._task = task
        self._summary.begin(self.tap.step)
        self._backward_begins()
        if self.tap.enabled:
            self.tap.emit(ev.BackwardStarted)
        torch.autograd.Variable._execution_engine.queue_callback(self._after_hooks)

    def _on_finding(self, step: int) -> None:
        summary = self.__dict__.get("_summary")
        if summary is not None:
            summary.note_finding(step)
            self._replan()

    def _after_hooks(self) -> None:
        # Runs before torch's finalize_backward (queued when the last bucket is ready, after
        # this); queue the last word after it (guarded.py then settles the all-reduces the
        # reducer waits on).
        torch.autograd.Variable._execution_engine.queue_callback(self._after_reducer)
        self._check_unused()  # (warns: an error filter makes that raise)

    def _check_unused(self) -> None:
        if not self._summary.per_param or not self.ddp.require_backward_grad_sync:
            return
        if self._contract.last != SYNCED:
            return  # no synced forward of this DDP since the last step: not its backward
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
        self._backward_done()
        if self._replicas is not None:
            self._replicas.after_backward(self.tap.step, bool(self.ddp.require_backward_grad_sync))
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
            fix=fix_for("unused_parameter"), world_size=self.world_size)
        # The iteration is broken: ranks that used the parameter wait for this bucket forever,
        # and torch fails at the next forward. Post it, so waiting ranks stop now, named.
        self.watchdog.fail(finding.text(), [finding])
        warnings.warn(warning_of(finding), stacklevel=2)

    def _sync_buffers(self, buffers: dict[str, torch.Tensor]) -> None:
        # torch's own buffer sync (a coalesced broadcast from rank 0 before forward), with the
        # watchdog's deadline: a rank that never comes to this forward is named, not waited for.
        for finding in self._buffer_identity.check(buffers, self.tap.step):
            if self.tap.enabled:
                self.tap.emit(ev.FindingReported, finding)
            warnings.warn(warning_of(finding), stacklevel=2)
        tensors = list(buffers.values())
        dog = self.watchdog
        wait = None
        if dog.board is not None:
            def wait(work: Any) -> None:
                _plain_wait_first(work)
                dog.wait(work, collective="buffer broadcast")
        try:
            with buffer_sync(LAUNCH.evaluating):  # (for the ledger)
                broadcast_coalesced(tensors, self.group, src=0, chunk_bytes=int(
                    getattr(self.ddp, "broadcast_bucket_size", 250 << 20)), tap=self.tap,
                    wait=wait)
        except RuntimeError as exc:
            raise dog.failed(exc, collective="buffer broadcast") from exc
        if self.tap.enabled:
            self.tap.emit(ev.BuffersSynced, len(tensors),
                          sum(t.numel() * t.element_size() for t in tensors))
        if self._replicas is not None:
            self._replicas.after_buffer_sync()

    # --- public -------------------------------------------------------------------------------

    @property
    def replicas(self) -> ReplicaCheck | None:
        """This DDP's replica check, or None when it is off (docs/replicas.md); rank 0's
        `.findings` lists what it reported."""
        return self._replicas

    @property
    def error(self) -> Exception | None:
        """The ddpviz error this rank raised or is about to raise (RankHangError), if any."""
        return self.watchdog.raised

    def close(self) -> None:
        """Remove the hooks (the comm hook stays registered, passing through: torch cannot
        remove one) and stop the threads: the replica check's, and the heartbeat's within
        pulse.CLOSE_GRACE_S (it composes the other ranks' last NaN-check posts until then)."""
        self._closed = True
        if self.__dict__.pop("_ledger", False):
            collective_check.release()
        if "_plan_lock" in self.__dict__:
            self._replan()
        nf = self.__dict__.get("_nf")
        if nf is not None:
            nf.close()
        _WATCHED.discard(self.ddp)
        replicas = self.__dict__.get("_replicas")
        if replicas is not None:
            replicas.close()
        dog = self.__dict__.get("watchdog")
        if dog is not None:
            dog.close()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._disarm()  # (a strategy's per-step hooks)
        opt = self.__dict__.get("_opt")
        if opt is not None:
            opt.disarm()
        contract = self.__dict__.get("_contract")
        if contract is not None:
            contract.close()
        self._unwrap_forward()

    def __repr__(self) -> str:
        return (f"<ddpviz.Watch rank {self.group.rank()}/{self.world_size}: {len(self.params)} "
                f"parameters, {len(self.buckets)} buckets, {self._forwards} forwards, "
                f"recording={self.recording}>")


def _logger(ddp: nn.parallel.DistributedDataParallel) -> Any:
    return ddp.logger

def _plain_wait_first(work: Any) -> None:
    """Wait for `work` up to _FIRST_WAIT in C++ (the GIL released, no Python callback, no store
    traffic); one still running, or failed, is then the watchdog's (`Watchdog.wait`, which
    returns at once for a completed one)."""
    with contextlib.suppress(RuntimeError):
        work.wait(_FIRST_WAIT)


def _graph_task() -> int:
    """The running backward's autograd graph task id (-1 outside backward)."""
    return torch._C._current_graph_task_id()
