"""Spawn a benchmark's gloo ranks and collect what each reports (shared by the benchmarks).

`run_ranks(target, world, *args)` starts `world` spawned processes running
`target(rank, world, port, *args, out)`; each puts `(rank, result)` on `out`. Returns
{rank: result}; exits with a message if the ranks do not report in time, and never leaves a
process behind.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(target: Callable[..., None], world: int, *args: Any,
              timeout: float = 1800) -> dict[int, Any]:
    port = free_port()
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, result = out.get(timeout=timeout)
            results[rank] = result
    except queue.Empty:
        raise SystemExit(f"ddpviz: benchmark ranks did not report within {timeout:.0f} s") \
            from None
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
    return results


def join_gloo(rank: int, world: int, port: int, *, pin: bool = True) -> None:
    """Join the benchmark's gloo group on this machine; `pin`: this rank's training thread
    (and threads started later: ddpviz's, a Sender's) on core rank % cores, gloo's threads,
    started before, free to run anywhere (see bench_watch.py); torch on one thread."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    if pin:
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)


class Timings(NamedTuple):
    wall: dict[str, list[float]]  # seconds per block, per variant
    cpu: dict[str, list[float]]  # the process's CPU time per block (every thread)
    thread: dict[str, list[float]]  # the training thread's CPU time per block


def interleaved_blocks(variants: dict[str, Any], rank: int, dims: tuple[int, ...], *, reps: int,
                       block: int, warmup: int,
                       after_step: dict[str, Any] | None = None) -> Timings:
    """Train each of `variants` (DDP-wrapped models of the same shape: dims[0] in, dims[-1]
    out) for `block` steps in turn, the order rotating every repetition so that drift in the
    machine's load weighs on every variant alike; the first `warmup` repetitions are not kept.
    Every block starts at a barrier, so the ranks time the same steps. `after_step[name]()`,
    where given, runs after each of that variant's steps (inside the timing)."""
    import time

    import torch
    import torch.distributed as dist
    from torch import nn

    names = list(variants)
    opts = {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in variants.items()}
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, dims[0], generator=g), torch.randn(16, dims[-1], generator=g)
    out = Timings({n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names})
    for rep in range(warmup + reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            model, opt = variants[name], opts[name]
            extra = (after_step or {}).get(name)
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            start_thread = time.thread_time()
            for _ in range(block):
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if extra is not None:
                    extra()
            if rep >= warmup:
                out.wall[name].append(time.perf_counter() - start)
                out.cpu[name].append(time.process_time() - start_cpu)
                out.thread[name].append(time.thread_time() - start_thread)
    return out


def mlp(dims: tuple[int, ...]) -> Any:
    """A seeded MLP of Linear layers `dims` wide with ReLUs between (the benchmarks' model)."""
    import itertools

    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])
