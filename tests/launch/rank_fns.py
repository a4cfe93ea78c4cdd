"""Functions the launcher tests run on ranks (kept light: the ranks import this module).

Each one that starts a grandchild records its pid in `pid_dir/<rank>.pid` first, so a test can
prove by pid that nothing outlives the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")

# A "notebook cell": executed by the tests in a fake __main__ namespace, so its functions exist
# in no importable module (plain pickle cannot ship them; cloudpickle can).
NOTEBOOK_CELL = '''
import torch
import torch.distributed as dist

SCALE = 10


class Accumulator:
    def __init__(self):
        self.total = 0.0


def scaled(x):
    return x * SCALE


def notebook_fn(offset):
    acc = Accumulator()
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    acc.total = scaled(t.item()) + offset
    return acc.total


def notebook_fails_on_rank_1(pid_dir):
    from tests.launch.rank_fns import start_grandchild
    import time
    start_grandchild(pid_dir)
    dist.barrier()  # both grandchildren exist before anything fails
    if dist.get_rank() == 1:
        raise ValueError("planted failure on rank 1")
    time.sleep(600)
'''


def emit(n: int) -> bool:
    """Emit n events through the process-wide default emitter, as the engine would."""
    from ddpviz import events

    emitter = events.default_emitter()
    tap = events.Tap(emitter, rank=int(os.environ["RANK"]))
    for step in range(n):
        tap.step = step
        tap.emit(events.ForwardStarted)
    return emitter is not None


def reduce_and_report(tag: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    emit(5 + dist.get_rank())
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"hello {tag}")
    print(f"to stderr {tag}", file=sys.stderr)
    return {"env": {k: os.environ[k] for k in ENV_KEYS}, "sum": t.item(),
            "rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "omp": os.environ.get("OMP_NUM_THREADS")}


def start_grandchild(pid_dir: str) -> int:
    """Start a process that would sleep for 10 minutes, record its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rank = os.environ["RANK"]
    tmp = Path(pid_dir) / f"{rank}.tmp"
    tmp.write_text(f"{os.getpid()} {child.pid}")
    tmp.rename(Path(pid_dir) / f"{rank}.pid")  # appears complete or not at all
    return child.pid


def sleep_forever(pid_dir: str) -> None:
    start_grandchild(pid_dir)
    time.sleep(600)


def rank_1_hangs(pid_dir: str) -> str:
    import torch.distributed as dist

    start_grandchild(pid_dir)
    dist.barrier()
    if os.environ["RANK"] == "1":
        time.sleep(600)
    return "rank 0 done"


def rank_1_holds_the_gil(hang_timeout: float, hold_s: int) -> str:
    """ddpviz's DDP on two ranks; at step 1 rank 1 calls C code that keeps the GIL for `hold_s`
    seconds (libc's sleep() through ctypes.PyDLL) while rank 0 waits in the bucket all-reduce.
    Returns the RankHangError each rank raised, or "no error"."""
    import ctypes

    import torch
    import torch.distributed as dist

    import ddpviz
    from ddpviz.errors import RankHangError

    torch.manual_seed(0)
    ddp = ddpviz.DistributedDataParallel(torch.nn.Linear(4, 2), hang_timeout=hang_timeout)
    try:
        for step in range(3):
            if dist.get_rank() == 1 and step == 1:
                ctypes.PyDLL(None).sleep(hold_s)  # PLANTED gil
            ddp(torch.ones(2, 4)).sum().backward()
    except RankHangError as exc:
        return str(exc)
    return "no error"


def rank_1_exits_hard() -> None:
    if os.environ["RANK"] == "1":
        os._exit(3)
    time.sleep(600)


def rendezvous_facts() -> dict[str, Any]:
    """How this rank met the others: its store's kind and path, every listening TCP socket this
    process owns (address, port), and a store round trip (set/get between ranks)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    base = store.underlying_store if isinstance(store, dist.PrefixStore) else store
    rank = dist.get_rank()
    store.set(f"fact/{rank}", str(os.getpid()))
    peer = store.get(f"fact/{1 - rank}").decode()
    return {"store": type(base).__name__, "path": getattr(base, "path", ""),
            "listening": _listening_sockets(), "peer_pid": int(peer), "pid": os.getpid()}


def _listening_sockets() -> list[tuple[str, int]]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            found.append((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    import ipaddress

    raw = bytes.fromhex(hex_address)
    # /proc/net stores each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def late_gather(at: int, live: bool) -> str:
    """ddpviz's DDP and an all_gather of the job's own every step, 4 elements on rank 1 at step
    `at` (3 otherwise): gloo ends a rank. `live=False` turns the ranks' live comparison off
    (its period is an hour), so only the rings can name it."""
    import torch
    import torch.distributed as dist

    import ddpviz
    from ddpviz.probes import collective_check

    if not live:
        collective_check.PERIOD_S = 3600.0
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ddp = ddpviz.DistributedDataParallel(torch.nn.Linear(4, 2))
    for step in range(at + 3):
        ddp(torch.ones(3, 4)).sum().backward()
        n = 4 if rank == 1 and step == at else 3
        out = [torch.zeros(n) for _ in range(world)]
        dist.all_gather(out, torch.full((n,), float(step)))  # <late_gather>
    dist.barrier()
    return "done"
