"""How much Python a plain step of `watch()`'s default runs: ddpviz's function calls and lines
per step, counted (sys.settrace on the training thread), not timed.

Times of a ~1 ms CPU step swing by more than what one call costs on a shared 2-core machine,
but each Python call on a plain step meets the training thread cold (~1-4 us there, against
0.1-0.3 us in a warm loop: See [Note: the plain wrapper's calls] in ddpviz/_watch/base.py), so
the count of calls and lines is what a change to the hot path can be judged by, exactly and
on any machine. One gloo rank (world size 1: no heartbeat thread, the same per-step hooks as
at any world size), bench_watch.py's models; torch's DDP is counted before the watch is made
(after it, an unwatched copy would run the contract's global optimizer hook too). Steps after
300 warm-up steps, so the counts are those of plain steps (the sampled every 100th and the
replica check's every 25th included, averaged), with the NaN check's period held at every
16th step (its budget chooses it from measured times: every 16th or 32nd on these steps).

    PYTHONPATH=. python benchmarks/bench_plain_calls.py [--steps 400]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _ranks import free_port
from bench_watch import MODELS, _model

PACKAGE = str(Path(__file__).resolve().parents[1] / "ddpviz")
EVERY = 16  # the NaN check's period while counting (its budget sets it from times otherwise)


def _count(step: Any, steps: int) -> tuple[float, float, collections.Counter[str]]:
    """ddpviz's calls and lines per step over `steps` calls of `step`, and calls by function."""
    calls: collections.Counter[str] = collections.Counter()
    lines = [0]

    def in_line(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
        return in_line

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PACKAGE):
            return None
        calls[f"{code.co_filename[len(PACKAGE) - 6:]}:{code.co_name}"] += 1
        return in_line

    sys.settrace(on_call)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.settrace(None)
    return sum(calls.values()) / steps, lines[0] / steps, calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    import ddpviz

    warnings.simplefilter("ignore")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    print(f"ddpviz's Python per plain step, counted over {args.steps} steps after 300 "
          "(world size 1, gloo, batch 16, SGD)")
    print(f"{'model':12} {'variant':14}{'calls':>8}{'lines':>8}   most called")
    for model_name, dims in MODELS.items():
        for name in ("torch DDP", "default"):
            ddp = nn.parallel.DistributedDataParallel(_model(dims))
            watch = ddpviz.watch(ddp) if name == "default" else None
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            g = torch.Generator().manual_seed(0)
            x, y = torch.randn(16, dims[0], generator=g), torch.randn(16, dims[-1], generator=g)

            def step(ddp: nn.Module = ddp, opt: Any = opt, x: Any = x, y: Any = y) -> None:
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                opt.zero_grad()

            for _ in range(300):
                step()
            if watch is not None:  # the NaN check's period, set from times, held for the count
                budget = watch._buckets_nf.budget  # (every 16th: what ~1 ms steps get)
                budget.every, budget._set_at = EVERY, 1 << 62
            calls, lines, by = _count(step, args.steps)
            top = ", ".join(f"{Path(f.split(':')[0]).stem}.{f.split(':')[1]} "
                            f"{n / args.steps:.2f}" for f, n in by.most_common(5))
            print(f"{model_name:12} {name:14}{calls:>8.1f}{lines:>8.1f}   {top}")
            if watch is not None:
                watch.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
