"""`measure(process_group)`: a short all-reduce microbenchmark that fits a cost model.

Run it on every rank of the group (it is a collective): all-reduces of a few sizes per dtype,
timed on each rank, the slowest rank's median per size fitted to latency + bytes / bandwidth.
Use it where the recorded run's buckets have too few distinct sizes to fit both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from ddpviz.advisor.costmodel import CostModel, Line
from ddpviz.advisor.source import AdviceError

SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)  # bytes
MAX_BYTES = 1 << 30


def _fit(points: Sequence[tuple[int, float]]) -> Line:
    """Least squares of seconds = latency + bytes * seconds_per_byte (both clipped at 0)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
    slope = max(slope, 0.0)
    return Line(max(my - slope * mx, 0.0), slope)


def measure(process_group: Any = None, *, sizes: Sequence[int] = SIZES,
            dtypes: Sequence[str] = ("float32",), repeats: int = 5) -> CostModel:
    """Time all-reduces of `sizes` bytes per dtype on `process_group` and fit latency and
    bandwidth. A collective: call it on every rank.

    Args:
        process_group: the group to time (None: the default group).
        sizes: message sizes in bytes, at least 2 distinct ones in (0, 1 GiB].
        dtypes: dtype names to time, e.g. "float32", "bfloat16".
        repeats: all-reduces timed per size and dtype (their median on the slowest rank counts).

    Returns:
        A `CostModel` for `ddpviz.advise(run, cost_model=...)`.

    Raises:
        AdviceError: without an initialized process group, or with unusable sizes.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise AdviceError("ddpviz: measure() needs an initialized process group.\nCall it on "
                          "every rank after torch.distributed.init_process_group(...).")
    sizes = [int(s) for s in sizes]
    if len(set(sizes)) < 2 or any(s <= 0 or s > MAX_BYTES for s in sizes):
        raise AdviceError(f"ddpviz: measure() needs at least 2 distinct sizes in (0, 1 GiB] "
                          f"bytes; got {sizes}.")
    if repeats < 1:
        raise AdviceError(f"ddpviz: repeats must be >= 1; got {repeats}.")
    backend = dist.get_backend(process_group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else \
        torch.device("cpu")
    lines: dict[str, Line] = {}
    for name in dtypes:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise AdviceError(f"ddpviz: measure() got unknown dtype {name!r}; use names like "
                              "'float32' or 'bfloat16'.")
        points = []
        for nbytes in sizes:
            t = torch.ones(max(1, nbytes // torch.empty((), dtype=dtype).element_size()),
                           dtype=dtype, device=device)
            dist.all_reduce(t, group=process_group)  # warm-up
            times = []
            for _ in range(repeats):
                dist.barrier(group=process_group)
                start = time.perf_counter()
                dist.all_reduce(t, group=process_group)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
            mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=process_group)
            points.append((t.numel() * t.element_size(), float(mine.item())))
        lines[name] = _fit(points)
    return CostModel(lines, "measured", {d: len(sizes) for d in dtypes}, 0,
                     (f"measured with {len(sizes)} sizes x {repeats} repeats on {backend}",),
                     separable=True)
