"""The CPU shim for GPU-decorated tests of torch's DDP suite (conformance runs only).

torch's tests decorated with `skip_if_lt_x_gpu` / `skip_if_no_gpu` mostly exercise DDP logic
that does not depend on the device (static_graph, hooks, logging, errors). On a CPU machine the
shim lets them run: `torch.cuda` reports `count` devices, `.cuda()` / `.to("cuda")` / any
`device="cuda..."` argument resolve to the CPU, `torch.cuda.set_device` / `synchronize` do
nothing, and DDP's `device_ids` / `output_device` are dropped for CPU modules (torch's DDP
rejects them there). It is installed in every rank for both engines, so a test counts only if
it passes with torch's own DDP under the same shim; tests whose logic needs a real device
(streams, memory stats, NCCL, device placement checks) fail with torch too and do not count.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


def _cpu(device: Any) -> Any:
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


class _CudaAsCpu(TorchFunctionMode):
    """Rewrites cuda device arguments of every torch call to the CPU."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if func in (torch.Tensor.to, torch.Tensor.cuda) or getattr(func, "__name__", "") == "to":
            args = tuple(_cpu(a) if not isinstance(a, torch.Tensor) else a for a in args)
        return func(*args, **kwargs)


def _drop_device_ids(cls: type) -> None:
    init = cls.__init__
    if getattr(init, "_cpu_shim", False):
        return

    @functools.wraps(init)
    def shimmed(self: Any, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        on_cpu = all(p.device.type == "cpu" for p in module.parameters())
        if on_cpu:
            if args:  # device_ids, output_device are the first two positional arguments
                args = (None, None, *args[2:]) if len(args) >= 2 else (None,)
            kwargs.pop("device_ids", None)
            kwargs.pop("output_device", None)
        init(self, module, *args, **kwargs)

    shimmed._cpu_shim = True  # type: ignore[attr-defined]
    cls.__init__ = shimmed


def install(count: int, ddp_classes: list[type]) -> None:
    """Makes this process look like it has `count` GPUs that are the CPU (see module doc)."""
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: count
    torch.cuda.set_device = lambda device: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.empty_cache = lambda: None
    # A CUDA build of torch (PyPI's 2.14/2.15 wheels) has triton: with the GPUs claimed above,
    # torch's test harness asks whether triton can run, which reads a real device's properties
    # ("Found no NVIDIA driver" at every test's setUp). The CPU runs no triton kernel.
    import torch.utils._triton as triton

    triton.has_triton = lambda: False
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    nn.Module.cuda = lambda self, device=None: self  # type: ignore[method-assign]
    module_to = nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        args = tuple(_cpu(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return module_to(self, *args, **kwargs)

    nn.Module.to = to  # type: ignore[method-assign]
    for cls in ddp_classes:
        _drop_device_ids(cls)
    _CudaAsCpu().__enter__()
