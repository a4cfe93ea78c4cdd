"""watch() completes the futures torch's reducer waits on from the training thread (See [Note:
settled on the training thread] in ddpviz/watch.py): no Python runs on gloo's thread, a Ctrl-C
while a peer is missing reaches the caller of backward() without waiting for that peer, and the
all-reduce it left running cannot write into the next step's buckets.

Real gloo ranks, compared with what torch's DDP computes.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist.harness import run_ranks
from tests.recordings import recording

pytestmark = pytest.mark.dist


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 4))


def thread_ranks(rank: int, world_size: int, detail: str) -> dict[str, Any]:
    import ddpviz

    seen: list[tuple[str, int, int]] = []  # (event, bucket, thread)
    ddp = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0005)
    twin = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0005)
    w = ddpviz.watch(ddp, recording=recording(detail),
                     emitter=lambda e: seen.append((type(e).__name__, getattr(e, "bucket", -1),
                                                    threading.get_ident())))
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x = torch.randn(4, 8, generator=g)
        for model in (ddp, twin):
            model(x).sum().backward()
    w.close()
    same = all(torch.equal(a.grad, b.grad) for a, b in zip(ddp.parameters(), twin.parameters(),
                                                           strict=True))
    return {"seen": seen, "main": threading.get_ident(), "same_grads": same}


@pytest.mark.parametrize("detail", ["full", "buckets"])
def test_every_all_reduce_is_settled_on_the_training_thread(detail: str) -> None:
    results = run_ranks(thread_ranks, 2, detail, timeout=120)
    for res in results.values():
        launched = [b for name, b, _ in res["seen"] if name == "AllReduceLaunched"]
        done = [(b, t) for name, b, t in res["seen"] if name == "AllReduceDone"]
        assert len(launched) > 4  # several buckets a step (after the rebuild)
        assert [b for b, _ in done] == launched  # each one, in launch order
        assert {t for _, t in done} == {res["main"]}  # not on gloo's thread
        assert res["same_grads"]  # and the gradients are torch's


def interrupt_ranks(rank: int, world_size: int) -> dict[str, Any]:
    import ddpviz

    signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored when run in background
    store = dist.distributed_c10d._get_default_store()
    ddp = nn.parallel.DistributedDataParallel(_model())
    w = ddpviz.watch(ddp, emitter=lambda e: None, hang_timeout=45, recording=recording("buckets"))
    g = torch.Generator().manual_seed(rank)
    xs = [torch.randn(4, 8, generator=g) for _ in range(3)]
    ddp(xs[0]).sum().backward()
    out: dict[str, Any] = {"interrupted": False}
    loss = ddp(xs[1]).sum()
    if rank == 1:  # comes to step 1's all-reduce only once rank 0 was interrupted waiting for it
        store.wait(["interrupted"], datetime.timedelta(seconds=40))
        loss.backward()
    else:
        main = threading.main_thread().ident
        assert main is not None

        def interrupt_when_waiting() -> None:  # once the training thread waits for rank 1
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                frame = sys._current_frames().get(main)
                names = set()
                while frame is not None:
                    names.add(frame.f_code.co_name)
                    frame = frame.f_back
                if "_await" in names:
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.01)

        threading.Thread(target=interrupt_when_waiting, daemon=True).start()
        try:
            loss.backward()
        except KeyboardInterrupt:
            out["interrupted"] = True
        store.set("interrupted", "1")
    # the next step trains on: its all-reduce must not be overwritten by step 1's
    ddp.zero_grad(set_to_none=True)
    ddp(xs[2]).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in ddp.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(world_size)]
    dist.all_gather(gathered, grads)
    # torch's own average of this step's local gradients (a plain model, same parameters)
    local = _model()
    local.load_state_dict(ddp.module.state_dict())
    local(xs[2]).sum().backward()
    mine = torch.cat([p.grad.flatten() for p in local.parameters()])
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    out["equal_across_ranks"] = torch.equal(gathered[0], gathered[1])
    out["averaged"] = torch.allclose(grads, sum(everyone) / world_size)
    out["error"] = repr(w.error)
    w.close()
    return out


def test_ctrl_c_while_a_peer_is_missing_reaches_backward_and_training_goes_on() -> None:
    results = run_ranks(interrupt_ranks, 2, timeout=120)
    assert results[0]["interrupted"]  # before rank 1 came: torch's own wait would still block
    assert not results[1]["interrupted"]
    for res in results.values():
        assert res["equal_across_ranks"] and res["averaged"], res
        assert res["error"] == "None"  # an interrupt does not end the watch
