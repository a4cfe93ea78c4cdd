"""DDP-native mixed precision (torch's experimental `_MixedPrecision`): parameters cast to
`param_dtype` before each forward, gradients reduced in `reduce_dtype`, both back in full
precision before the optimizer step. torch 2.13's design (root pre-forward copy, hooks on the
low-precision accumulators, an all-reduce-and-upcast comm hook); torch's copy events need an
accelerator (on CPU it fails: "cpu backend doesn't support events"), here CPU copies inline.
"""

from __future__ import annotations

import weakref
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed._functional_collectives  # _free_storage needs it loaded
from torch.distributed.utils import _alloc_storage, _cast_forward_inputs, _free_storage

from ddpviz.engine.comm import GradBucket, allreduce_sum

if TYPE_CHECKING:
    from ddpviz.engine.ddp import DistributedDataParallel


def _ignored(t: torch.Tensor) -> bool:
    return bool(getattr(t, "_ddp_ignored", False))


class MixedPrecisionState:
    """Owns the low-precision copies and hooks of one DDP module."""

    def __init__(self, ddp: DistributedDataParallel, config: Any) -> None:
        self.ddp = weakref.ref(ddp)
        self.config = config
        module = ddp.module
        for p in module.parameters():
            if _ignored(p) or hasattr(p, "_mp_param"):
                continue
            p._mp_param = torch.zeros_like(  # type: ignore[attr-defined]
                p, device=p.device, dtype=config.param_dtype, requires_grad=p.requires_grad)
            _free_storage(p._mp_param)  # type: ignore[attr-defined]
            p._fp_param = p.data  # type: ignore[attr-defined]
        for buf in module.buffers():
            if not _ignored(buf):
                buf.data = buf.to(dtype=config.buffer_dtype)
        accelerated = ddp.device.type not in ("cpu", "meta")
        self.copy_stream = torch.Stream() if accelerated else None
        self.upcast_stream = torch.Stream() if accelerated else None
        self.events: dict[torch.nn.Module, deque[Any]] = defaultdict(deque)
        self.wait_enqueued = False
        self.index = {id(p): i for i, p in enumerate(ddp.reducer.params)}
        module.register_forward_pre_hook(self._root_copy_hook, prepend=False, with_kwargs=True)
        for sub in module.modules():
            sub.register_forward_pre_hook(self._module_wait_hook, prepend=False,
                                          with_kwargs=True)
        ddp.register_comm_hook(self, allreduce_and_upcast_hook)
        ddp.reducer.mixed_precision_param_dtype = config.param_dtype

    def cast_inputs(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        return _cast_forward_inputs(self.config.param_dtype, *args, **kwargs)

    def _root_copy_hook(self, *args: Any, **kwargs: Any) -> None:
        ddp = self.ddp()
        assert ddp is not None
        self.events = defaultdict(deque)
        for sub in ddp.module.modules():
            with self.copy_stream if self.copy_stream is not None else _null():
                for p in sub.parameters(recurse=False):
                    if _ignored(p):
                        continue
                    mp = p._mp_param  # type: ignore[attr-defined]
                    _alloc_storage(mp, p.size())
                    with torch.no_grad():
                        mp.copy_(p.data)
                        if p.grad is not None:
                            p.grad.data = p.grad.to(self.config.param_dtype)
                    p.data = mp
                if self.copy_stream is not None:
                    event = torch.Event()
                    event.record()
                    self.events[sub].append(event)

    def _module_wait_hook(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        ddp = self.ddp()
        assert ddp is not None
        queue = self.events.get(module)
        if self.copy_stream is not None:
            if not queue:
                return
            queue.popleft().wait(stream=torch.accelerator.current_stream())
        elif module in self.events:
            return
        else:
            self.events[module].append(None)  # hooks registered once per forward
        for p in module.parameters(recurse=False):
            if not p.requires_grad or _ignored(p) or id(p) not in self.index:
                continue
            # The dtype change reset the parameter's gradient accumulator, so the reducer's
            # construction-time hooks are not in this graph: hook the new accumulator.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]  # type: ignore[union-attr]
            assert acc is not None
            index = self.index[id(p)]
            handle = acc.register_hook(lambda *_, i=index: ddp.reducer.autograd_hook(i))
            p._ddp_mp_hook_state = (acc, handle)  # type: ignore[attr-defined]

    def after_backward(self) -> None:
        ddp = self.ddp()
        assert ddp is not None
        if self.upcast_stream is not None:
            torch.accelerator.current_stream().wait_stream(self.upcast_stream)
        for _, p in ddp.module.named_parameters():
            if hasattr(p, "_ddp_mp_hook_state"):
                p._ddp_mp_hook_state[1].remove()
                delattr(p, "_ddp_mp_hook_state")
            if not p.requires_grad and not _ignored(p):
                p.data = p._fp_param  # type: ignore[attr-defined]
        self.wait_enqueued = False


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def allreduce_and_upcast_hook(state: MixedPrecisionState,
                              bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Reduce in `reduce_dtype`, average, then put parameters and gradients back in full
    precision for the optimizer (torch's `_reducer_allreduce_and_upcast_hook`)."""
    ddp = state.ddp()
    assert ddp is not None
    if state.config.param_dtype != state.config.reduce_dtype:
        bucket.set_buffer(bucket.buffer().to(state.config.reduce_dtype))
    fut = allreduce_sum(ddp.process_group, bucket)
    result: torch.futures.Future = torch.futures.Future()
    with state.upcast_stream if state.upcast_stream is not None else _null():
        fut.wait()
        bucket.buffer().div_(ddp.process_group.size())
        result.set_result(bucket.buffer())
        for p in bucket.parameters():
            p.data = p._fp_param  # type: ignore[attr-defined]
            _free_storage(p._mp_param)  # type: ignore[attr-defined]
            if p.grad is not None:
                p.grad.data = p.grad.to(p.data.dtype)
    if not state.wait_enqueued:
        torch.autograd.Variable._execution_engine.queue_callback(state.after_backward)
        state.wait_enqueued = True
    return result
