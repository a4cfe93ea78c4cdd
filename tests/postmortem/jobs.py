"""Real hung DDP jobs for post-mortem tests: N gloo ranks train torch's own DDP with the Flight
Recorder on (TORCH_FR_BUFFER_SIZE), a planted fault stops one rank, and every rank dumps its
recorder at the point of the hang from a thread (even ranks in the JSON form, odd ranks in the
pickle form torch writes), files named PREFIX<rank> as TORCH_FR_DUMP_TEMP_FILE would.

A rank dumps once its main thread reached the fault point (`_at_hang`), it has at least the
given number of pending collectives, and its recorder did not change for STABLE_S seconds; then
all ranks meet in the store and leave with os._exit (the hang is never resolved).
"""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path
from typing import Any

from tests.dist.harness import free_port

FAULT_STEP = 3  # steps 0..2 run normally on every rank
STABLE_S = 0.5
LATE_TIMEOUT_S = 4  # the group's timeout of the "_late" scenarios, which dump after it
PREFIX = "fr_trace_"


def make_model() -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):
        """Linear-BatchNorm-Linear-Linear body and an `aux` head a rank may skip."""

        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                      nn.Linear(16, 16), nn.ReLU())
            self.head = nn.Linear(16, 4)
            self.aux = nn.Linear(16, 4)
            self.skip_aux = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.body(x)
            out = self.head(h)
            return out if self.skip_aux else out + self.aux(h)

    torch.manual_seed(0)
    return Net()


# bucket_cap_mb small enough that every layer gets its own bucket or two
SMALL_CAP_MB = 0.0006


class _Dumper:
    def __init__(self, rank: int, world_size: int, store: Any, out: Path):
        self.rank, self.world_size, self.store, self.out = rank, world_size, store, out
        self.ready = threading.Event()
        self.min_pending = 0
        self.delay = 0.0  # seconds between reaching the fault and dumping
        self.pickle_all = False  # every rank in the pickle form (the one with stacks)
        threading.Thread(target=self._run, daemon=True).start()

    def at_hang(self, min_pending: int) -> None:
        self.min_pending = min_pending
        self.ready.set()

    def _run(self) -> None:
        import torch

        c10d: Any = torch._C._distributed_c10d
        self.ready.wait(120)
        if self.delay:  # by then the timed-out waits may be retired: nothing stays pending
            time.sleep(self.delay)
            self.min_pending = 0
        last, since = None, time.monotonic()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            d = json.loads(c10d._dump_fr_trace_json(True, True))
            state = [(e["record_id"], e["retired"]) for e in d["entries"]]
            pending = sum(not r for _, r in state)
            if state != last:
                last, since = state, time.monotonic()
            elif pending >= self.min_pending and time.monotonic() - since >= STABLE_S:
                break
            time.sleep(0.02)
        data = (c10d._dump_fr_trace(True, True) if self.rank % 2 or self.pickle_all
                else c10d._dump_fr_trace_json(True, True))
        path = self.out / f"{PREFIX}{self.rank}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
        tmp.rename(path)
        self.store.add("pm/dumped", 1)
        while self.store.add("pm/dumped", 0) < self.world_size:
            time.sleep(0.02)
        if self.rank == 0:  # rank 0 serves the store: leave last
            while self.store.add("pm/left", 0) < self.world_size - 1:
                time.sleep(0.02)
        else:
            self.store.add("pm/left", 1)
        os._exit(0)


def _rank(scenario: str, rank: int, world_size: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    late = scenario.endswith("_late")  # dumped after the group's timeout retired the waits
    scenario = scenario.removesuffix("_late")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=LATE_TIMEOUT_S if late else 60))
    dumper = _Dumper(rank, world_size, store, Path(out))
    if late:
        dumper.delay = 2 * LATE_TIMEOUT_S
    model = make_model()
    cap = SMALL_CAP_MB
    if scenario == "caps" and rank == 1:
        cap = 0.0003
    # bucket caps only shape buckets that are never rebuilt with find_unused_parameters=True
    # (otherwise iteration 0 has one bucket and the rebuild follows rank 0's map)
    ddp = DDP(model, bucket_cap_mb=None if scenario == "caps" and rank == 0 else cap,
              find_unused_parameters=scenario == "caps")
    gen = torch.Generator().manual_seed(rank)

    def step() -> Any:
        return ddp(torch.randn(6, 8, generator=gen)).sum()

    if scenario == "caps":  # rank 1 launches its buckets; rank 0 is late (gloo would abort a
        # process on the size mismatch, so the dumps are taken before rank 0 launches)
        loss = step()
        dumper.at_hang(1 if rank == 1 else 0)
        if rank == 1:
            loss.backward()
        time.sleep(600)
    for _ in range(FAULT_STEP):
        step().backward()
    if scenario == "skip_backward":
        loss = step()
        if rank == world_size - 1:
            dumper.at_hang(0)  # forward done, backward skipped: the rank goes on elsewhere
            time.sleep(600)
        dumper.at_hang(1)
        try:
            loss.backward()
        except RuntimeError:  # the group's timeout (the _late variant): wait for the dump
            time.sleep(600)
    elif scenario == "stop_mid_step":
        loss = step()
        if rank == 1:  # the hook blocks before 0.weight's gradient is accumulated
            first = dict(model.named_parameters())["body.0.weight"]
            first.register_hook(lambda g: time.sleep(600))
        dumper.at_hang(0 if rank == 1 else 1)
        loss.backward()
    elif scenario == "extra_collective":
        if rank == 1:  # a rank-dependent metric all-reduce after step 2
            dumper.at_hang(1)
            dist.all_reduce(torch.ones(1))
        dumper.at_hang(0)  # rank 0 about to start step 3
    elif scenario == "unused":
        if rank == 1:
            model.skip_aux = True
        if rank == 0:
            dumper.at_hang(1)
        step().backward()  # rank 1's backward returns without reducing aux's bucket
        dumper.at_hang(0)
    else:
        raise ValueError(scenario)
    time.sleep(600)


def run_ranks_until(target: Any, args: Any, world_size: int, timeout: float) -> list[Any]:
    """`target(*args(r))` in one process per rank r, forked from a forkserver; each is killed
    if it has not ended `timeout` seconds after the start. The ended processes."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel"])
    procs = [ctx.Process(target=target, args=args(r), daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.1))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return procs


def run_job(scenario: str, world_size: int, out: Path, timeout: float = 120) -> list[Path]:
    """Run the scenario on `world_size` ranks; return the dump files (one per rank)."""
    port = free_port()
    procs = run_ranks_until(_rank, lambda r: (scenario, r, world_size, port, str(out)),
                            world_size, timeout)
    files = [out / f"{PREFIX}{r}" for r in range(world_size)]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        codes = [p.exitcode for p in procs]
        raise RuntimeError(f"{scenario}: no dump {missing} (exit codes {codes})")
    return files
