"""The training the bucket-buffer tests run on their ranks (kept light: the ranks import this).

`train` runs the three-layer model of rank_fns for `steps` steps with ddpviz's DDP ("twin"),
torch's DDP under watch(guard=True) ("guard") or torch's DDP alone ("torch", the reference).
It records, per rank, the bytes of every parameter's local gradient at step `STEP` (from
gradient hooks, before any all-reduce), the bytes of the averaged gradients after that step's
backward, and the final parameters' digests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.debugger.rank_fns import digest, sequential_ddp

STEP = 1  # the step whose buckets the tests (and notebooks/07_debugger.ipynb) walk through


def as_hex(t: Any) -> str:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex()


def train(kind: str, steps: int, out: str) -> dict[str, str]:
    import torch
    import torch.distributed as dist


    rank = dist.get_rank()
    model, ddp = sequential_ddp(kind)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    record: dict[str, Any] = {"local": {}, "averaged": {}}
    step = [0]

    def hook(name: str) -> Any:
        def on_grad(g: Any) -> None:
            if step[0] == STEP:
                record["local"][name] = as_hex(g)
        return on_grad

    for n, p in model.named_parameters():
        p.register_hook(hook(n))
    gen = torch.Generator().manual_seed(100 + rank)
    for s in range(steps):
        step[0] = s
        x = torch.randn(16, 8, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        if s == STEP:
            record["averaged"] = {n: as_hex(p.grad) for n, p in model.named_parameters()}
        opt.step()
    final = {n: digest(p) for n, p in model.named_parameters()}
    record["final"] = final
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    return final
