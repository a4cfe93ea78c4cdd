"""Rank side of notebooks/02_engine.ipynb: train one small model under torch's DDP and under
ddpviz's on the same gloo ranks, and send back what the notebook shows.

Spawned processes cannot run functions defined in a notebook cell (plain pickle looks them up
in `__main__`), so the rank function lives in this importable module.
"""

from __future__ import annotations

import copy
import os
import queue
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def make_model(seed: int) -> nn.Module:
    """A four-layer MLP; rank-dependent seeds give each rank different initial values."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def _train(ddp: Any, module: nn.Module, rank: int, steps: int) -> list[list[list[int]]]:
    """SGD steps; returns the bucket map after each backward where the DDP exposes one."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    maps = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        x, y = _batch(rank, step)
        nn.functional.mse_loss(ddp(x), y).backward()
        if hasattr(ddp, "bucket_indices"):
            maps.append([list(b) for b in ddp.bucket_indices()])
        opt.step()
    return maps


def _event_row(event: Any) -> tuple[str, dict[str, Any]]:
    import msgspec

    return type(event).__name__, msgspec.structs.asdict(event)


def _rank(rank: int, world_size: int, port: int, steps: int, bucket_cap_mb: float,
          q: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        import ddpviz

        base = make_model(seed=rank)  # different on each rank: the constructor broadcasts
        torch_module, viz_module = copy.deepcopy(base), copy.deepcopy(base)
        torch_ddp = torch.nn.parallel.DistributedDataParallel(torch_module,
                                                              bucket_cap_mb=bucket_cap_mb)
        _train(torch_ddp, torch_module, rank, steps)
        events: list[Any] = []
        viz_ddp = ddpviz.DistributedDataParallel(viz_module, bucket_cap_mb=bucket_cap_mb,
                                                 emitter=events.append)
        viz_maps = _train(viz_ddp, viz_module, rank, steps)
        logged = torch_ddp._get_ddp_logging_data()
        names = [n for n, _ in torch_module.named_parameters()]
        equal = {n: torch.equal(a, b) for (n, a), b in
                 zip(torch_module.named_parameters(), viz_module.parameters(), strict=True)}
        q.put((rank, {
            "param_names": names,
            "bitwise_equal": equal,
            "torch_bucket_bytes": logged["bucket_sizes"],
            "torch_rebuilt_bucket_bytes": logged["rebuilt_bucket_sizes"],
            "torch_rebuilt_map": logged["rebuilt_per_bucket_param_indices"],
            "ddpviz_maps": viz_maps,
            "events": [_event_row(e) for e in events],
        }))
    except BaseException as e:
        q.put((rank, f"{type(e).__name__}: {e}"))
        raise
    finally:
        dist.destroy_process_group()


def run(world_size: int = 2, steps: int = 5, bucket_cap_mb: float = 0.005,
        timeout: float = 60) -> dict[int, dict[str, Any]]:
    """Spawn `world_size` gloo ranks, train under both DDPs, return {rank: results}."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world_size, port, steps, bucket_cap_mb, q))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, value = q.get(timeout=timeout)
            results[rank] = value
    except queue.Empty:
        raise RuntimeError(f"ranks {sorted(set(range(world_size)) - set(results))} did not "
                           f"report within {timeout} s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    failed = {r: v for r, v in results.items() if isinstance(v, str)}
    if failed:
        raise RuntimeError("; ".join(f"rank {r}: {v}" for r, v in sorted(failed.items())))
    return dict(sorted(results.items()))
