"""Spawn a benchmark's gloo ranks and collect what each reports (shared by the benchmarks).

`run_ranks(target, world, *args)` starts `world` spawned processes running
`target(rank, world, port, *args, out)`; each puts `(rank, result)` on `out`. Returns
{rank: result}; exits with a message if the ranks do not report in time, and never leaves a
process behind.
"""

from __future__ import annotations

import queue
import socket
from collections.abc import Callable
from typing import Any

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
