"""What a bucket's reduction looks like from outside: the GradBucket a comm hook receives, the
default all-reduce, and how a hook's result is read back (walk-through step 6).

`GradBucket` mirrors `torch.distributed.GradBucket` method for method, so torch's own hooks
(`default_hooks.allreduce_hook`, `fp16_compress_hook`, PowerSGD) run on it unchanged.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

CommHook = Callable[[Any, "GradBucket"], torch.futures.Future]


class GradBucket:
    """The view of one bucket a comm hook gets (torch's `dist.GradBucket`, in Python)."""

    __slots__ = ("_bucket_count", "_buffer", "_index", "_lengths", "_offsets", "_parameters",
                 "_sizes")

    def __init__(self, index: int, bucket_count: int, buffer: torch.Tensor,
                 offsets: Sequence[int], lengths: Sequence[int],
                 sizes: Sequence[torch.Size], parameters: Sequence[torch.Tensor]) -> None:
        self._index = index
        self._bucket_count = bucket_count
        self._buffer = buffer
        self._offsets = offsets
        self._lengths = lengths
        self._sizes = sizes
        self._parameters = parameters

    def index(self) -> int:
        """Position of this bucket in reduction order (0 is reduced first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat gradient tensor itself (not a copy): in-place edits reach the bucket."""
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        """One contiguous view per parameter into `buffer()` (empty for a sparse bucket)."""
        return [self._buffer[o:o + n].view(s)
                for o, n, s in zip(self._offsets, self._lengths, self._sizes, strict=True)]

    def parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients this bucket holds, in bucket order."""
        return list(self._parameters)

    def is_last(self) -> bool:
        """True for the bucket reduced last in an iteration."""
        return self._index == self._bucket_count - 1

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the tensor `buffer()` returns (torch's hooks use it to swap in results)."""
        self._buffer = buffer


class _Launch(threading.local):
    bucket = -1  # the bucket whose comm hook runs on this thread, else -1
    # a DDP's buffer broadcast runs on this thread: BUFFERS, or EVALUATION when it runs for a
    # forward without gradients (torch.no_grad(): an evaluation or generation); else 0
    forward = 0
    evaluating = False  # a DDP forward without gradients runs on this thread (watch() sets it)


BUFFERS = 1
EVALUATION = 2


# Which DDP bucket's all-reduce is being launched on this thread: the reducer sets it around
# the comm hook, so that a ledger of the job's collectives (probes/collectives.py) can name
# the collectives a hook issues as that bucket's; and whether a DDP's buffer broadcast runs,
# for a forward with or without gradients (See [Note: an evaluation on some ranks only],
# probes/collective_check.py). Read, never required.
LAUNCH = _Launch()


@contextlib.contextmanager
def buffer_sync(evaluation: bool) -> Iterator[None]:
    """Mark the collectives this thread issues in the block as a DDP's buffer broadcast, for a
    forward without gradients (`evaluation`) or a training one."""
    LAUNCH.forward = EVALUATION if evaluation else BUFFERS
    try:
        yield
    finally:
        LAUNCH.forward = 0


def allreduce_sum(process_group: dist.ProcessGroup, bucket: GradBucket) -> torch.futures.Future:
    """The reducer's built-in reduction: an async SUM all-reduce of the (pre-divided) buffer."""
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    assert work is not None
    return work.get_future()


def hook_result(value: Any) -> torch.Tensor:
    """The tensor a comm hook's future resolved to (a tensor, or a list holding one)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    raise TypeError(
        f"ddpviz: the comm hook's future resolved to {type(value).__name__}; expected a tensor "
        "shaped like bucket.buffer() (or a list holding one). Return "
        "fut.then(lambda f: f.value()[0]) from the hook.")


def check_comm_hook(hook: Callable[..., Any]) -> None:
    """torch's `_check_comm_hook`: callable, annotations if any are GradBucket / Future[Tensor],
    and the bf16 hooks only where CUDA 11+ and NCCL 2.10+ (or XPU and XCCL) exist."""
    if not callable(hook):
        raise TypeError("ddpviz: Communication hook must be callable; got "
                        f"{type(hook).__name__}.")
    sig = inspect.signature(hook)
    bucket_ann = sig.parameters["bucket"].annotation if "bucket" in sig.parameters else (
        inspect.Parameter.empty)
    if isinstance(bucket_ann, str):  # postponed annotations (from __future__ import ...)
        bucket_ann = GradBucket if bucket_ann.split(".")[-1] == "GradBucket" else bucket_ann
    if bucket_ann not in (inspect.Parameter.empty, dist.GradBucket, GradBucket):
        raise ValueError("ddpviz: Communication hook: bucket annotation should be dist.GradBucket.")
    returns = sig.return_annotation
    if isinstance(returns, str) and returns.replace(" ", "").endswith("Future[torch.Tensor]"):
        returns = torch.futures.Future[torch.Tensor]
    if returns not in (inspect.Signature.empty, torch.futures.Future[torch.Tensor]):
        raise ValueError("ddpviz: Communication hook: return annotation should be "
                         "torch.futures.Future[torch.Tensor].")
    if getattr(hook, "__name__", "") in ("bf16_compress_hook", "bf16_compress_wrapper_hook"):
        cuda = torch.version.cuda is not None or torch.version.hip is not None
        nccl = dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
        xccl = (hasattr(dist, "is_xccl_available") and dist.is_xccl_available()
                and torch.xpu.is_available())
        if not ((cuda and nccl) or xccl):
            raise TypeError("ddpviz: BF16 all reduce communication hook required CUDA 11+ and NCCL "
                            "2.10+ or XPU and XCCL; use fp16_compress_hook on this machine.")
