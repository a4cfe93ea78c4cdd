"""What the advisor's multi-rank tests run on each rank (spawned ranks import this module)."""

from __future__ import annotations

import itertools
from typing import Any

from tests.recordings import recording


def mlp(widths: tuple[int, ...] = (32, 64, 64, 64, 8)) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def record_ddpviz(rank: int, world_size: int, steps: int, cap_mb: float | None,
                  torch_ddp: bool = False) -> dict[str, Any]:
    """Train `steps` steps of ddpviz's DDP (or torch's, watched) with events kept in a list;
    return the events."""
    import torch

    import ddpviz

    events: list[Any] = []
    model = mlp()
    if torch_ddp:
        ddp: Any = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
        watch = ddpviz.watch(ddp, emitter=events.append, recording=recording("full"))
    else:
        ddp = ddpviz.DistributedDataParallel(model, bucket_cap_mb=cap_mb, emitter=events.append,
                                             recording=recording("full"))
        watch = None
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    for _ in range(steps):
        loss = ddp(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if watch is not None:
        watch.close()
    return {"events": events, "torch_rebuilt": _torch_rebuilt(ddp) if torch_ddp else None}


def _torch_rebuilt(ddp: Any) -> list[list[int]]:
    logged = ddp._get_ddp_logging_data()
    return [[int(i) for i in b.split()]
            for b in str(logged["rebuilt_per_bucket_param_indices"]).split(",")]


def torch_buckets(rank: int, world_size: int, cap_mb: float | None,
                  cap_list: list[float] | None = None) -> list[list[int]]:
    """The bucket map torch's own DDP rebuilt to (logged after 3 steps) with these settings."""
    import torch

    model = mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb,
                                                    bucket_cap_mb_list=cap_list)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    for _ in range(3):
        loss = ddp(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return _torch_rebuilt(ddp)


def measure_costs(rank: int, world_size: int) -> dict[str, Any]:
    """ddpviz.advisor.measure on the default group: the fitted line per dtype."""
    import ddpviz

    model = ddpviz.advisor.measure(sizes=(4096, 65536, 1 << 20), dtypes=("float32", "bfloat16"),
                                  repeats=3)
    return {"source": model.source, "separable": model.separable,
            "lines": {d: (ln.latency_s, ln.seconds_per_byte) for d, ln in model.lines.items()}}
