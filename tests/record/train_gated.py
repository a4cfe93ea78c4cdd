"""An unmodified torch DDP training script (no ddpviz import) that a test can hold at given
steps, so that a notebook session can attach to it mid-run (tests/record/test_attach.py).

TRAIN_STEPS steps of train_plain.py's model and data; TRAIN_GATES="5:PATH,9:PATH2": before the
forward of step 5 each rank writes PATH.reached{RANK} and waits until PATH exists (the test
creates it), likewise at step 9. Gates change nothing the ranks compute: an ungated run ends
with the same parameters, printed as in train_plain.py.
"""

import atexit
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

_GATE_LIMIT_S = 600  # a test that never opens a gate: the rank gives up (bounds a broken run)


def gate(path: str, rank: int) -> None:
    with open(f"{path}.reached{rank}", "w") as f:
        f.write("1")
    deadline = time.monotonic() + _GATE_LIMIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: gate {path} never opened")
        time.sleep(0.01)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    gates = dict((int(k), v) for k, v in (g.split(":", 1) for g in
                 filter(None, os.environ.get("TRAIN_GATES", "").split(","))))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(int(os.environ.get("TRAIN_STEPS", "12"))):
        if step in gates:
            gate(gates[step], rank)
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 8, generator=g)
        opt.zero_grad()
        loss = ddp(x).square().sum()
        loss.backward()
        opt.step()
    raw = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    print(f"rank {rank} done loss {float(loss.detach()):.9g} bits {raw.hexdigest()[:20]}",
          flush=True)
    dist.barrier()  # then leave like train_plain.py (see there)
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
