"""The reducer (walk-through steps 4-6): one hook per parameter, flat bucket buffers, an async
all-reduce per ready bucket in bucket order, the wait and write-back at the end of backward, and
the one-time rebuild of buckets in gradient-ready order. A Python twin of torch 2.13's C++
`Reducer`; see [Note: reducer timeline] for when each piece runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ddpviz.engine import failure_texts as texts
from ddpviz.engine.bucket_views import (
    Bucket,
    allocate,
    clone_obey_contract,
    is_alias_of,
    layout_view,
    make_bucket,
    release,
)
from ddpviz.engine.buckets import Limits, rebuilt_buckets
from ddpviz.engine.comm import LAUNCH, GradBucket, allreduce_sum, hook_result
from ddpviz.engine.forward import unused_parameters
from ddpviz.engine.logger import DDPLogger
from ddpviz.engine.observers import DebugObserver, Guard, NonfiniteObserver
from ddpviz.engine.params import ParamEntry
from ddpviz.errors import (
    TORCH_GRAPH_CHANGED,
    GradientGraphError,
    UnusedParametersError,
    torch_unfinished_reduction,
)
from ddpviz.events import (
    PHASE_OF_COLLECTIVE,
    AllReduceDone,
    AllReduceLaunched,
    BackwardFinished,
    BackwardStarted,
    BucketAssigned,
    BucketReady,
    BucketsRebuilt,
    Collective,
    FindingReported,
    GradReady,
    Tap,
    UnusedParametersFound,
)
from ddpviz.findings import Finding, Kind, fix_for
from ddpviz.recording import DetailPolicy, GradSummary

# [Note: reducer timeline]
# construction: buckets from the constructor's map; a post hook on every parameter's
#   AccumulateGrad node (it fires once per backward, after the gradient is accumulated, even
#   when the incoming gradient is undefined -- which is why it is not a tensor hook).
# forward (DDP.forward): prepare_for_forward (counts synced iterations), rebuild_buckets
#   (once, before the 2nd synced forward; before the 3rd with static_graph), then after the
#   module ran, prepare_for_backward (arms the hooks; with find_unused_parameters the graph walk).
# backward: each hook copies its gradient into its bucket (scaled by 1/world_size unless a comm
#   hook is registered); a bucket whose last gradient arrived is launched only when every bucket
#   before it was launched; after the last one (find_unused_parameters) the used-parameter map
#   is all-reduced. At the end of the autograd graph task: wait for every bucket in order and
#   write the results back to param.grad.
# static_graph, iteration 0: the hooks only count; one callback at the end of backward fills
#   every bucket and reduces them all (used map first), then finalizes.
# torch only queues its end-of-backward callback once every bucket is launched, so a backward
# that misses a parameter just returns; here the callback is queued by the first hook, which
# lets the first synced iteration detect missing gradients. See [Note: missing gradients].

# [Note: missing gradients]
# find_unused_parameters=False and a parameter gets no gradient: torch leaves the iteration
# unfinished (the buckets holding it are never reduced, gradients stay local) and fails at the
# next forward. Here the end of the first synced backward notices, reduces the remaining buckets
# (the missing slots hold zeros, so ranks that did see every gradient are not left waiting),
# writes the results back, emits UnusedParametersFound and raises UnusedParametersError. Later
# iterations fail at the next forward, like torch, but name the parameters.
# DDPVIZ_UNUSED_ERROR_AT=forward holds the first iteration's error until the next forward too
# (where torch raises it; code and tests written against torch's timing expect that), after
# the same reduction and diagnosis.

ENV_UNUSED_ERROR_AT = "DDPVIZ_UNUSED_ERROR_AT"


def unused_error_at() -> str:
    """When the first synced backward's missing gradients raise: "backward" (default: at its
    end) or "forward" (at the next forward, as torch does), from DDPVIZ_UNUSED_ERROR_AT."""
    value = os.environ.get(ENV_UNUSED_ERROR_AT, "").strip() or "backward"
    if value not in ("backward", "forward"):
        raise ValueError(
            f"ddpviz: {ENV_UNUSED_ERROR_AT}={value!r} is not a place to raise at: expected "
            "'backward' (the default: the end of the first backward that missed a gradient) "
            "or 'forward' (the next forward, as torch does).\nSet one of them, or unset it.")
    return value

_UNSET = -1  # div factor not yet known for this backward

log = logging.getLogger(__name__)


def _profiled(name: str) -> Any:
    """torch's reducer's profiler range `name`; nothing at all when no profiler runs."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.autograd.profiler.record_function(name)
    return contextlib.nullcontext()


class Reducer:
    """Reduces gradients of `params` across `process_group` in buckets, like torch's Reducer.

    Args:
        params: the parameters to reduce (engine.params.build_params_for_reducer).
        bucket_indices: parameter indices per bucket, in reduction order.
        bucket_limits: each bucket's size limit (bytes), for events and logging.
        process_group: the group gradients are averaged over.
        limits: the capacity rules (the rebuild uses `limits.rebuild`).
        find_unused_parameters, gradient_as_bucket_view, skip_all_reduce_unused_params,
        batched_grad_copy, lazy_bucket_allocation: as in DistributedDataParallel.
        tap: where events go.
        detail: which steps get a GradReady per parameter and which a GradsSummarized per
            bucket (recording.py; default: every step in full).
        watchdog: names lagging or missing ranks in collectives (None: plain waits; See
            [Note: twin and probes] in observers.py).
        logger: builds the logging-data collector from this reducer (torch's c10d Logger).
    """

    # called at the end of each finalize_backward, the reduced gradients in .grad (the DDP's
    # replica check; See [Note: replica digests] in probes/replicas.py)
    after_finalize: Callable[[], None] | None = None

    def __init__(self, params: Sequence[ParamEntry], bucket_indices: list[list[int]],
                 bucket_limits: list[int], process_group: dist.ProcessGroup, *, limits: Limits,
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
                 skip_all_reduce_unused_params: bool = False, batched_grad_copy: bool = False,
                 lazy_bucket_allocation: bool = False, tap: Tap | None = None,
                 watchdog: Guard | None = None,
                 logger: Callable[[Reducer], DDPLogger] = DDPLogger,
                 detail: DetailPolicy | None = None) -> None:
        self.entries = list(params)
        self.params = [e.param for e in self.entries]
        self.names = [e.name for e in self.entries]
        self.sparse_flags = [e.sparse_grad for e in self.entries]
        self.process_group = process_group
        self.limits = limits
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.skip_all_reduce_unused_params = skip_all_reduce_unused_params
        self.batched_grad_copy = batched_grad_copy
        self.lazy_bucket_allocation = lazy_bucket_allocation
        # torch 2.15's manual backward finalization: the end of backward leaves the reduced
        # gradients to finalize_backward_manual() (DistributedDataParallel.finalize_backward)
        self.manual_finalization = False
        self.tap = tap if tap is not None else Tap()
        # See [Note: detail levels] (recording.py).
        self.summary = GradSummary(detail if detail is not None else DetailPolicy("full"),
                                   self.tap)
        self._param_bytes = [e.param.numel() * e.param.element_size() for e in self.entries]
        self.static_graph = False
        self.comm_hook: Callable[[Any, GradBucket], torch.futures.Future] | None = None
        self.comm_hook_state: Any = None
        self.mixed_precision_param_dtype: torch.dtype | None = None
        self._lock = threading.RLock()

        self.buckets: list[Bucket] = []
        self.bucket_limits: list[int] = []
        self.locators: list[tuple[int, int]] = []
        self.initialize_buckets(bucket_indices, bucket_limits)

        # Per-iteration accounting (names follow torch's reducer.hpp).
        self.expect_autograd_hooks = False
        self.require_finalize = False
        # An UnusedParametersError of the first synced backward, held until the next forward
        # under DDPVIZ_UNUSED_ERROR_AT=forward (torch's timing). See [Note: missing gradients].
        self.deferred_error: UnusedParametersError | None = None
        self._defer_unused = unused_error_at() == "forward"
        self.next_bucket = 0
        self.has_marked_unused_parameters = False
        self.unused_parameters: list[int] = []
        self.per_iteration_ready: set[int] = set()
        self.grad_ready_order: list[int] = []
        self.num_iterations = 0
        # Distinct backward passes (counted at their first hook, as torch's num_bwd_calls_):
        # static_graph's "first iteration" is the first backward, however many forwards fed it.
        self.num_bwd_calls = 0
        self.graph_static = True  # see _ddp_graph_static
        self._prev_unused: list[int] = []
        self.num_buckets_ready = 0
        self.num_buckets_reduced = 0
        self.first_autograd_hook_called = False
        self.div_factor = _UNSET
        self.forward_work: tuple[Any, bool] | None = None  # join: (work, divide by initial size)
        self.installed_futures: list[torch.futures.Future] = []
        # Rebuild (once): gradient-ready order of the first synced iteration(s).
        self.has_rebuilt_bucket = False
        self.rebuilt_param_indices: list[int] = []
        self.rebuilt_bucket_indices: list[list[int]] | None = None
        # find_unused_parameters / static_graph: which parameters were used, as ints (CPU side).
        self.local_used: list[int] | None = None
        self.local_used_dev: torch.Tensor | None = None
        self.local_used_work: Any = None
        self.local_used_reduced = False
        # static_graph: how many times each hook fires in one backward (learnt in iteration 0).
        self.hooks_per_iteration: dict[int, int] = {i: 0 for i in range(len(self.params))}
        self.hooks_left: dict[int, int] = {}
        # Missing-gradient check of the first synced iteration. See [Note: missing gradients].
        self.checked_first_iteration = False
        self.unreachable: list[int] | None = None
        self._end_callback_queued = False
        self._stride_warned = False
        self._warned_all_used = False
        self._drain_sparse: dict[int, torch.Tensor] = {}  # see _fail_missing_gradients
        self.logger: DDPLogger = logger(self)  # reads this reducer's buckets and counters
        self.watchdog = watchdog
        self.nonfinite: NonfiniteObserver | None = None  # the DDP's NaN check, if any
        self.debug: DebugObserver | None = None  # the debugger's safe points, if any
        if find_unused_parameters:
            self._initialize_local_used_map()

        self.grad_accumulators: list[Any] = []
        self.hook_handles: list[Any] = []
        self._register_hooks()

    # --- buckets --------------------------------------------------------------------------

    def initialize_buckets(self, bucket_indices: list[list[int]], limits: list[int]) -> None:
        """(Re)build bucket buffers and views for this map (reduction order)."""
        n = len(self.params)
        seen = [False] * n
        buckets: list[Bucket] = []
        locators: list[tuple[int, int]] = [(-1, -1)] * n
        for b, indices in enumerate(bucket_indices):
            if not indices:
                raise ValueError(texts.empty_bucket(b))
            for i in indices:
                if not 0 <= i < n or seen[i]:
                    raise ValueError(texts.bad_bucket_index(b, i, n))
                seen[i] = True
            limit = limits[b] if b < len(limits) else 0
            buckets.append(make_bucket(
                b, indices, limit, self.params, self.names, self.sparse_flags,
                dtype=self.mixed_precision_param_dtype,
                gradient_as_bucket_view=self.gradient_as_bucket_view))
            for intra, i in enumerate(indices):
                locators[i] = (b, intra)
        missing = [i for i in range(n) if not seen[i]]
        if missing:
            raise ValueError(texts.unbucketed_parameters(missing, self.names[missing[0]]))
        self.buckets, self.locators = buckets, locators
        self.bucket_limits = [limits[b] if b < len(limits) else 0 for b in range(len(buckets))]

    def bucket_indices(self) -> list[list[int]]:
        """The map in force: parameter indices per bucket, reduction order."""
        return [list(b.variables) for b in self.buckets]

    # --- hooks ----------------------------------------------------------------------------

    def _register_hooks(self) -> None:
        ref = weakref.ref(self)
        for index, p in enumerate(self.params):
            with torch.enable_grad():
                acc: Any = p.view_as(p).grad_fn.next_functions[0][0]  # type: ignore[union-attr]

            def hook(grad_inputs: Any, grad_outputs: Any, index: int = index) -> None:
                reducer = ref()
                if reducer is not None:
                    reducer.autograd_hook(index)

            self.grad_accumulators.append(acc)  # keeps the node (and its hook) alive
            self.hook_handles.append(acc.register_hook(hook))

    def unhooked(self, indices: Sequence[int]) -> list[int]:
        """Which of these parameters no longer accumulate through the node the hook is on.

        `param.set_(t)` (and `param.data = t` with another dtype or device) after construction
        gives the parameter a new AccumulateGrad node: its gradient is still computed, but no
        hook of this reducer fires for it (torch's reducer loses its hook the same way, and says
        "Expected to have finished reduction"). Read on the error path only."""
        out = []
        for i in indices:
            p = self.params[i]
            with torch.enable_grad():
                acc = p.view_as(p).grad_fn.next_functions[0][0]  # type: ignore[union-attr]
            if acc is not self.grad_accumulators[i]:
                out.append(i)
        return out

    def remove_autograd_hooks(self) -> None:
        """Detach every hook this reducer registered."""
        for h in self.hook_handles:
            h.remove()
        self.hook_handles.clear()

    def autograd_hook(self, index: int) -> None:
        """Parameter `index`'s gradient was accumulated (or its node ran with no gradient)."""
        with self._lock:
            if not self.first_autograd_hook_called:
                self.first_autograd_hook_called = True
                self.num_bwd_calls += 1
                if self.expect_autograd_hooks and self.tap.enabled:
                    self.tap.emit(BackwardStarted)
            # Usage is recorded even under no_sync (before the expect check, as torch does): a
            # parameter used only in accumulated micro-batches still counts as used. Only when
            # .grad exists: an undefined gradient must not be reduced.
            used_map = self._dynamic_find_unused() or self._static_first_iteration()
            if used_map and self.params[index].grad is not None:
                assert self.local_used is not None
                self.local_used[index] = 1
            if self._static_first_iteration():
                self.hooks_per_iteration[index] += 1
                return
            if not self.expect_autograd_hooks:
                return  # no_sync, or a second backward after this iteration was finalized
            self.grad_ready_order.append(index)
            self._queue_end_of_backward()
            if not self.has_marked_unused_parameters:
                self.has_marked_unused_parameters = True
                for u in self.unused_parameters:
                    self._mark_variable_ready(u)
            if self._static_after_first_iteration():
                left = self.hooks_left.get(index, 0)
                if left <= 0:
                    message = texts.graph_changed(index, self.names[index])
                    # The backward stops here, unfinished: the next forward says so too, in
                    # torch's words (ensure_prior_reduction_finished), as torch's reducer does.
                    self.require_finalize = True
                    raise self._fail(message, "graph_changed", index, "static_graph",
                                     f"parameter {index} '{self.names[index]}' joined the graph "
                                     f"at step {self.tap.step} on rank "
                                     f"{self.process_group.rank()} although static_graph=True",
                                     torch_text=TORCH_GRAPH_CHANGED)
                self.hooks_left[index] = left - 1
                if left - 1 > 0:
                    return
            if self.should_rebuild_buckets():
                self.rebuilt_param_indices.append(index)
            if self.tap.enabled:
                if self.summary.per_param:
                    self.tap.emit(GradReady, index, self.locators[index][0])
                else:
                    self.summary.add(index, self.locators[index][0], self._param_bytes[index])
            self._mark_variable_ready(index)

    def note_finding(self, step: int) -> None:
        """A finding was reported at `step`: see GradSummary.note_finding (recording.py)."""
        self.summary.note_finding(step)

    def _queue_end_of_backward(self) -> None:
        if not self._end_callback_queued:
            self._end_callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    # --- marking ready --------------------------------------------------------------------

    def _mark_variable_ready(self, index: int) -> None:
        if index in self.per_iteration_ready:
            message = texts.marked_twice(index, self.names[index])
            raise self._fail(message, "hook_fired_twice", index, "hook",
                             f"parameter {index} '{self.names[index]}' was marked ready twice "
                             f"at step {self.tap.step} on rank {self.process_group.rank()}")
        self.per_iteration_ready.add(index)
        self.require_finalize = True
        b, _ = self.locators[index]
        bucket = self.buckets[b]
        self._set_divide_factor()
        if self.lazy_bucket_allocation and not bucket.sparse and \
                bucket.pending == len(bucket.variables):
            allocate(bucket, adopt_grads=self.gradient_as_bucket_view and
                     self.mixed_precision_param_dtype is None)
        if bucket.sparse:
            self._mark_ready_sparse(index)
        else:
            self._mark_ready_dense(index)
        bucket.pending -= 1
        if bucket.pending == 0:
            self._bucket_filled(b, bucket)
            self._mark_bucket_ready(b)
        if self.next_bucket == len(self.buckets) and self._dynamic_find_unused():
            self._all_reduce_local_used_map()

    def _bucket_filled(self, b: int, bucket: Bucket) -> None:
        """Every gradient of bucket `b` is in: finish a batched copy, then say the bucket is
        ready (after its summary, on the steps that summarize)."""
        if self.batched_grad_copy and not bucket.sparse:
            self._flush_batched(bucket)
        if self.tap.enabled:
            if not self.summary.per_param:
                self.summary.emit(b)
            self.tap.emit(BucketReady, b)

    def _mark_ready_dense(self, index: int) -> None:
        b, intra = self.locators[index]
        bucket = self.buckets[b]
        view = bucket.views_in[intra]
        p = self.params[index]
        grad = p.grad
        with torch.no_grad():
            if grad is None:
                view.zero_()
                return
            self._check_grad_layout(index, grad, view)
            if is_alias_of(grad, view):
                if self.comm_hook is None and not self.batched_grad_copy:
                    view.div_(self.div_factor)
                return
            if self.batched_grad_copy:
                bucket.deferred.append((intra, grad))
            elif self.comm_hook is None:
                with _profiled("torch::distributed::reducer::mul_out"):
                    if not grad.requires_grad:
                        # Divide while copying: one pass over the gradient. Multiplying by the
                        # reciprocal (not dividing) is what makes results bitwise equal to
                        # torch.
                        torch.mul(grad, 1.0 / self.div_factor, out=view)
                    else:
                        view.copy_(torch.mul(grad, 1.0 / self.div_factor))
            else:
                view.copy_(grad)
            if self.gradient_as_bucket_view and self.mixed_precision_param_dtype is None:
                p.grad = view

    def _flush_batched(self, bucket: Bucket) -> None:
        # batched_grad_copy: one foreach copy of the gradients that were not bucket views yet,
        # then one flat division of the whole bucket (a true division, so the results differ
        # from the per-gradient multiply in the last bit, as in torch). The division runs even
        # when nothing was copied: gradients that already are bucket views (zero_grad with
        # set_to_none=False) are not divided where they are marked ready under batched copy.
        with torch.no_grad():
            if bucket.deferred:
                views = [bucket.views_in[intra] for intra, _ in bucket.deferred]
                torch._foreach_copy_(views, [g for _, g in bucket.deferred])
            if self.comm_hook is None:
                bucket.gradients.div_(self.div_factor)
        bucket.deferred.clear()

    def _mark_ready_sparse(self, index: int) -> None:
        b, _ = self.locators[index]
        bucket = self.buckets[b]
        grad = self.params[index].grad
        if grad is None and index in self._drain_sparse:
            bucket.gradients = self._drain_sparse[index]
            return
        if grad is None:
            raise RuntimeError(texts.sparse_gradient_missing(index, self.names[index]))
        if grad.layout != torch.sparse_coo:
            raise RuntimeError(texts.sparse_gradient_dense(index, self.names[index],
                                                           grad.layout))
        # The bucket *is* the gradient: results land in param.grad with no copy back.
        bucket.gradients = grad
        if self.comm_hook is None:
            with torch.no_grad():
                grad.div_(self.div_factor)

    def _check_grad_layout(self, index: int, grad: torch.Tensor, view: torch.Tensor) -> None:
        expected = self.mixed_precision_param_dtype or view.dtype
        if grad.dtype != expected:
            raise RuntimeError(texts.gradient_dtype(index, self.names[index], grad.dtype,
                                                    expected))
        if grad.stride() != view.stride() and not self._stride_warned:
            self._stride_warned = True
            warnings.warn(texts.gradient_strides(index, self.names[index], grad.stride(),
                                                 view.stride()), stacklevel=2)

    def _set_divide_factor(self) -> None:
        if self.div_factor != _UNSET:
            return
        self.div_factor = self.process_group.size()
        if self.forward_work is not None:
            work, static_world_size = self.forward_work
            if not static_world_size:
                work.wait()
                self.div_factor = int(work.get_future().value()[0].item())

    # --- launching ------------------------------------------------------------------------

    def _mark_bucket_ready(self, b: int) -> None:
        if b > self.next_bucket:
            return  # buckets are reduced strictly in order; an earlier one is still filling
        while self.next_bucket < len(self.buckets) and \
                self.buckets[self.next_bucket].pending == 0:
            self.num_buckets_ready += 1
            if self.num_buckets_ready == 1 and self.logger is not None:
                self.logger.backward_comm_start = self.logger.now()
            bucket = self.buckets[self.next_bucket]
            if self._should_skip(bucket):
                bucket.skipped = True
            else:
                self._all_reduce_bucket(self.next_bucket, self.next_bucket)
                self.num_buckets_reduced += 1
            self.next_bucket += 1

    def _should_skip(self, bucket: Bucket) -> bool:
        # skip_all_reduce_unused_params: a bucket none of whose parameters was used here.
        if not self.skip_all_reduce_unused_params or self.local_used is None:
            return False
        if not (self.find_unused_parameters or self.static_graph):
            return False
        return all(self.local_used[i] == 0 for i in bucket.variables)

    def _all_reduce_bucket(self, b: int, hook_index: int) -> None:
        bucket = self.buckets[b]
        grad_bucket = GradBucket(hook_index, len(self.buckets), bucket.gradients,
                                 bucket.offsets, bucket.lengths, bucket.sizes, bucket.params)
        if self.tap.enabled:
            self.tap.emit(AllReduceLaunched, b, bucket.nbytes,
                          str(bucket.gradients.dtype).removeprefix("torch."))
        if self.nonfinite is not None and not bucket.sparse:  # the local buffer, unreduced
            self.nonfinite.bucket(self.tap.step, lambda: list(bucket.variables),
                                  bucket.gradients, lambda: [
                                      bucket.gradients[o:o + n] for o, n in
                                      zip(bucket.offsets, bucket.lengths, strict=True)])
        if self.debug is not None:  # a safe point: before this bucket's all-reduce
            self.debug.bucket(self.tap.step, b, bucket.gradients, lambda: bucket.variables)
        LAUNCH.bucket = b
        try:
            bucket.future = self.run_comm_hook(grad_bucket)
        except RuntimeError as exc:  # a peer is gone already
            if self.watchdog is None:
                raise
            raise self.watchdog.failed(exc, collective="all-reduce", bucket=b,
                                       params=self._bucket_names(b)) from exc
        finally:
            LAUNCH.bucket = -1

    def run_comm_hook(self, grad_bucket: GradBucket) -> torch.futures.Future:
        """The registered comm hook on this bucket, or the built-in SUM all-reduce."""
        if self.comm_hook is None:
            return allreduce_sum(self.process_group, grad_bucket)
        return self.comm_hook(self.comm_hook_state, grad_bucket)

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        """Use `hook(state, bucket) -> Future[Tensor]` instead of the built-in all-reduce."""
        if self.comm_hook is not None:
            raise RuntimeError(texts.comm_hook_twice(self.comm_hook))
        self.comm_hook, self.comm_hook_state = hook, state

    # --- used-parameter map ---------------------------------------------------------------

    def _initialize_local_used_map(self) -> None:
        self.local_used = [0] * len(self.params)

    def _all_reduce_local_used_map(self) -> None:
        assert self.local_used is not None
        used = torch.tensor(self.local_used, dtype=torch.int32)
        device = self.params[0].device
        if device.type != "cpu":
            used = used.pin_memory().to(device, non_blocking=True)
        self.local_used_dev = used
        self.local_used_work = dist.all_reduce(used, group=self.process_group, async_op=True)

    def _global_used(self, index: int) -> bool:
        assert self.local_used is not None
        if self.local_used[index] == 0 and not self.local_used_reduced:
            # Only a locally unused parameter needs the global answer: wait lazily.
            self._wait(self.local_used_work, "used-parameter all-reduce")
            assert self.local_used_dev is not None
            self.local_used = [int(v) for v in self.local_used_dev.tolist()]
            self.local_used_reduced = True
        return self.local_used[index] != 0

    def get_local_used_map(self) -> torch.Tensor:
        """The used-parameter map as the device tensor that gets all-reduced (join support)."""
        if self.local_used_dev is None:
            assert self.local_used is not None
            self.local_used_dev = torch.tensor(self.local_used, dtype=torch.int32,
                                               device=self.params[0].device)
        return self.local_used_dev

    _get_local_used_map = get_local_used_map  # torch's name (dist.Reducer)

    def _ddp_graph_static(self) -> bool:
        """torch's: False once the set of unused parameters (find_unused_parameters) changed
        between two iterations; True otherwise."""
        return self.graph_static

    # --- the end of backward --------------------------------------------------------------

    def _end_of_backward(self) -> None:
        with self._lock:
            self._end_callback_queued = False
            if not self.expect_autograd_hooks:
                return
            if self.next_bucket == len(self.buckets):
                if self.logger is not None:
                    self.logger.backward_compute_end = self.logger.now()
                if self.manual_finalization:
                    return  # DistributedDataParallel.finalize_backward() finishes it
                self._finish_backward()
            elif not self.checked_first_iteration and not self._dynamic_find_unused():
                self._fail_missing_gradients()

    def _finish_backward(self) -> None:
        if self._static_after_first_iteration() and self.should_rebuild_buckets():
            self.rebuilt_param_indices.extend(self.unused_parameters)
        first = not self.checked_first_iteration
        self.finalize_backward()
        self.checked_first_iteration = True
        if first and self._agrees_on_unused():
            self._agree_on_unused([])

    # --- manual finalization (torch 2.15) ---------------------------------------------------

    def _set_manual_finalization_required(self, required: bool) -> None:
        """torch's name: switch manual backward finalization on or off (not mid-iteration)."""
        if self.expect_autograd_hooks:
            raise RuntimeError(texts.MANUAL_FINALIZATION_MID_ITERATION)
        self.manual_finalization = required

    def _should_finalize_after_backward(self) -> bool:
        """torch's name: finalization must wait for backward to return (buckets are being
        rebuilt from this backward's gradient order)."""
        return self.manual_finalization and self.should_rebuild_buckets()

    def _finalize_backward_manual(self) -> None:
        """torch's name: finalize this backward now (DistributedDataParallel.finalize_backward)."""
        with self._lock:
            if not self.manual_finalization:
                raise RuntimeError(texts.MANUAL_FINALIZATION_NOT_REQUIRED)
            if not self.expect_autograd_hooks or not self.require_finalize:
                raise RuntimeError(texts.MANUAL_FINALIZATION_NOTHING)
            if self.next_bucket != len(self.buckets):
                raise RuntimeError(texts.manual_finalization_early(
                    len(self.buckets) - self.next_bucket, len(self.buckets)))
            self._finish_backward()

    def _missing(self) -> list[int]:
        return [i for i in range(len(self.params)) if i not in self.per_iteration_ready]

    def _fail_missing_gradients(self) -> None:
        # See [Note: missing gradients].
        missing = self._missing()
        self.has_marked_unused_parameters = True
        for i in missing:
            p = self.params[i]
            if self.sparse_flags[i] and p.grad is None:
                # A sparse bucket reduces the gradient tensor itself: stand in an empty one.
                self._drain_sparse[i] = torch.sparse_coo_tensor(
                    torch.empty((1, 0), dtype=torch.long, device=p.device),
                    torch.empty((0, *p.shape[1:]), dtype=p.dtype, device=p.device), p.shape,
                    check_invariants=True)
            self._mark_variable_ready(i)
        self._drain_sparse.clear()
        self.finalize_backward()
        self.rebuilt_param_indices.clear()
        self.checked_first_iteration = True
        if self._agrees_on_unused():
            self._agree_on_unused(missing)
        self._raise_unused(self._unused_error(missing, at_forward=False))

    def _raise_unused(self, error: UnusedParametersError) -> None:
        """Raise the first synced backward's error now, or hold it until the next forward."""
        if self._defer_unused:
            self.deferred_error = error
            return
        raise error

    # --- diagnosis across ranks (the watchdog's: see observers.py) ------------------------

    def _agrees_on_unused(self) -> bool:
        return (self.watchdog is not None and self.watchdog.enabled and not self.static_graph
                and not self._dynamic_find_unused())

    def _agree_on_unused(self, missing: list[int]) -> None:
        """First synced backward: every rank learns which parameters got no gradient on which
        ranks, and every rank raises the same UnusedParametersError if any did."""
        assert self.watchdog is not None
        message, findings = self.watchdog.agree_on_unused(
            self.tap.step, missing, [i for i in missing if i in set(self.unreachable or ())],
            self.names, [tuple(p.shape) for p in self.params], self.unhooked(missing))
        if not findings:
            return
        if self.tap.enabled:
            if missing:
                self.tap.emit(UnusedParametersFound, tuple(missing),
                              tuple(self.names[i] for i in missing))
            for f in findings:
                self.tap.emit(FindingReported, f)
        body, _, tail = message.rpartition("\n")  # the fix stays last
        by_rank: dict[int, list[tuple[int, str]]] = {}
        for f in findings:  # the same text on every rank: each rank's missing parameters
            for r in f.ranks:
                by_rank.setdefault(r, []).append((f.param, f.name))
        error = UnusedParametersError(f"{body}\n{self._torch_text(by_rank)}\n{tail}", findings)
        self._log_error(str(error))
        self._raise_unused(error)

    def _fail(self, head: str, kind: Kind, index: int, field: str,
              title: str, torch_text: str = "") -> GradientGraphError:
        """The error to raise: the finding first (its fix from findings.FIXES), then the
        message from `head` (what happened, one line) and the finding's fix; records the
        finding and tells the other ranks, so that those waiting for this one stop at once
        (see Guard.fail in observers.py)."""
        rank = self.process_group.rank()
        finding = Finding(kind=kind, severity="error", title=title, ranks=(rank,),
                          param=index, name=self.names[index], field=field,
                          step=self.tap.step, fix=fix_for(kind),
                          world_size=self.process_group.size())
        message = f"{head} {finding.fix}"
        if self.watchdog is not None:
            self.watchdog.fail(message, [finding])
        elif self.tap.enabled:
            self.tap.emit(FindingReported, finding)
        if torch_text:  # See [Note: torch's sentences] (errors.py); the fix stays last.
            message = f"{head}\n{torch_text}\n{finding.fix}"
        self._log_error(message)
        return GradientGraphError(message, (finding,))

    def _bucket_names(self, b: int) -> list[str]:
        return [self.names[i] for i in self.buckets[b].variables]

    def _wait(self, waitable: Any, collective: Collective, b: int = -1) -> None:
        """Wait for a collective; with a watchdog, a rank that never joins is named."""
        if self.watchdog is None:
            waitable.wait()
            return
        self.watchdog.phase = PHASE_OF_COLLECTIVE[collective]
        self.watchdog.wait(waitable, collective=collective, bucket=b,
                           params=self._bucket_names(b) if b >= 0 else ())

    def _unused_error(self, missing: list[int], *, at_forward: bool) -> UnusedParametersError:
        if self.tap.enabled:
            self.tap.emit(UnusedParametersFound, tuple(missing),
                          tuple(self.names[i] for i in missing))
        rank = self.process_group.rank()
        # Reachability is only known for the first synced iteration's graph.
        unreachable = set(self.unreachable or ()) if not at_forward else set()
        unhooked = set(self.unhooked(missing))
        lines = []
        for i in missing:
            why = (texts.UNHOOKED if i in unhooked else "not used in forward" if i in unreachable
                   else "no gradient reached it in backward")
            lines.append(f"  parameter {i} '{self.names[i]}' "
                         f"{tuple(self.params[i].shape)}: {why}")
        setting = ("static_graph=True: the graph changed since iteration 0" if self.static_graph
                   else f"find_unused_parameters={self.find_unused_parameters}")
        fix = texts.UNHOOKED_FIX if unhooked == set(missing) else fix_for(
            "graph_changed" if self.static_graph else "unused_parameter")
        error = UnusedParametersError(texts.unused_parameters(
            missing, len(self.params), rank, lines, at_forward=at_forward, setting=setting,
            torch_text=self._torch_text({rank: [(i, self.names[i]) for i in missing]}),
            fix=fix))
        self._log_error(str(error))
        return error

    def _torch_text(self, missing: dict[int, list[tuple[int, str]]]) -> str:
        """torch's own sentence for this situation. See [Note: torch's sentences] (errors.py)."""
        return torch_unfinished_reduction(
            missing, find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph)

    def _log_error(self, message: str) -> None:
        if self.logger is not None:
            self.logger.set_error(message)

    def finalize_backward(self) -> None:
        """Wait for every bucket in order and write averaged gradients back to param.grad."""
        self.expect_autograd_hooks = False
        self.first_autograd_hook_called = False
        self.require_finalize = False
        for b, bucket in enumerate(self.buckets):
            if bucket.skipped:
                continue
            assert bucket.future is not None, "bucket was never launched"
            self._wait(bucket.future, "all-reduce", b)
            result = hook_result(bucket.future.value())
            with torch.no_grad():
                if bucket.sparse:
                    bucket.gradients.copy_(result)
                else:
                    bucket.views_out = [layout_view(result, p, o)
                                        for p, o in zip(bucket.params, bucket.offsets,
                                                        strict=True)]
            if self.tap.enabled:
                self.tap.emit(AllReduceDone, b)
            if not bucket.sparse:
                self._finalize_bucket_dense(bucket)
                if self.lazy_bucket_allocation:
                    release(bucket)
        self.div_factor = _UNSET  # join may change it for the next backward
        for fut in self.installed_futures:
            fut.wait()
        self.installed_futures = []
        if (self._dynamic_find_unused() or self._static_first_iteration()) and \
                not self.local_used_reduced and self.local_used_work is not None:
            self._wait(self.local_used_work, "used-parameter all-reduce")
        if self._dynamic_find_unused():
            self.local_used = [0] * len(self.params)
            self.local_used_reduced = False
        if self.logger is not None:
            self.logger.backward_comm_end = self.logger.now()
        if self.nonfinite is not None:
            self.nonfinite.backward_done(self.tap.step)
        if self.tap.enabled:
            self.tap.emit(BackwardFinished)
        if self.after_finalize is not None:
            self.after_finalize()
        if self.debug is not None:  # a safe point: every all-reduce of this step is complete
            self.debug.after_backward(self.tap.step)

    def _finalize_bucket_dense(self, bucket: Bucket) -> None:
        with torch.no_grad():
            for intra, index in enumerate(bucket.variables):
                p = self.params[index]
                global_unused = False
                if self.static_graph or self.find_unused_parameters:
                    global_unused = not self._global_used(index)
                out = bucket.views_out[intra]
                # Mixed precision upcasts .grad in its comm hook, so .grad can no longer be a
                # view of the (low-precision) bucket: copy the result instead. torch fails
                # here ("not the expected DDP bucket view") once buckets are rebuilt.
                if not self.gradient_as_bucket_view or self.mixed_precision_param_dtype:
                    with _profiled("torch.distributed.ddp.reducer::copy_bucket_to_grad"):
                        if not global_unused:
                            if p.grad is None:
                                p.grad = clone_obey_contract(out, p)
                            else:
                                p.grad.copy_(out)
                    continue
                view_in = bucket.views_in[intra]
                if not is_alias_of(view_in, out):
                    view_in.copy_(out)
                if global_unused:
                    continue
                if p.grad is None:
                    p.grad = view_in
                elif not is_alias_of(p.grad, view_in):
                    raise RuntimeError(texts.not_bucket_view(index, self.names[index]))

    # --- static graph ---------------------------------------------------------------------

    def set_static_graph(self) -> None:
        """Declare the graph static; must come before the first forward."""
        if self.num_iterations != 0:
            message = texts.STATIC_GRAPH_LATE
            self._log_error(message)  # kept in logging_data, as torch's REDUCER_CHECK does
            raise RuntimeError(message)
        self.static_graph = True
        self._initialize_local_used_map()

    def delay_all_reduce(self) -> None:
        """static_graph, iteration 0: fill and reduce every bucket at the end of backward."""
        with self._lock:
            if self.logger is not None:
                self.logger.backward_compute_end = self.logger.now()
                self.logger.backward_comm_start = self.logger.backward_compute_end
            self._all_reduce_local_used_map()
            self.unused_parameters = []
            self.require_finalize = True
            for i in range(len(self.params)):
                if self.hooks_per_iteration[i] == 0:
                    self.unused_parameters.append(i)
                self._set_divide_factor()
                if self.sparse_flags[i]:
                    self._mark_ready_sparse(i)
                else:
                    self._mark_ready_dense(i)
            for b, bucket in enumerate(self.buckets):
                self._bucket_filled(b, bucket)
            for b in range(len(self.buckets)):
                # torch passes next_bucket (0) as every bucket's index here.
                self._all_reduce_bucket(b, self.next_bucket)
            if self.unused_parameters and self.tap.enabled:
                self.tap.emit(UnusedParametersFound, tuple(self.unused_parameters),
                              tuple(self.names[i] for i in self.unused_parameters))
            self.finalize_backward()
            self.checked_first_iteration = True

    # --- per iteration --------------------------------------------------------------------

    def prepare_for_forward(self) -> None:
        """A synced forward starts (grad enabled, not under no_sync)."""
        self.num_iterations += 1
        if self.logger is not None:
            self.logger.forward_start = self.logger.now()

    def prepare_for_backward(self, outputs: Sequence[torch.Tensor]) -> None:
        """Arm the hooks for the backward of this forward's outputs."""
        with self._lock:
            if self.logger is not None:
                self.logger.backward_compute_start = self.logger.now()
            self.expect_autograd_hooks = True
            self.summary.begin(self.tap.step)
            self.grad_ready_order = []
            self.next_bucket = 0
            self.num_buckets_ready = 0
            self.num_buckets_reduced = 0
            for bucket in self.buckets:
                bucket.pending = len(bucket.variables)
                bucket.future = None
                bucket.skipped = False
                bucket.deferred.clear()
            if self.static_graph:
                self.hooks_left = dict(self.hooks_per_iteration)
            self.has_marked_unused_parameters = False
            self.per_iteration_ready.clear()
            if self._dynamic_find_unused():
                with _profiled("torch.distributed.ddp.reducer::search_unused_parameters"):
                    self.unused_parameters = unused_parameters(outputs, self.grad_accumulators)
                if self.graph_static:  # torch's ddp_graph_static_
                    if self.num_iterations > 1:
                        self.graph_static = self._prev_unused == self.unused_parameters
                    self._prev_unused = list(self.unused_parameters)
                if not self.unused_parameters and not self._warned_all_used:
                    self._warned_all_used = True
                    log.warning(texts.ALL_PARAMETERS_USED)
                if self.unused_parameters and self.tap.enabled:
                    self.tap.emit(UnusedParametersFound, tuple(self.unused_parameters),
                                  tuple(self.names[i] for i in self.unused_parameters))

    def note_outputs_for_check(self, outputs: Sequence[torch.Tensor]) -> None:
        """First synced iteration only: remember which parameters the outputs cannot reach,
        to explain a missing gradient. See [Note: missing gradients]."""
        if not self.checked_first_iteration and self.unreachable is None:
            self.unreachable = unused_parameters(outputs, self.grad_accumulators)

    def ensure_prior_reduction_finished(self) -> None:
        """Raise if the previous synced backward left buckets unreduced."""
        if self.deferred_error is not None:
            error, self.deferred_error = self.deferred_error, None
            raise error
        if self.require_finalize and self.manual_finalization and \
                self.next_bucket == len(self.buckets):
            self.require_finalize = False
            self.expect_autograd_hooks = False
            raise RuntimeError(texts.MANUAL_FINALIZATION_FORGOTTEN)
        if self.require_finalize:
            missing = self._missing()
            self.require_finalize = False
            self.expect_autograd_hooks = False
            raise self._unused_error(missing, at_forward=True)

    # --- rebuild --------------------------------------------------------------------------

    def should_rebuild_buckets(self) -> bool:
        return (self.static_graph or not self.find_unused_parameters) and \
            not self.has_rebuilt_bucket

    def rebuild_buckets(self) -> bool:
        """Before a forward: rebuild once in gradient-ready order, synced from rank 0."""
        with self._lock:
            self.ensure_prior_reduction_finished()
            if not self.should_rebuild_buckets() or not self.rebuilt_param_indices:
                return False
            order = list(self.rebuilt_param_indices)
            if sorted(order) != list(range(len(self.params))):
                raise RuntimeError(texts.rebuild_order_incomplete(len(order), len(self.params)))
            rebuild_limits = self.limits.rebuild
            assert rebuild_limits is not None
            _, indices, limits = rebuilt_buckets(self.params, order, rebuild_limits,
                                                 self.sparse_flags, self.limits.set_last_bucket_cap)
            indices = self._sync_bucket_indices(indices)
            self.has_rebuilt_bucket = True
            self.rebuilt_param_indices = []
            self.initialize_buckets(indices, limits)
            self.rebuilt_bucket_indices = self.bucket_indices()
            self.summary.policy.note_rebuild(self.tap.step)
            if self.tap.enabled:
                self.tap.emit(BucketsRebuilt, tuple(order))
                self.tap.emit(BucketAssigned, tuple(tuple(b) for b in indices),
                              tuple(self.bucket_limits), True)
            return True

    def _sync_bucket_indices(self, indices: list[list[int]]) -> list[list[int]]:
        # Rank 0's map wins: broadcast [indices..., bucket count], then the bucket sizes
        # (int32 on the parameters' device, as torch does).
        device = self.params[0].device
        flat = [i for b in indices for i in b] + [len(indices)]
        t = torch.tensor(flat, dtype=torch.int32).to(device, non_blocking=True)
        self._wait(dist.broadcast(t, group=self.process_group, group_src=0, async_op=True),
                   "bucket rebuild broadcast")
        values = t.tolist()
        count = values[-1]
        sizes = torch.tensor([len(indices[min(i, len(indices) - 1)]) for i in range(count)],
                             dtype=torch.int32).to(device, non_blocking=True)
        self._wait(dist.broadcast(sizes, group=self.process_group, group_src=0,
                                  async_op=True), "bucket rebuild broadcast")
        out, pos = [], 0
        for size in sizes.tolist():
            out.append(values[pos:pos + size])
            pos += size
        return out

    def push_all_rebuilt_params(self) -> None:
        """Join: a joined rank records registration order so it can rebuild like the others."""
        if self.should_rebuild_buckets() and not self.rebuilt_param_indices:
            self.rebuilt_param_indices = list(range(len(self.params)))

    def zeros_like_grad_buckets(self) -> list[GradBucket]:
        """Join: zero-filled stand-ins for every bucket, in reduction order."""
        return [GradBucket(b, len(self.buckets), torch.zeros_like(bucket.gradients) if
                           bucket.sparse else bucket.gradients.new_zeros(sum(bucket.lengths)),
                           bucket.offsets, bucket.lengths, bucket.sizes, bucket.params)
                for b, bucket in enumerate(self.buckets)]

    def install_futures(self, futures: Sequence[torch.futures.Future]) -> None:
        """Futures to await at the end of this backward (buffer comm hooks)."""
        self.installed_futures.extend(futures)

    # --- modes ----------------------------------------------------------------------------

    def _dynamic_find_unused(self) -> bool:
        return not self.static_graph and self.find_unused_parameters

    def _static_first_iteration(self) -> bool:
        return self.static_graph and self.num_bwd_calls == 1

    def _static_after_first_iteration(self) -> bool:
        return self.static_graph and self.num_bwd_calls > 1
