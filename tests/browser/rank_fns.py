"""What the browser tests run on ranks (importable: the ranks import this module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 1))


def train(steps: int, bucket_cap_mb: float) -> float:
    """A few SGD steps under ddpviz's DDP, reporting to the launcher's session."""
    import torch.distributed as dist

    import ddpviz
    from ddpviz.events import default_emitter

    torch.set_num_threads(1)
    ddp = ddpviz.DistributedDataParallel(build_model(), bucket_cap_mb=bucket_cap_mb,
                                         emitter=default_emitter())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    torch.manual_seed(1 + dist.get_rank())
    loss = torch.zeros(())
    for _ in range(steps):
        loss = ddp(torch.randn(8, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.item())


def train_in_phases(go: str, phases: tuple[int, ...], bucket_cap_mb: float) -> float:
    """SGD steps under ddpviz's DDP in phases: before phase i > 0 every rank waits (outside
    DDP, at a step boundary) until the file `{go}{i}` exists, so a test decides when they
    go on."""
    import os
    import time

    import torch.distributed as dist

    import ddpviz
    from ddpviz.events import default_emitter

    torch.set_num_threads(1)
    ddp = ddpviz.DistributedDataParallel(build_model(), bucket_cap_mb=bucket_cap_mb,
                                         emitter=default_emitter())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    torch.manual_seed(1 + dist.get_rank())
    loss = torch.zeros(())
    from ddpviz.debugger import controller

    for i, steps in enumerate(phases):
        ctl = controller._current
        seen = ctl._last_request if ctl is not None else 0
        while i and not os.path.exists(f"{go}{i}"):
            time.sleep(0.05)
        said = Path(f"{go}{i}").read_text().split() if i else []
        if said[:1] == ["after-command"]:
            # the test clicked (a break, a pause) before it let the ranks go on: wait until
            # that command reached this rank (its Sender's thread, which a loaded machine can
            # leave behind while the steps of the phase would run past the point meant);
            # "after-command STEP BUCKET": until the break set holding only a break at STEP
            # before BUCKET did (the last of several commands: the queue keeps them all while
            # the training thread waits here)
            deadline = time.monotonic() + 60
            while not _reached(controller._current, seen, said[1:]):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no debugger command reached this rank in 60 s "
                                       f"before phase {i}")
                time.sleep(0.01)
        for _ in range(steps):
            loss = ddp(torch.randn(8, 32)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return float(loss.item())


def _reached(ctl: Any, seen: int, expect: list[str]) -> bool:
    """Whether the command a phase waits for reached this rank (train_in_phases)."""
    if ctl is None or ctl._last_request <= seen:
        return False
    if not expect:
        return True
    from ddpviz.debugger import protocol

    want = (protocol.BreakAt(step=int(expect[0]), where="bucket", bucket=int(expect[1])),)
    return any(isinstance(c, protocol.SetBreaks) and c.breaks == want
               for c in list(ctl._queue))


def train_diverging(steps: int, edit_step: int) -> float:
    """SGD steps under ddpviz's DDP recorded in full (every step, for the bucket advisor),
    the replica check comparing every step; after step `edit_step` rank 1 edits one weight
    in place (a planted replica divergence). Rank 0 waits for its check's verdicts."""
    import torch.distributed as dist

    import ddpviz
    from ddpviz.events import default_emitter

    torch.set_num_threads(1)
    model = build_model()
    ddp = ddpviz.DistributedDataParallel(
        model, bucket_cap_mb=0.01, emitter=default_emitter(),
        recording=ddpviz.Recording(every=1, replicas=1))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    torch.manual_seed(1 + dist.get_rank())
    loss = torch.zeros(())
    for step in range(steps):
        loss = ddp(torch.randn(8, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == edit_step and dist.get_rank() == 1:
            with torch.no_grad():
                model[2].weight[0, 0] += 1e-3
    if dist.get_rank() == 0:
        assert ddp.replicas.drain(60.0), f"the replica check did not finish: {ddp.replicas.error!r}"
    dist.barrier()
    ddp.replicas.close()
    return float(loss.item())
