"""Run a function on N real gloo ranks (fresh processes) and collect what each returns.

Used by every multi-rank test. The function must be importable (module level in a test file).
Every rank's exception comes back with its traceback; on timeout all ranks are killed, so no
test leaves a process behind.

Ranks are forked from a forkserver that imported torch and ddpviz once (per pytest process):
about 0.3 s a launch instead of 15-20 s for spawned ranks that each import torch on a loaded
CI machine. Each rank is still a new process with its own process group; the environment it
sees is the forkserver's (the test process's when the server started) plus `env`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RankFailed(RuntimeError):
    """One or more ranks raised or did not finish in time."""

    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        super().__init__("\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(failures.items())))


def _entry(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple[Any, ...],
           env: dict[str, str], init: bool, q: Any) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        import torch

        torch.set_num_threads(1)
        if init:
            import datetime

            import torch.distributed as dist

            dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=60))
        result = fn(rank, world_size, *args)
        q.put((rank, True, result))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))
    finally:
        if init:
            import torch.distributed as dist

            if dist.is_initialized():
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = 120,
              env: dict[str, str] | None = None, init: bool = True,
              allow_failures: bool = False, start_method: str = "forkserver") -> dict[int, Any]:
    """Run fn(rank, world_size, *args) on `world_size` spawned gloo ranks.

    Returns {rank: return value}. Raises RankFailed with every failing rank's traceback, unless
    allow_failures, in which case failures come back as RankFailed values in the dict.
    The default start_method="forkserver" forks ranks from a server that imported torch once
    (well under a second a launch instead of seconds a rank); "spawn" starts each rank from a
    fresh interpreter (tests/gpu: CUDA is set up in the rank, never in a forked server).
    """
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel",
                                    "torch._dynamo", "ddpviz"])
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, args, env or {}, init, q),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    import queue
    import time

    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(failures) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, ok, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
                continue
            (results if ok else failures)[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5 if not failures else 1)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    for r in range(world_size):
        if r not in results and r not in failures:
            code = procs[r].exitcode
            failures[r] = f"rank {r} did not finish within {timeout}s (exit code {code})"
    if failures and not allow_failures:
        raise RankFailed(failures)
    for r, tb in failures.items():
        results[r] = RankFailed({r: tb})
    return results
