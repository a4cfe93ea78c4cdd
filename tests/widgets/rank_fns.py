"""What the real-run widget tests execute on each rank (the ranks import this module)."""

from __future__ import annotations

from typing import Any

STEPS = 3
CAP_MB = 0.001  # ~1 KiB: this small model gets several buckets after the rebuild


def _model(out: int = 1) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, out))


def _train(ddp: Any, rank: int) -> None:
    import torch

    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    for _ in range(STEPS):
        loss = ddp(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def torch_then_ddpviz() -> dict[str, Any]:
    """The same model and data under torch's DDP, then under ddpviz's (which emits events to
    the launch's session); returns what torch logged about its buckets."""
    import torch
    import torch.distributed as dist

    import ddpviz
    from ddpviz.events import default_emitter

    torch.set_num_threads(1)
    rank = dist.get_rank()
    reference = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=CAP_MB)
    _train(reference, rank)
    logged = reference._get_ddp_logging_data()
    ours = ddpviz.DistributedDataParallel(_model(), bucket_cap_mb=CAP_MB,
                                          emitter=default_emitter())
    _train(ours, rank)
    return {"bucket_sizes": [int(x) for x in str(logged["bucket_sizes"]).split(",")],
            "rebuilt_map": [[int(i) for i in b.split()]
                            for b in str(logged["rebuilt_per_bucket_param_indices"]).split(",")]}


def rank_1_builds_another_head() -> None:
    """Rank 1's last layer has 3 outputs instead of 1: ddpviz's verification fails on both."""
    import torch.distributed as dist

    import ddpviz
    from ddpviz.events import default_emitter

    model = _model(out=3 if dist.get_rank() == 1 else 1)
    ddpviz.DistributedDataParallel(model, emitter=default_emitter())
