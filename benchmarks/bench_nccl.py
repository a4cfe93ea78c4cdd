"""Step time on one CUDA GPU over NCCL (world size 1): torch's DDP, ddpviz's engine and
ddpviz.watch() on torch's DDP, side by side in one process.

Each variant is its own DDP-wrapped copy of the same model with its own SGD optimizer; they
train in blocks of `--block` steps, the order rotating every repetition so drift in the machine
weighs on all alike. A block's wall time ends at `torch.cuda.synchronize()`: on a launch-bound
model it is what Python-side overhead costs. The process's CPU time (every thread) is printed
too; not the training thread's alone: with CUDA tensors autograd runs backward, and so DDP's
gradient hooks, on its own device thread, which the training thread only waits for.
Printed: per model and variant, the median block time and the median of per-repetition ratios
to torch's DDP (wall and process CPU). `torch DDP (A/A)` is a second torch DDP: its
ratio is the noise floor.

    python benchmarks/bench_nccl.py [--reps 60] [--block 20] [--cpu]

Needs a CUDA GPU and NCCL; exits saying so where there is none. `--cpu` runs the same rows on
gloo on the CPU (to check the benchmark itself; bench_watch.py is the CPU measurement).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz
from _ranks import free_port

MODELS = {  # name: (layers, width, batch)
    "launch-bound: 24 x Linear(256), batch 32": (24, 256, 32),
    "compute-bound: 8 x Linear(4096), batch 1024": (8, 4096, 1024),
}
WARMUP = 3


def _model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 10))


def _variants(base: nn.Module, device: torch.device) -> tuple[dict[str, Any], list[Any]]:
    import ddpviz

    ids = [device.index] if device.type == "cuda" else None
    torch_ddp = nn.parallel.DistributedDataParallel
    made: dict[str, Any] = {}
    watches: list[Any] = []
    events: list[Any] = []
    for name in ("torch DDP", "torch DDP (A/A)", "ddpviz DDP", "ddpviz DDP + taps",
                 "watch() default", "watch() guard,every=1"):
        module = copy.deepcopy(base).to(device)
        if name.startswith("torch DDP"):
            ddp = torch_ddp(module, device_ids=ids)
        elif name == "ddpviz DDP":
            ddp = ddpviz.DistributedDataParallel(module, device_ids=ids)
        elif name == "ddpviz DDP + taps":
            ddp = ddpviz.DistributedDataParallel(module, device_ids=ids,
                                                 emitter=events.append)
        else:
            ddp = torch_ddp(module, device_ids=ids)
            recording = None if name == "watch() default" else \
                ddpviz.Recording.parse(name.split()[1])
            watches.append(ddpviz.watch(ddp, recording=recording) if recording
                           else ddpviz.watch(ddp))
        made[name] = (ddp, torch.optim.SGD(module.parameters(), lr=1e-3))
    return made, watches


def _sync(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize()


def _block(ddp: Any, opt: Any, x: torch.Tensor, y: torch.Tensor, steps: int
           ) -> tuple[float, float]:
    _sync(x)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    _sync(x)
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    timeout = datetime.timedelta(seconds=120)
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timeout)
        where = f"CPU (gloo), torch {torch.__version__}"
    else:
        if not torch.cuda.is_available() or not dist.is_nccl_available():
            raise SystemExit("bench_nccl: needs a CUDA GPU and NCCL (--cpu: gloo); torch "
                             f"{torch.__version__} sees {torch.cuda.device_count()} GPUs")
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device,
                                timeout=timeout)
        where = (f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, NCCL "
                 f"{'.'.join(map(str, torch.cuda.nccl.version()))}")
    print(f"{where}, world size 1; blocks of {args.block} steps, {args.reps} rotated "
          f"repetitions ({WARMUP} warm-up not kept)")
    for model_name, (layers, width, batch) in MODELS.items():
        made, watches = _variants(_model(layers, width), device)
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(batch, width, device=device, generator=g)
        y = torch.randint(10, (batch,), device=device, generator=g)
        names = list(made)
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for rep in range(WARMUP + args.reps):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                w, c = _block(*made[name], x, y, args.block)
                if rep >= WARMUP:
                    wall[name].append(w)
                    cpu[name].append(c)
        for w in watches:
            w.close()
        print(f"\n{model_name}")
        print("| variant | ms/step (wall) | wall / torch | process CPU / torch |")
        print("| --- | ---: | ---: | ---: |")
        base = "torch DDP"
        for name in names:
            ms = statistics.median(wall[name]) / args.block * 1e3
            rw = statistics.median(a / b for a, b in zip(wall[name], wall[base], strict=True))
            rc = statistics.median(a / b for a, b in zip(cpu[name], cpu[base], strict=True))
            print(f"| {name} | {ms:.3f} | {rw:.3f} | {rc:.3f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
