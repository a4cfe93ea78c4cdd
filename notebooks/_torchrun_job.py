"""A tiny data-parallel training job for torchrun that streams its events to a ddpviz session.

Run:  DDPVIZ_CONNECT="$(cat <the file ddpviz.listen() names>)" torchrun --nproc_per_node 2 \
      _torchrun_job.py
Without DDPVIZ_CONNECT each rank records ddpviz-trace-rank{R}.ddpviz instead.
Uses ddpviz.DistributedDataParallel when this ddpviz has it; otherwise it trains with plain
gloo all-reduces and reports the same events by hand (through the same default emitter).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import ddpviz
from ddpviz import events as ev

STEPS = int(os.environ.get("JOB_STEPS", "5"))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                         nn.Linear(16, 2))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)


def train_with_ddpviz(ddp_cls: type, rank: int) -> None:
    net = ddp_cls(model(), emitter=ev.default_emitter())  # what connect() installed
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def train_by_hand(rank: int, world: int) -> None:
    """Plain DDP-like training; each phase is reported as ddpviz events."""
    tap = ev.Tap(ev.default_emitter(), rank)
    net = model()
    params = list(net.parameters())
    names = [n for n, _ in net.named_parameters()]
    infos = tuple(ev.ParamInfo(i, n, tuple(p.shape), "float32", "cpu", False)
                  for i, (n, p) in enumerate(zip(names, params, strict=True)))
    tap.emit(ev.ParamsBuilt, infos, (), ())

    tap.emit(ev.VerificationStarted, world, len(params), 0)
    shapes = ";".join(f"{n}{tuple(p.shape)}" for n, p in zip(names, params, strict=True))
    digests: list[str | None] = [None] * world
    dist.all_gather_object(digests, hashlib.sha1(shapes.encode()).hexdigest()[:12])
    tap.emit(ev.VerificationPassed, world, str(digests[0]))

    flat = torch.cat([p.detach().reshape(-1) for p in params])
    nbytes = flat.numel() * 4
    t0 = time.perf_counter()
    tap.emit(ev.BroadcastStarted, 0, len(params), nbytes, 1)
    tap.emit(ev.BroadcastChunkSent, 0, "float32", "cpu", nbytes, len(params))
    dist.broadcast(flat, 0)
    tap.emit(ev.BroadcastChunkDone, 0, nbytes)
    tap.emit(ev.BroadcastFinished, nbytes, time.perf_counter() - t0)

    # Two buckets in reduction order: the last layer's gradients are ready first.
    buckets = ((4, 5), (0, 1, 2, 3))
    bucket_of = {p: b for b, members in enumerate(buckets) for p in members}
    tap.emit(ev.BucketAssigned, buckets, (1 << 20, 25 << 20), False)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(
            lambda _, i=i: tap.emit(ev.GradReady, i, bucket_of[i]))

    opt = torch.optim.SGD(params, lr=0.1)
    for step in range(STEPS):
        tap.step = step
        x, y = batch(rank, step)
        opt.zero_grad()
        tap.emit(ev.ForwardStarted)
        loss = nn.functional.mse_loss(net(x), y)
        tap.emit(ev.BackwardStarted)
        loss.backward()
        for b, members in enumerate(buckets):
            grads = torch.cat([params[i].grad.reshape(-1) for i in members])  # type: ignore[union-attr]
            tap.emit(ev.BucketReady, b)
            tap.emit(ev.AllReduceLaunched, b, grads.numel() * 4, "float32")
            dist.all_reduce(grads)
            grads /= world
            tap.emit(ev.AllReduceDone, b)
            offset = 0
            for i in members:
                g = params[i].grad
                assert g is not None
                g.copy_(grads[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        tap.emit(ev.BackwardFinished)
        opt.step()


def main() -> None:
    sender = ddpviz.connect()  # before any model is built: it installs the default emitter
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp_cls = getattr(ddpviz, "DistributedDataParallel", None)
    if ddp_cls is not None:
        train_with_ddpviz(ddp_cls, rank)
    else:
        train_by_hand(rank, world)
    dist.barrier()
    dist.destroy_process_group()
    sender.flush()
    mode = "ddpviz.DistributedDataParallel" if ddp_cls is not None else "events by hand"
    print(f"rank {rank}: {STEPS} steps ({mode}), {sender.stats.sent} events sent", flush=True)


if __name__ == "__main__":
    main()
    # Leave like ddpviz.launch's ranks do: atexit handlers, then os._exit. gloo torn down at
    # interpreter exit aborted a rank now and then on a loaded machine ("terminate called
    # without an active exception"), failing the job after its work was done.
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(0)
