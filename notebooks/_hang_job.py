"""A 2-rank torch DDP job that hangs, with torch's Flight Recorder on.

Run:  TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=dumps/fr_ \
      torchrun --nproc_per_node 2 _hang_job.py
At step HANG_STEP rank 1 gets stuck between forward and backward (think of a stalled data read
or a lock), so rank 0 waits in a bucket all-reduce forever. A watchdog thread on every rank
dumps the Flight Recorder (the pickle form) to $TORCH_FR_DUMP_TEMP_FILE<rank> once no step
finished for HANG_S seconds and then ends the process: what torch's NCCL watchdog does on a
collective timeout (gloo does not dump by itself in torch 2.13).
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

HANG_STEP = int(os.environ.get("HANG_STEP", "4"))
HANG_S = float(os.environ.get("HANG_S", "4"))
BUCKET_CAP_MB = 0.01


def make_model() -> nn.Module:
    """The model (also the --model TARGET of `ddpviz postmortem`: _hang_job:make_model)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(),
                         nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def watchdog(rank: int, progress: list[float]) -> None:
    while time.monotonic() - progress[0] < HANG_S:
        time.sleep(0.05)
    data = torch._C._distributed_c10d._dump_fr_trace(True, True)  # type: ignore[attr-defined]
    path = Path(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
    print(f"rank {rank}: no progress for {HANG_S}s, Flight Recorder dumped to {path}",
          flush=True)
    # End only once every rank has dumped: torchrun stops the others as soon as one rank exits.
    prefix, world = os.environ["TORCH_FR_DUMP_TEMP_FILE"], int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            Path(prefix + str(r)).exists() for r in range(world)):
        time.sleep(0.05)
    os._exit(3)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.set_num_threads(1)
    progress = [time.monotonic()]
    net = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(100):
        loss = net(torch.randn(16, 32, generator=gen)).square().mean()
        if rank == 1 and step == HANG_STEP:
            time.sleep(3600)  # stuck
        loss.backward()
        opt.step()
        opt.zero_grad()
        progress[0] = time.monotonic()
        if step == 0:  # watch from the first finished step on (startup may be slow)
            threading.Thread(target=watchdog, args=(rank, progress), daemon=True).start()


if __name__ == "__main__":
    main()
