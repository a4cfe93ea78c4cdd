"""`DistributedDataParallel`: torch 2.13's DDP re-implemented in Python, wiring DDP's phases in
the walk-through's order (params -> verify -> broadcast -> buckets -> reducer; forward;
backward), with events at every phase. Same constructor, defaults and errors as torch's; the
reducer itself lives in reducer.py, and what watches it comes through observers.py.
"""

from __future__ import annotations

import logging
import os
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Self

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _get_device_index
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from ddpviz.engine.broadcast import broadcast_coalesced
from ddpviz.engine.buckets import BucketCapacity, initial_buckets
from ddpviz.engine.buffer_identity import BufferIdentity
from ddpviz.engine.comm import buffer_sync, check_comm_hook
from ddpviz.engine.compiler import keep_ddpviz_eager
from ddpviz.engine.forward import find_tensors, pass_through_sink
from ddpviz.engine.initial_values import initial_value_findings
from ddpviz.engine.logger import DDPLogger
from ddpviz.engine.observers import NO_OBSERVERS, Observers
from ddpviz.engine.params import build_buffers, build_params_for_reducer
from ddpviz.engine.reducer import Reducer
from ddpviz.engine.torch_version import (
    check_argument,
    has_method,
    missing_attribute,
    since_torch_215,
)
from ddpviz.engine.verify import verify_module_across_ranks
from ddpviz.events import (
    BucketAssigned,
    BuffersSynced,
    Emitter,
    FindingReported,
    ForwardStarted,
    ParamInfo,
    ParamsBuilt,
    Tap,
    default_emitter,
)
from ddpviz.findings import DiagnosisWarning, Finding
from ddpviz.recording import DetailPolicy, FindingObserver, Recording, resolve_recording

logger = logging.getLogger(__name__)

BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024  # torch's broadcast_bucket_size


class _DDPJoinHook(JoinHook):
    """Shadows a non-joined rank's collectives on a rank that ran out of inputs (torch's)."""

    def __init__(self, ddp: DistributedDataParallel, divide_by_initial_world_size: bool) -> None:
        ddp._logger.ints["join_uneven_inputs"] = 1
        self.ddp = ddp
        ddp._divide_by_initial_world_size = divide_by_initial_world_size
        super().__init__()

    def main_hook(self) -> None:
        ddp = self.ddp
        ddp.reducer.rebuild_buckets()
        ddp._check_and_sync_module_buffers()
        should_sync = ddp._check_global_requires_backward_grad_sync(is_joined_rank=True)
        ddp.require_forward_param_sync = bool(should_sync)
        if not should_sync:
            return
        ddp._match_all_reduce_for_bwd_pass()
        if ddp.find_unused_parameters:
            ddp._match_unused_params_allreduce()
        ddp.reducer.push_all_rebuilt_params()

    def post_hook(self, is_last_joiner: bool) -> None:
        self.ddp._sync_final_model(is_last_joiner)


class DistributedDataParallel(nn.Module, Joinable):
    """Drop-in for `torch.nn.parallel.DistributedDataParallel` (torch 2.13), in Python: the twin
    alone, watched by nothing (plain waits, no checks). `ddpviz.DistributedDataParallel` is
    this class with ddpviz's probes plugged in; See [Note: twin and probes] (observers.py).

    Args:
        module ... forward_sync_buffers: exactly torch's arguments, defaults and meaning.
        emitter: receives ddpviz events (`ddpviz.events`); None: the process's default
            emitter (set by ddpviz.launch / ddpviz.connect), else no events at all.
        hang_timeout: handed to the observers' hang watchdog (ddpviz.DistributedDataParallel
            documents it); the bare twin has none and ignores it.
        recording: what is recorded of each backward, a `ddpviz.Recording`
            (ddpviz.DistributedDataParallel documents it; See [Note: recording policy]).
        detail: deprecated (one release): the old level names, mapped to `recording=`.
    """

    # What watches this DDP on its rank: nothing here; ddpviz.DistributedDataParallel plugs in
    # the probes. See [Note: twin and probes] (observers.py).
    _observers: ClassVar[Observers] = NO_OBSERVERS

    def __init__(self, module: nn.Module, device_ids: list[int | torch.device] | None = None,
                 output_device: int | torch.device | None = None, dim: int = 0,
                 broadcast_buffers: bool | None = None, init_sync: bool = True,
                 process_group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False,
                 delay_all_reduce_named_params: list[tuple[str, nn.Parameter]] | None = None,
                 param_to_hook_all_reduce: nn.Parameter | None = None,
                 mixed_precision: Any = None, device_mesh: Any = None,
                 skip_all_reduce_unused_params: bool = False,
                 bucket_cap_mb_list: list[float] | None = None,
                 batched_grad_copy: bool = False, forward_sync_buffers: bool | None = None,
                 lazy_bucket_allocation: bool | None = None, *, emitter: Emitter | None = None,
                 hang_timeout: float | None = None, recording: Recording | None = None,
                 detail: str | None = None) -> None:
        # torch 2.15's; None: not given (torch 2.13 and 2.14 have no such argument)
        check_argument("lazy_bucket_allocation", lazy_bucket_allocation)
        super().__init__()
        Joinable.__init__(self)
        keep_ddpviz_eager()  # See [Note: ddpviz under torch.compile]
        if (delay_all_reduce_named_params is not None) != (param_to_hook_all_reduce is not None):
            raise ValueError("ddpviz: delay_all_reduce_named_params and param_to_hook_all_reduce "
                             "need to be set at the same time.")
        self.process_group = self._choose_group(process_group, device_mesh, module)
        if device_mesh is not None:
            self.device_mesh = device_mesh  # torch keeps it public (only when given)
        resolved = resolve_recording(recording, detail, where="DistributedDataParallel()",
                                     stacklevel=2)
        self._detail = DetailPolicy.of(resolved)
        self._stack_source = resolved.stack_source
        target = emitter if emitter is not None else default_emitter()
        if target is not None and self._detail.level == "sampled":
            target = FindingObserver(target, _finding_callback(weakref.ref(self)))
        self._tap = Tap(target, rank=self.process_group.rank())
        tap = self._tap
        # Names ranks that never arrive or stop coming (None: plain waits). See [Note: twin
        # and probes] (observers.py).
        self._watchdog = self._observers.guard(self.process_group, hang_timeout, tap,
                                               stack_source=resolved.stack_source)

        # --- step 1: what DDP reduces and syncs ----------------------------------------------
        self._delay_all_reduce_params: list[nn.Parameter] = []
        self.parameters_to_ignore: set[str] = set(
            getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        if delay_all_reduce_named_params is not None:
            for name, param in delay_all_reduce_named_params:
                self.parameters_to_ignore.add(name)
                self._delay_all_reduce_params.append(param)
        self._module_parameters = [p for n, p in module.named_parameters()
                                   if n not in self.parameters_to_ignore]
        if not any(p.requires_grad for p in self._module_parameters):
            if self._delay_all_reduce_params:
                logger.info("Delay the AllReduce of all parameters.")
            else:
                raise RuntimeError(
                    "ddpviz: DistributedDataParallel is not needed when a module doesn't have "
                    f"any parameter that requires a gradient ({type(module).__name__} has "
                    f"{len(self._module_parameters)} parameters, none trainable). Set "
                    "requires_grad=True on the parameters to train, or do not wrap it.")
        self._check_devices(device_ids, output_device)
        self.static_graph = False
        self.dim = dim
        self.module = module
        self.device = next(iter(self._module_parameters)).device
        init_sync_buffers = self._buffer_flags(broadcast_buffers, forward_sync_buffers)
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.batched_grad_copy = batched_grad_copy
        if lazy_bucket_allocation is not None:
            self.lazy_bucket_allocation = lazy_bucket_allocation
        self._require_manual_backward_finalization = False
        self.mixed_precision = mixed_precision
        if mixed_precision is not None:
            logger.warning("Received mixed precision config %s", mixed_precision)
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is "
                          "deprecated. Please avoid using it.", FutureWarning, stacklevel=2)
        for p in self._module_parameters:
            if isinstance(p, nn.parameter.UninitializedParameter):
                raise RuntimeError(
                    "ddpviz: Modules with uninitialized parameters can't be used with "
                    "`DistributedDataParallel`. Run a dummy forward pass to correctly "
                    "initialize the modules")
        self.broadcast_bucket_size = BROADCAST_BUCKET_BYTES
        self._bucket_config = BucketCapacity.create(bucket_cap_mb, bucket_cap_mb_list)
        self.bucket_bytes_cap = self._bucket_config.bucket_bytes_cap
        self.bucket_bytes_cap_list = list(self._bucket_config.per_bucket_bytes_caps)
        self.bucket_bytes_cap_default = (self._bucket_config.first_bucket_bytes_cap
                                         < self._bucket_config.bucket_bytes_cap)
        self.use_side_stream_for_tensor_copies = (
            os.environ.get("PYTORCH_DDP_USE_SIDE_STREAM", "1") == "1")
        self._delay_grad_buffer: torch.Tensor | None = None
        self._delay_grad_views: list[torch.Tensor] = []
        self._delay_all_reduce_all_params = False
        self._comm_hooks: list[tuple[Callable[..., Any], object]] = []
        self._has_rebuilt_buckets = False
        self._lazy_init_ran = False
        self._ddp_sink_clone = True
        self._static_graph_delay_allreduce_enqueued = False
        self._divide_by_initial_world_size = True
        self._forwards = 0
        if self._delay_all_reduce_params:
            self._register_delay_all_reduce_hook(self._bucket_config.bucket_bytes_cap // 2**20,
                                                 param_to_hook_all_reduce)
            if self._delay_all_reduce_all_params:
                return
        self.skip_all_reduce_unused_params = skip_all_reduce_unused_params
        entries = build_params_for_reducer(module, self.parameters_to_ignore)
        self._assign_modules_buffers()
        if tap.enabled:
            tap.emit(ParamsBuilt, tuple(
                ParamInfo(e.index, e.name, tuple(e.param.shape),
                          str(e.param.dtype).removeprefix("torch."), str(e.param.device),
                          e.sparse_grad, e.param.element_size()) for e in entries),
                tuple(self.named_module_buffers),
                tuple(sorted(n for n in self.parameters_to_ignore if n in
                             dict(module.named_parameters()) or n in
                             dict(module.named_buffers()))))

        # --- steps 2-3: verify the model, then broadcast rank 0's state ------------------------
        if self._watchdog is not None:
            self._watchdog.start()
        if init_sync:
            verify_module_across_ranks(module, self.process_group,
                                       ignore=self.parameters_to_ignore, tap=tap)
            for finding in initial_value_findings(module, self.process_group,
                                                  ignore=self.parameters_to_ignore):
                if tap.enabled:  # a warning in the trace only: rank-0-only loading is valid
                    tap.emit(FindingReported, finding)
            self._broadcast_state(src=0, buffers=init_sync_buffers)

        # --- step 4: buckets and the reducer ----------------------------------------------
        # (the replica check first: the reducer reports each reduced backward to it)
        self._replicas = self._observers.replicas(
            resolved.replicas, self._watchdog, [e.param for e in entries],
            [e.name for e in entries], module, set(self.parameters_to_ignore),
            lambda: bool(self.broadcast_buffers), tap)
        self._build_reducer(entries, static_graph)
        if mixed_precision is not None:
            from ddpviz.engine.mixed_precision import MixedPrecisionState

            self._mp = MixedPrecisionState(self, mixed_precision)
        if static_graph:
            self._set_static_graph()

    # --- construction helpers -----------------------------------------------------------------

    @staticmethod
    def _choose_group(process_group: Any, device_mesh: Any, module: nn.Module) -> Any:
        if process_group and device_mesh is not None:
            raise RuntimeError("ddpviz: Cannot specify both process_group and device_mesh "
                               "arguments.")
        if process_group is None and device_mesh is None:
            if not dist.is_initialized():
                raise RuntimeError(
                    "ddpviz: DistributedDataParallel needs a process group, and the default one "
                    "is not initialized. Call torch.distributed.init_process_group(...) first, "
                    "or pass process_group=.")
            return dist.group.WORLD
        if device_mesh is None:
            return process_group
        if device_mesh.ndim != 1:
            raise RuntimeError(f"ddpviz: Only 1D device mesh is supported, but got "
                               f"{device_mesh}.")
        if device_mesh._get_root_mesh() != device_mesh:
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

            _pre_dp_module_transform(module)
        return device_mesh.get_group(mesh_dim=0)

    def _check_devices(self, device_ids: Any, output_device: Any) -> None:
        params = self._module_parameters
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("ddpviz: device_ids can only be None or contain a single element.")
        self.is_multi_device_module = len({p.device for p in params}) > 1
        types = {p.device.type for p in params if p.device is not None}
        if len(types) != 1:
            raise ValueError("ddpviz: DistributedDataParallel's input module must be on the "
                             f"same type of devices, but input module parameters locate in "
                             f"{types}.")
        self.device_type = next(iter(types))
        if (device_ids is None or len(device_ids) == 0 or self.device_type == "cpu"
                or self.is_multi_device_module):
            if device_ids or output_device:
                raise ValueError(
                    "ddpviz: DistributedDataParallel device_ids and output_device arguments only "
                    "work with single-device/multiple-device GPU modules or CPU modules, but got "
                    f"device_ids {device_ids}, output_device {output_device}, and module "
                    f"parameters {({p.device for p in params})}.")
            self.device_ids: list[int] | None = None
            self.output_device: int | None = None
        else:
            self.device_ids = [_get_device_index(x, True) for x in device_ids]
            self.output_device = _get_device_index(
                device_ids[0] if output_device is None else output_device, True)

    def _buffer_flags(self, broadcast_buffers: bool | None,
                      forward_sync_buffers: bool | None) -> bool:
        """Sets forward_sync_buffers; returns whether the constructor syncs buffers."""
        if broadcast_buffers is not None:
            if forward_sync_buffers is not None:
                warnings.warn(
                    "Both `broadcast_buffers` and `forward_sync_buffers` were specified. "
                    "`broadcast_buffers` is deprecated and its value is ignored when "
                    "`forward_sync_buffers` is provided.", FutureWarning, stacklevel=3)
            else:
                warnings.warn(
                    "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. "
                    "IMPORTANT: unlike `broadcast_buffers=False`, `forward_sync_buffers=False` "
                    "still syncs buffers at init. If you rely on buffers NOT being synced at "
                    "init (e.g. rank-local buffers), keep using `broadcast_buffers=False` until "
                    "`init_sync_buffers` is available.", FutureWarning, stacklevel=3)
        if forward_sync_buffers is not None:
            self.forward_sync_buffers = forward_sync_buffers
            return True
        effective = broadcast_buffers if broadcast_buffers is not None else True
        self.forward_sync_buffers = effective
        return effective

    @property
    def broadcast_buffers(self) -> bool:
        """Whether each forward broadcasts the module's buffers from rank 0 (the authoritative
        rank under `join()`); torch's deprecated name of `forward_sync_buffers`, which setting
        it sets."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    def _module_states(self, buffers: bool) -> list[torch.Tensor]:
        states = [p.detach() for n, p in self.module.named_parameters()
                  if n not in self.parameters_to_ignore]
        if buffers:
            states += [b.detach() for n, b in self.module.named_buffers()
                       if n not in self.parameters_to_ignore]
        return states

    def _broadcast_state(self, src: int, buffers: bool) -> None:
        states = self._module_states(buffers)
        if states:
            broadcast_coalesced(states, self.process_group, src=src,
                                chunk_bytes=self.broadcast_bucket_size, tap=self._tap)

    def _build_reducer(self, entries: list[Any], static_graph: bool) -> None:
        limits = self._bucket_config.limits(find_unused_parameters=self.find_unused_parameters,
                                            static_graph=static_graph)
        tensors = [e.param for e in entries]
        sparse = [e.sparse_grad for e in entries]
        _, bucket_indices, bucket_limits = initial_buckets(tensors, limits.initial, sparse)
        if self._tap.enabled:
            self._tap.emit(BucketAssigned, tuple(tuple(b) for b in bucket_indices),
                           tuple(bucket_limits), False)
        self.reducer = Reducer(
            entries, bucket_indices, bucket_limits, self.process_group, limits=limits,
            find_unused_parameters=self.find_unused_parameters,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            skip_all_reduce_unused_params=self.skip_all_reduce_unused_params,
            batched_grad_copy=self.batched_grad_copy,
            lazy_bucket_allocation=bool(getattr(self, "lazy_bucket_allocation", False)),
            tap=self._tap, watchdog=self._watchdog,
            logger=DDPLogger, detail=self._detail)
        # The NaN check (probes/nonfinite.py): the reducer hands it each bucket's local buffer
        # before its all-reduce, _post_forward the output
        self._nf = self._observers.nonfinite(self._watchdog, tensors, [e.name for e in entries],
                                             self.process_group, self._tap)
        self.reducer.nonfinite = self._nf
        # The optimizer-step tap (probes/optimizer_step.py): armed on the sampled steps
        self._opt = self._observers.optimizer_step(tensors, self._tap)
        if self._opt is not None:
            weakref.finalize(self, self._opt.disarm)
        # The debugger's safe points (ddpviz/debugger/): None unless the rank was launched for it
        self._debug = self._observers.debugger(self, tensors, [e.name for e in entries],
                                               self._tap)
        self.reducer.debug = self._debug
        # The gradient-sync contract (probes/sync_contract.py): told each grad-enabled forward
        old = self.__dict__.get("_contract")
        if old is not None:
            old.close()
        self._contract = self._observers.sync_contract(
            self, tensors, [e.name for e in entries], self._tap, self.process_group.size(),
            self.__dict__.get("_stack_source", True))
        replicas = self.__dict__.get("_replicas")
        if replicas is not None:
            self.reducer.after_finalize = lambda: replicas.after_backward(self._tap.step, True)
        self._buffer_identity = BufferIdentity(self.process_group.rank(),
                                               self.process_group.size())
        self._buffer_identity.check(self.named_module_buffers, -1)
        self._logger = self.reducer.logger
        has_sync_bn = any(isinstance(m, nn.SyncBatchNorm) for m in self.module.modules())
        self._logger.set_construction_data(
            module_name=type(self.module).__name__, device_ids=self.device_ids or [],
            output_device=-1 if self.output_device is None else self.output_device,
            broadcast_buffers=self.forward_sync_buffers, has_sync_bn=has_sync_bn,
            static_graph=static_graph, backend_name=self._backend_name(),
            world_size=self.process_group.size(), rank=self.process_group.rank(),
            bucket_cap_bytes=self.bucket_bytes_cap,
            find_unused_parameters=self.find_unused_parameters,
            gradient_as_bucket_view=self.gradient_as_bucket_view)
        threads = self._gloo_threads()
        if threads is not None:
            self._logger.ints["gloo_num_threads"] = threads
        if has_sync_bn and self.device_type == "cpu":
            raise ValueError("ddpviz: SyncBatchNorm layers only work with GPU modules; this "
                             "module is on the CPU. Use nn.BatchNorm, or move it to a GPU.")

    def _backend_name(self) -> str:
        try:
            return str(dist.get_backend(self.process_group))
        except (RuntimeError, ValueError):
            name = getattr(self.process_group, "name", None)
            return str(name() if callable(name) else "undefined")

    def _gloo_threads(self) -> int | None:
        try:
            backend = self.process_group._get_backend(torch.device("cpu"))
            if type(backend).__name__ == "ProcessGroupGloo":
                return int(backend.options._threads)
        except (RuntimeError, AttributeError, ValueError):
            pass
        return None

    def _assign_modules_buffers(self) -> None:
        """Re-read the buffers (a module may reassign them between forwards)."""
        named = build_buffers(self.module, self.parameters_to_ignore)
        self.modules_buffers = [b for _, b in named]
        self.named_module_buffers = dict(named)

    def _register_delay_all_reduce_hook(self, bucket_cap_mb: int,
                                        param_to_hook_all_reduce: Any) -> None:
        params = self._delay_all_reduce_params
        self._delay_grad_buffer = torch.zeros(sum(p.numel() for p in params),
                                              device=self.device if self.device_ids else "cpu")
        # torch passes the cap in MiB as a byte count here: in effect one tensor per chunk.
        broadcast_coalesced([p.detach() for p in params], self.process_group, src=0,
                            chunk_bytes=bucket_cap_mb, tap=self._tap)
        param_to_hook_all_reduce.register_hook(self._delayed_all_reduce_hook)
        offset = 0
        for p in params:
            self._delay_grad_views.append(
                self._delay_grad_buffer[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        for module_name, sub in self.module.named_modules():
            for param_name, p in sub.named_parameters(recurse=False):
                if p.requires_grad and \
                        f"{module_name}.{param_name}" not in self.parameters_to_ignore:
                    return
        self._delay_all_reduce_all_params = True

    def _delayed_all_reduce_hook(self, grad: torch.Tensor) -> torch.Tensor:
        assert self._delay_grad_buffer is not None
        self._delay_grad_buffer.div_(self.process_group.size())
        work = dist.all_reduce(self._delay_grad_buffer, group=self.process_group, async_op=True)
        # torch never waits for this all-reduce, so an optimizer step can read the buffer while
        # it is still being reduced (two torch runs differ); waiting at the end of backward
        # removes that race without adding a host sync on accelerators (Work.wait only makes
        # the current stream wait).
        if work is not None:
            torch.autograd.Variable._execution_engine.queue_callback(work.wait)
        return grad

    def _clear_grad_buffer(self) -> None:
        if self._delay_grad_buffer is None:
            return
        all_none = all(p.grad is None for p in self._delay_all_reduce_params)
        for i, p in enumerate(self._delay_all_reduce_params):
            if p.grad is None:
                p.grad = self._delay_grad_views[i]
                if not all_none:
                    p.grad.zero_()
        if all_none:
            self._delay_grad_buffer.zero_()

    # --- public API ---------------------------------------------------------------------------

    def bucket_indices(self) -> list[list[int]]:
        """The bucket map in force: the initial map during the first iteration, the map
        rebuilt in gradient-ready order from the second forward on (where torch rebuilds).

        Returns:
            For each bucket, bucket 0 reduced first, the indices of its parameters in the
            reducer's parameter list (those that require a gradient and are not ignored, in
            registration order; `ddpviz.bucket_plan` numbers them the same way).
        """
        return self.reducer.bucket_indices()

    def logging_data(self) -> dict[str, Any]:
        """torch's `_get_ddp_logging_data()`: construction settings and sampled runtime stats.

        Returns:
            A new flat dict of torch's keys ("world_size", "bucket_cap_bytes", "comm_hook",
            "avg_backward_compute_time", ...) to strings and ints; an error raised by
            `register_comm_hook` or the reducer is kept under "error".
        """
        return self._logger.data()

    _get_ddp_logging_data = logging_data

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first synced backward after it reduces them.

        As torch's: the forward must run inside the block too, else that backward syncs.

        Yields:
            None, once; run the forward and backward of each accumulated micro-batch in the
            `with` block.
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """Reduce buckets with `hook(state, bucket) -> Future[Tensor]`; see torch's docs. The
        bucket is a `ddpviz.engine.comm.GradBucket` (same methods as `dist.GradBucket`).

        Args:
            state: any object, passed as is to every call of `hook` on this rank (e.g. the
                process group, or an error-feedback state for compression).
            hook: called once per bucket when all its gradients are ready; returns a future
                of the reduced flat bucket tensor (same size and dtype as `bucket.buffer()`).
                torch's built-in hooks (`allreduce_hook`, `fp16_compress_hook`, ...) work.

        Raises:
            TypeError: `hook` is not callable, or is a bf16 hook without CUDA and NCCL 2.10+.
            ValueError: `hook`'s annotations are not `GradBucket` / `Future[torch.Tensor]`.
            RuntimeError: a comm hook is already registered (one per DDP module, as torch).
        """
        try:
            check_comm_hook(hook)
            self._logger.strs["comm_hook"] = getattr(hook, "__qualname__", repr(hook))
            self.reducer.register_comm_hook(state, hook)
        except (TypeError, ValueError, RuntimeError) as exc:
            self._logger.set_error(str(exc))  # torch's _log_and_throw: kept in logging_data
            raise
        self._comm_hooks.append((hook, state))

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                 dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        self._logger.strs["comm_hook"] = str(comm_hook_type)
        self.reducer.register_comm_hook(self.process_group, hooks[comm_hook_type])

    def _register_buffer_comm_hook(self, state: object, hook: Callable[..., Any],
                                   comm_hook_location: str = "post_forward") -> None:
        """Sync buffers with `hook(state, named_buffers)` before or after forward."""
        if not callable(hook):
            raise TypeError(f"ddpviz: buffer comm hook must be callable, got "
                            f"{type(hook).__name__}.")
        location = getattr(comm_hook_location, "name", str(comm_hook_location)).lower()
        self._buffer_hook = (hook, state, "pre" if location.startswith("pre") else "post")

    def _set_static_graph(self) -> None:
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.",
                          stacklevel=2)
            return
        self.static_graph = True
        self._static_graph_delay_allreduce_enqueued = False
        self.reducer.set_static_graph()
        self._logger.ints["static_graph"] = 1
        if self.find_unused_parameters:
            warnings.warn(
                "You passed find_unused_parameters=true to DistributedDataParallel, "
                "`_set_static_graph` will detect unused parameters automatically, so you do not "
                "need to set find_unused_parameters=true, just be sure these unused parameters "
                "will not change during training loop while calling `_set_static_graph`.",
                stacklevel=2)

    def _set_ddp_sink_clone(self, val: bool) -> None:
        self._ddp_sink_clone = val

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        if sample_rate < 1:
            raise ValueError("ddpviz: DDP runtime logging sample rate should be equal or greater "
                             "than 1")
        self._logger.sample_rate = sample_rate

    def _remove_autograd_hooks(self) -> None:
        self.reducer.remove_autograd_hooks()

    def _check_reducer_finalized(self) -> None:
        self.reducer.ensure_prior_reduction_finished()

    def train(self, mode: bool = True) -> Self:
        """Set training (or evaluation) mode on this module and the wrapped one, as
        `nn.Module.train` does (Dropout, BatchNorm behave accordingly).

        Args:
            mode: True: training mode; False: evaluation mode (as `eval()`).

        Returns:
            This DDP module, for chaining.
        """
        super().train(mode)
        return self

    # --- forward ------------------------------------------------------------------------------

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the wrapped module's forward the way torch's DDP does (call the DDP module, not
        this method): rebuild the buckets after the first iteration, broadcast buffers when
        `forward_sync_buffers` is set, move inputs to `device_ids[0]`, then arm the reducer
        for the backward (with `find_unused_parameters`, by walking the output's graph).

        Args:
            inputs, kwargs: passed on to the wrapped module's forward.

        Returns:
            What the wrapped module returned (its tensors passed through an identity autograd
            node where torch does so, with find_unused_parameters or static_graph).

        Raises:
            RuntimeError: the previous backward did not finish its reduction (torch's
                "Expected to have finished reduction in the prior iteration ...").
            RankHangError: this forward's buffer broadcast failed (a rank went away) or
                waited longer than `hang_timeout`; names the ranks that are missing.
        """
        with torch.autograd.profiler.record_function("DistributedDataParallel.forward"):
            inputs, kwargs = self._pre_forward(*inputs, **kwargs)
            if self._delay_all_reduce_all_params:
                output = self.module.forward(*inputs, **kwargs)
            else:
                output = self.module(*inputs, **kwargs)
            return self._post_forward(output)

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> tuple[Any, Any]:
        # tap.step counts grad-enabled forwards (no_sync micro-batches included), from 0.
        self._lazy_init_ran = True
        if self._delay_all_reduce_all_params:
            return inputs, kwargs
        grad_enabled = torch.is_grad_enabled()
        if grad_enabled:
            self._tap.step = self._forwards
            self._forwards += 1
            if self._debug is not None:  # a safe point: before this forward's collectives
                self._debug.forward(self._tap.step)
            if self.require_backward_grad_sync and (self.reducer.require_finalize
                                                    or self.reducer.deferred_error is not None):
                # The previous backward did not finish: torch raises here, before any
                # collective, and so does ddpviz (before the heartbeat, which would repeat
                # this rank's previous failure instead).
                self.reducer.prepare_for_forward()
                self.reducer.ensure_prior_reduction_finished()
            if self._watchdog is not None:
                self._watchdog.heartbeat(self._tap.step, "forward")
            if self._replicas is not None:  # See [Note: replica digests] (probes/replicas.py)
                self._replicas.before_forward(self._tap.step, self.will_sync_module_buffers)
                if not self.require_backward_grad_sync:
                    self._replicas.unsynced(self._tap.step)
            if self._opt is not None:
                self._opt.set(self._detail.full(self._tap.step))
            if self._contract is not None:
                self._contract.forward(self.require_backward_grad_sync)
        if self._tap.enabled:
            self._tap.emit(ForwardStarted)
        if grad_enabled and self.require_backward_grad_sync:
            self._logger.set_runtime_stats()
            self.reducer.prepare_for_forward()
        work = Join.notify_join_context(self)
        # (torch keeps the last join's handle after the context exits; it is dropped here so a
        # later iteration cannot divide by a stale count of non-joined ranks)
        self.reducer.forward_work = (work, self._divide_by_initial_world_size) if work else None
        if grad_enabled and self.reducer.rebuild_buckets():
            logger.info("Reducer buckets have been rebuilt in this iteration.")
            self._has_rebuilt_buckets = True
        if self._check_sync_bufs_pre_fwd():
            self._sync_buffers(grad_enabled)
        if self._join_config.enable:
            self._check_global_requires_backward_grad_sync(is_joined_rank=False)
        if self.device_ids:
            from torch.distributed.utils import _to_kwargs

            moved_inputs, moved_kwargs = _to_kwargs(
                inputs, kwargs, torch.device(self.device_type, self.device_ids[0]),
                self.use_side_stream_for_tensor_copies)
            inputs, kwargs = moved_inputs[0], moved_kwargs[0]
        if self.mixed_precision is not None:
            inputs, kwargs = self._mp.cast_inputs(inputs, kwargs)
        return inputs, kwargs

    def _post_forward(self, output: Any) -> Any:
        # See [Note: reducer timeline] (reducer.py) for what each call below arms.
        if self._delay_all_reduce_all_params:
            self._clear_grad_buffer()
            return output
        if self._check_sync_bufs_post_fwd():
            self._sync_buffers(torch.is_grad_enabled())
        if self._debug is not None and torch.is_grad_enabled():
            self._debug.after_forward(self._tap.step, output)
        if self._nf is not None and torch.is_grad_enabled():
            self._nf.forward(self._tap.step, output)
            if self.require_backward_grad_sync:
                self._nf.checking(self._tap.step)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            if self.find_unused_parameters and not self.static_graph:
                self.reducer.prepare_for_backward(list(find_tensors(output)))
            else:
                self.reducer.prepare_for_backward([])
                if not self.static_graph:
                    self.reducer.note_outputs_for_check(list(find_tensors(output)))
        else:
            self.require_forward_param_sync = False
        if (self.find_unused_parameters and not self.static_graph) or (
                self.static_graph and not self._static_graph_delay_allreduce_enqueued):
            output = pass_through_sink(output, self._sink_backward, clone=self._ddp_sink_clone)
        self._clear_grad_buffer()
        return output

    def _sink_backward(self) -> None:
        # Runs first in backward: static_graph's iteration 0 reduces everything at the end.
        if self.static_graph and not self._static_graph_delay_allreduce_enqueued:
            torch.autograd.Variable._execution_engine.queue_callback(self.reducer.delay_all_reduce)
            self._static_graph_delay_allreduce_enqueued = True

    # --- buffers ------------------------------------------------------------------------------

    def will_sync_module_buffers(self) -> bool:
        """Whether the next forward broadcasts the module's buffers (as torch's method).

        Returns:
            True when buffer syncing is on (`forward_sync_buffers`), the module has buffers, and
            the last backward synced (not inside `no_sync()`).
        """
        return (self.require_forward_param_sync and self.forward_sync_buffers
                and len(self.modules_buffers) > 0)

    def _check_sync_bufs_pre_fwd(self) -> bool:
        hook = getattr(self, "_buffer_hook", None)
        return self.will_sync_module_buffers() and (hook is None or hook[2] == "pre")

    def _check_sync_bufs_post_fwd(self) -> bool:
        hook = getattr(self, "_buffer_hook", None)
        return self.will_sync_module_buffers() and hook is not None and hook[2] == "post"

    def _sync_buffers(self, forward: bool | None = None) -> None:
        # forward: whether the forward it runs for has gradients (None: no forward's)
        with torch.no_grad():
            if self._join_config.enable:
                src = self._find_common_rank(self._distributed_rank, True)
            else:
                src = 0
            self._assign_modules_buffers()
            for finding in self._buffer_identity.check(self.named_module_buffers,
                                                       self._tap.step):
                self._warn(finding)
            # (for the ledger: See [Note: an evaluation on some ranks only])
            with buffer_sync(forward is False), torch.autograd._unsafe_preserve_version_counter(
                    tuple(self.modules_buffers)):
                self._sync_module_buffers(src)
        if self._replicas is not None:
            self._replicas.after_buffer_sync()

    def _warn(self, finding: Finding) -> None:
        if self._tap.enabled:
            self._tap.emit(FindingReported, finding)
        warnings.warn(finding.text(), DiagnosisWarning, stacklevel=3)

    def _sync_module_buffers(self, src: int) -> None:
        hook = getattr(self, "_buffer_hook", None)
        if hook is not None:
            futures = hook[0](hook[1], self.named_module_buffers)
            if futures is not None:
                self.reducer.install_futures(futures)
            return
        watchdog = self._watchdog
        try:
            broadcast_coalesced(self.modules_buffers, self.process_group, src=src,
                                chunk_bytes=self.broadcast_bucket_size, tap=self._tap,
                                wait=None if watchdog is None else
                                watchdog.waiter("buffer broadcast"))
        except RuntimeError as exc:  # a rank is gone or hangs: name it
            if watchdog is None:
                raise
            raise watchdog.failed(exc, collective="buffer broadcast") from exc
        if self._tap.enabled:
            self._tap.emit(BuffersSynced, len(self.modules_buffers),
                           sum(b.numel() * b.element_size() for b in self.modules_buffers))

    # --- join (uneven inputs) -----------------------------------------------------------------

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """torch's `DistributedDataParallel.join`: a `Join` context for uneven inputs. A rank that
        runs out of inputs inside it shadows the others' all-reduces and buffer broadcasts
        until every rank has joined; then the last joiner's model is broadcast to all.

        Args:
            divide_by_initial_world_size: divide gradients by the world size DDP started with
                (every input weighs the same); False: by the number of ranks that have not
                joined yet.
            enable: False turns uneven-input detection off (for inputs known to be even).
            throw_on_early_termination: raise on every rank as soon as one rank runs out of
                inputs, instead of shadowing (`divide_by_initial_world_size` is then ignored);
                needed when the training loop has collectives of its own (SyncBatchNorm).

        Returns:
            The `Join` context manager; wrap the training loop in it.
        """
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The hook `Join` calls on a rank that ran out of inputs (the `Joinable` interface;
        `join()` uses it): it matches the other ranks' all-reduces and buffer broadcasts.

        Args:
            kwargs: the `Join` context's keyword arguments; only `divide_by_initial_world_size`
                (default True, as in `join()`) is read.

        Returns:
            The join hook of this DDP module.
        """
        return _DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        """The device `Join`'s collectives run on, this module's device (the `Joinable`
        interface)."""
        return self.device

    @property
    def join_process_group(self) -> Any:
        """The process group `Join`'s collectives run in, this DDP's `process_group` (the
        `Joinable` interface)."""
        return self.process_group

    @property
    def _distributed_rank(self) -> int:
        return self.process_group.rank()

    def _check_global_requires_backward_grad_sync(self, is_joined_rank: bool) -> bool | None:
        value = 1.0 if (not is_joined_rank and self.require_backward_grad_sync) else 0.0
        flag = torch.full((1,), value, device=self.device)
        work = dist.all_reduce(flag, group=self.process_group, async_op=True)
        if not is_joined_rank:
            return None
        assert work is not None
        work.wait()
        return bool(flag.item() != 0)

    def _check_and_sync_module_buffers(self) -> None:
        if self._check_sync_bufs_pre_fwd():
            self._sync_module_buffers(self._find_common_rank(self._distributed_rank, False))

    def _find_common_rank(self, input_rank: int, rank_cond: bool) -> int:
        t = torch.tensor([input_rank if rank_cond else -1], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.process_group)
        if t.item() == -1:
            raise ValueError("ddpviz: BUG! Expected rank_cond to be true for at least one "
                             "process.")
        return int(t.item())

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        self._authoritative_rank = self._find_common_rank(self._distributed_rank,
                                                          is_last_joiner)
        self._broadcast_state(src=self._authoritative_rank, buffers=self.forward_sync_buffers)

    def _match_all_reduce_for_bwd_pass(self) -> None:
        futures = [self.reducer.run_comm_hook(b) for b in self.reducer.zeros_like_grad_buckets()]
        for fut in futures:
            fut.wait()

    def _match_unused_params_allreduce(self) -> None:
        dist.all_reduce(self.reducer.get_local_used_map(), group=self.process_group)

    # --- torch compatibility ------------------------------------------------------------------
    # De facto API: private by name in torch, called by libraries and torch's own tests.

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(
            module: nn.Module, params_and_buffers_to_ignore: Any) -> None:
        """Names (dotted) of parameters and buffers DDP leaves alone; call before wrapping."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore
        for name, param in module.named_parameters():
            if name in params_and_buffers_to_ignore:
                param._ddp_ignored = True  # type: ignore[attr-defined]
        for name, buffer in module.named_buffers():
            if name in params_and_buffers_to_ignore:
                buffer._ddp_ignored = True  # type: ignore[attr-defined]

    @staticmethod
    def _get_data_parallel_params(module: nn.Module, named_params: bool = False) -> Iterator[Any]:
        """The parameters of `module` that DDP manages (not marked ignored). As in torch, with
        named_params=True the check looks at the (name, param) pair, so nothing is filtered."""
        for item in (module.named_parameters() if named_params else module.parameters()):
            if not hasattr(item, "_ddp_ignored"):
                yield item

    def _build_params_for_reducer(self) -> tuple[list[nn.Parameter], list[bool]]:
        """torch's: (parameters the reducer reduces, whether each expects a sparse gradient);
        re-reads the module's buffers as a side effect, as torch does."""
        entries = build_params_for_reducer(self.module, self.parameters_to_ignore)
        self._assign_modules_buffers()
        return [e.param for e in entries], [e.sparse_grad for e in entries]

    def _build_debug_param_to_name_mapping(self, parameters: list[Any]) -> dict[int, str]:
        """Reducer index -> dotted name, checked against the module (torch's)."""
        index_of = {p: i for i, p in enumerate(parameters)}
        mapping: dict[int, str] = {}
        for module_name, sub in self.module.named_modules():
            for param_name, param in sub.named_parameters(recurse=False):
                fqn = f"{module_name}.{param_name}"
                if fqn in self.parameters_to_ignore or not param.requires_grad:
                    continue
                if param not in index_of:
                    self._log_and_throw(ValueError, (
                        f"ddpviz: Param with name {fqn} found in module parameters, but not DDP "
                        "parameters. The list passed in must come from "
                        "_build_params_for_reducer()."))
                mapping[index_of[param]] = fqn
        if len(set(parameters)) != len(mapping):
            self._log_and_throw(ValueError, (
                "ddpviz: Expected param to name mapping to cover all parameters, but got "
                f"conflicting lengths: {len(set(parameters))} vs {len(mapping)}. The list "
                "passed in must be exactly _build_params_for_reducer()'s."))
        return mapping

    def _log_and_throw(self, err_type: type[Exception], err_msg: str) -> None:
        """Record the error in the logging data (has_error/error), then raise it (torch's)."""
        logger_ = getattr(self, "_logger", None)
        if logger_ is not None:
            logger_.set_error(err_msg)
        raise err_type(err_msg)

    def _default_broadcast_coalesced(self, bufs: list[torch.Tensor] | None = None,
                                     bucket_size: int | None = None,
                                     authoritative_rank: int = 0) -> None:
        """Broadcast `bufs` (default: the module's buffers) from `authoritative_rank`."""
        broadcast_coalesced(self.modules_buffers if bufs is None else list(bufs),
                            self.process_group, src=authoritative_rank,
                            chunk_bytes=(self.broadcast_bucket_size if bucket_size is None
                                         else bucket_size), tap=self._tap)

    def _distributed_broadcast_coalesced(self, tensors: list[torch.Tensor], buffer_size: int,
                                         authoritative_rank: int = 0) -> None:
        broadcast_coalesced(list(tensors), self.process_group, src=authoritative_rank,
                            chunk_bytes=buffer_size, tap=self._tap)

    def scatter(self, inputs: Any, kwargs: Any, device_ids: Any) -> Any:
        """Split inputs along `dim` across devices, as torch's `scatter_kwargs` (kept for
        torch's API: one device per process needs no scatter).

        Args:
            inputs: the positional inputs (a tuple).
            kwargs: the keyword inputs (a dict).
            device_ids: the devices to scatter onto.

        Returns:
            Two tuples of the same length, the inputs per device and the kwargs per device.
        """
        from torch.nn.parallel.scatter_gather import scatter_kwargs

        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def to_kwargs(self, inputs: Any, kwargs: Any, device_id: int) -> Any:
        """Move inputs and kwargs to device `device_id` of this DDP's device type, as torch's
        `to_kwargs` (kept there for backward compatibility, and here for torch's API).

        Args:
            inputs: the positional inputs (a tuple).
            kwargs: the keyword inputs (a dict).
            device_id: the device index.

        Returns:
            The inputs and the kwargs on that device, each in a one-element tuple (as torch's).
        """
        from torch.distributed.utils import _to_kwargs

        return _to_kwargs(inputs, kwargs, torch.device(self.device_type, device_id),
                          self.use_side_stream_for_tensor_copies)

    def gather(self, outputs: Any, output_device: Any) -> Any:
        """Concatenate per-device outputs along `dim` onto one device, as torch's `gather`
        (kept for torch's API).

        Args:
            outputs: one output per device (tensors, or the same nesting of them).
            output_device: the device the result goes to.

        Returns:
            The outputs gathered into one, with the nesting of each output.
        """
        from torch.nn.parallel.scatter_gather import gather

        return gather(outputs, output_device, dim=self.dim)

    def __getstate__(self) -> dict[str, Any]:
        # As torch: only with the default group; the reducer is rebuilt on unpickling.
        if self.process_group is not dist.group.WORLD:
            raise RuntimeError("ddpviz: DDP Pickling/Unpickling are only supported when using "
                               "DDP with the default process group. Pickle .module instead.")
        state = dict(self.__dict__)
        # Everything that holds the process group, a store or a thread is rebuilt on loading.
        for key in ("process_group", "reducer", "_logger", "_tap", "_watchdog",
                    "_buffer_identity", "_nf", "_replicas", "_opt", "_contract"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.process_group = dist.group.WORLD
        super().__setstate__(state)
        self.__dict__.setdefault("require_forward_param_sync", True)
        self.__dict__.setdefault("require_backward_grad_sync", True)
        if "_detail" not in self.__dict__:
            self._detail = DetailPolicy.of(resolve_recording(None, where="torch.load"))
        self._tap = Tap(None, rank=self.process_group.rank())
        # Unpickling happens on one rank at a time (torch.load): no constructor meeting point,
        # no deadlines (hang_timeout=0).
        self._watchdog = self._observers.guard(self.process_group, 0, self._tap)
        self._replicas = None
        entries = build_params_for_reducer(self.module, self.parameters_to_ignore)
        static = self.static_graph
        self.static_graph = False
        self._build_reducer(entries, static)
        if static:
            self._set_static_graph()
        if self.__dict__.setdefault("_require_manual_backward_finalization", False):
            self.require_manual_backward_finalization = True

    # --- manual backward finalization (torch 2.15) ------------------------------------------

    @property
    def require_manual_backward_finalization(self) -> bool:
        """Whether the caller must call ``finalize_backward()`` after each synced backward
        (torch 2.15; an AttributeError on older torch, as there)."""
        if not has_method("require_manual_backward_finalization"):
            raise missing_attribute("require_manual_backward_finalization")
        return self._require_manual_backward_finalization

    @require_manual_backward_finalization.setter
    def require_manual_backward_finalization(self, required: bool) -> None:
        if not has_method("require_manual_backward_finalization"):
            raise missing_attribute("require_manual_backward_finalization")
        if required:
            self._check_manual_backward_finalization_supported()
        if self._delay_all_reduce_all_params:
            return  # no reducer (and manual mode was refused above)
        self.reducer._set_manual_finalization_required(required)
        self._require_manual_backward_finalization = required

    def _check_manual_backward_finalization_supported(self) -> None:
        if self._delay_all_reduce_all_params:
            raise RuntimeError("Manual backward finalization is not supported when all DDP "
                               "parameters use delay_all_reduce_named_params.")

    @property
    def should_finalize_after_backward(self) -> bool:
        """In manual mode, whether ``finalize_backward()`` must wait until backward returns
        (buckets are being rebuilt, or mixed precision), as torch 2.15's."""
        if not has_method("should_finalize_after_backward"):
            raise missing_attribute("should_finalize_after_backward")
        if not self._require_manual_backward_finalization:
            return False
        return self.mixed_precision is not None or \
            self.reducer._should_finalize_after_backward()

    @since_torch_215
    def finalize_backward(self) -> None:
        """Finish a synced backward in manual mode: wait for every bucket's all-reduce and
        write the averaged gradients to ``.grad`` (torch 2.15).

        Raises:
            AttributeError: the installed torch has no manual backward finalization.
            RuntimeError: manual finalization is off, nothing awaits finalization (no_sync, or
                already finalized), or buckets are not all ready yet.
        """
        self._check_manual_backward_finalization_supported()
        self.reducer._finalize_backward_manual()


def _finding_callback(ref: weakref.ReferenceType[DistributedDataParallel]
                      ) -> Callable[[int], None]:
    """A finding at `step`: the sampled level records that step in full (see recording.py)."""
    def on_finding(step: int) -> None:
        ddp = ref()
        if ddp is None:
            return
        reducer = ddp.__dict__.get("reducer")
        if reducer is not None:
            reducer.note_finding(step)
        else:
            ddp._detail.note_finding(step)
    return on_finding
