"""The training the debugger tests run on their ranks (kept light: the ranks import this).

`train` runs a small two-layer model for `steps` steps on per-rank seeded data, with ddpviz's
DDP ("twin"), torch's DDP under watch(guard=True) ("guard"), under the default watch()
("hookless"), or torch's DDP alone ("torch", the unpaused reference). It records, per rank,
what a test compares the paused run with: the local gradient digests of one step (from
gradient hooks, before any all-reduce), the averaged ones after that step's backward, and the
final parameters' digests; with `optim="adam"` (Adam in place of SGD with momentum) also
each parameter's Adam `exp_avg` after that step's optimizer step.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

STEP = 3  # the step the tests stop at


def digest(t: Any) -> str:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return hashlib.blake2b(flat.view(__import__("torch").uint8).numpy().tobytes(),
                           digest_size=16).hexdigest()


def train(kind: str, steps: int, out: str, *, nan_at: int = -1, go: str = "",
          sleep: float = 0.0, optim: str = "sgd", device: str = "cpu") -> dict[str, str]:
    import torch
    import torch.distributed as dist
    from torch import nn

    import ddpviz

    rank = dist.get_rank()
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.fc2 = nn.Linear(16, 16)
            self.fc3 = nn.Linear(16, 4)

        def forward(self, x: Any) -> Any:
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    model = Net()
    if device == "cuda":  # tests/gpu: a GPU per rank, NCCL
        torch.cuda.set_device(rank)
        model = model.cuda()
    cap = 0.0006  # MB: a few parameters a bucket, so there are several buckets
    if kind == "twin":
        ddp: Any = ddpviz.DistributedDataParallel(model, bucket_cap_mb=cap)
    else:
        ddp = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=cap, device_ids=[rank] if device == "cuda" else None)
        if kind in ("guard", "hookless"):
            ddpviz.watch(ddp, recording=ddpviz.Recording(guard=kind == "guard"))
    opt: Any = (torch.optim.Adam(ddp.parameters(), lr=0.01) if optim == "adam" else
                torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9))
    names = [n for n, _ in model.named_parameters()]
    record: dict[str, Any] = {"local": {}, "averaged": {}, "losses": []}
    step = [0]

    def hook(name: str) -> Any:
        def on_grad(g: Any) -> Any:
            if step[0] == nan_at and rank == 1 and name == "fc1.weight":
                g = g.clone()
                g[0, 1] = float("nan")
                g[2, 3] = float("nan")
            if step[0] == STEP:
                record["local"][name] = digest(g)
            return g
        return on_grad

    for n, p in model.named_parameters():
        p.register_hook(hook(n))
    if go:
        while not os.path.exists(go):
            time.sleep(0.01)
        said = Path(go).read_text().split()
        if said[:1] == ["commands"]:  # they went out: train once this rank has them, up to
            # request N where "commands N" says so (delivered by its Sender's thread, which a
            # loaded machine can leave behind)
            from ddpviz.debugger import controller

            last = int(said[1]) if len(said) > 1 else 1
            deadline = time.monotonic() + 60
            while controller._current is None or controller._current._last_request < last:
                if time.monotonic() > deadline:  # (a test that would run without its breaks)
                    raise TimeoutError(f"rank {rank}: the commands up to request {last} never "
                                       "arrived in 60 s")
                time.sleep(0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    for s in range(steps):
        step[0] = s
        x = torch.randn(16, 8, generator=gen).to(device)
        y = torch.randn(16, 4, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        record["losses"].append(loss.item())
        if s == STEP:
            record["averaged"] = {n: digest(p.grad) for n, p in zip(names, model.parameters(),
                                                                    strict=True)}
        opt.step()
        if s == STEP and optim == "adam":
            record["exp_avg"] = {n: digest(opt.state[p]["exp_avg"])
                                 for n, p in zip(names, model.parameters(), strict=True)}
        if sleep:
            time.sleep(sleep)
    final = {n: digest(p) for n, p in model.named_parameters()}
    record["final"] = final
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    return final


def sequential_ddp(kind: str) -> tuple[Any, Any]:
    """(model, ddp): a seeded five-layer Sequential in ddpviz's DDP ("twin") or torch's
    ("torch"; "guard": under watch(guard=True)), with a few parameters a bucket."""
    import torch
    from torch import nn

    import ddpviz

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    cap = 0.0006  # MB: a few parameters a bucket, so there are several buckets
    if kind == "twin":
        ddp: Any = ddpviz.DistributedDataParallel(model, bucket_cap_mb=cap)
    else:
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
        if kind == "guard":
            ddpviz.watch(ddp, recording=ddpviz.Recording(guard=True))
    return model, ddp
