"""Real gloo jobs whose own collectives go wrong, for tests/postmortem/test_job_collectives.py.

Two ranks train torch's DDP (jobs.make_model, small buckets) with the Flight Recorder on, and
every step the job issues collectives of its own, as training scripts do: an all_gather of its
metrics (`log_metrics`) and an all_reduce of the loss (`average_loss`). After FAULT_STEP healthy
steps, a planted defect:
- "barrier": only rank 0 calls `save_checkpoint` (a barrier); rank 1 goes on into the next
  step, whose first collective (DDP's buffer broadcast) waits with rank 0's barrier forever;
- "debug_print": only rank 1 calls `debug_print` (an all_reduce of its loss) before
  `log_metrics`; it waits with rank 0's all_gather forever;
- "metrics": rank 1 logs 4 metrics and rank 0 logs 3 in `log_metrics`. gloo aborts the rank
  with the smaller buffer (SIGABRT) as soon as both are in, and completes the other's, so rank 0
  dumps while it waits in it, and only then does rank 1 enter (the dump an NCCL job writes at its
  timeout holds the same); the store is served by the test process, which outlives rank 0;
- "healthy": no defect, and every rank calls `save_checkpoint` after each second step.
Every rank dumps in the pickle form, the one with stacks (jobs._Dumper).
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.postmortem.jobs import PREFIX, SMALL_CAP_MB, _Dumper, make_model, run_ranks_until

FAULT_STEP = 3  # steps 0..2 run alike on every rank
SCENARIOS = ("healthy", "barrier", "debug_print", "metrics")


def log_metrics(metrics: Any) -> list[Any]:
    import torch
    import torch.distributed as dist

    gathered = [torch.empty_like(metrics) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, metrics)
    return gathered


def average_loss(loss: Any) -> Any:
    import torch.distributed as dist

    mean = loss.detach().reshape(1).clone()
    dist.all_reduce(mean)
    return mean / dist.get_world_size()


def save_checkpoint(model: Any) -> None:
    import torch.distributed as dist

    dist.barrier()  # every rank waits until the checkpoint is written


def debug_print(loss: Any) -> None:
    import torch.distributed as dist

    total = loss.detach().reshape(1).clone()
    dist.all_reduce(total)


def collective_line(function: Callable[..., Any]) -> tuple[str, int]:
    """(file, line) of the collective call in one of the functions above, read from its
    source (what a Flight Recorder stack names as the call site)."""
    lines, first = inspect.getsourcelines(function)
    calls = [first + i for i, text in enumerate(lines) if "dist." in text and "(" in text
             and "get_world_size" not in text]
    assert len(calls) == 1, calls
    return inspect.getsourcefile(function) or "", calls[0]


def _rank(scenario: str, rank: int, world_size: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    dumper = _Dumper(rank, world_size, store, Path(out))
    dumper.pickle_all = True
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=SMALL_CAP_MB)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)

    def train_step() -> Any:
        loss = ddp(torch.randn(6, 8, generator=gen)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def metrics(loss: Any, n: int = 3) -> Any:
        return torch.tensor([loss.item(), 0.1, 1.0, 2.0][:n])

    for step in range(FAULT_STEP):
        loss = train_step()
        log_metrics(metrics(loss))
        average_loss(loss)
        if scenario == "healthy" and step % 2 == 1:
            save_checkpoint(model)
    if scenario == "healthy":
        save_checkpoint(model)
        dumper.at_hang(0)
    elif scenario == "barrier":
        if rank == 0:
            dumper.at_hang(1)
            save_checkpoint(model)
        dumper.at_hang(1)
        train_step()  # its buffer broadcast waits with rank 0's barrier
    elif scenario == "debug_print":
        loss = train_step()
        dumper.at_hang(1)
        if rank == 1:
            debug_print(loss)
        log_metrics(metrics(loss))
    elif scenario == "metrics":
        loss = train_step()
        if rank == 0:
            dumper.at_hang(1)  # dumps while it waits in the all_gather
        else:
            while store.add("pm/dumped", 0) < 1:  # rank 0's dump is written
                time.sleep(0.02)
        with contextlib.suppress(RuntimeError):  # rank 1 may get rank 0's reset instead of
            log_metrics(metrics(loss, 3 if rank == 0 else 4))  # garbage
        dumper.at_hang(0)
    else:
        raise ValueError(scenario)
    time.sleep(600)


def run_job(scenario: str, out: Path, world_size: int = 2, timeout: float = 120
            ) -> list[Path]:
    """Run the scenario; return the dump files (one per rank)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    port = store.port
    try:
        procs = run_ranks_until(_rank, lambda r: (scenario, r, world_size, port, str(out)),
                                world_size, timeout)
    finally:
        del store
    files = [out / f"{PREFIX}{r}" for r in range(world_size)]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        codes = [p.exitcode for p in procs]
        raise RuntimeError(f"{scenario}: no dump {missing} (exit codes {codes})")
    return files
