"""The ledger of the job's own collectives (probes/collectives.py) on 2 real gloo ranks: what
each call records (op, what must agree, call site, position, span), read back as the Entry the
ranks compare; a call site is posted first once; the wrappers stay traceable by
torch.compile. The comparison: test_collective_check.py; real jobs: tests/record/."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist


def _line(marker: str) -> int:
    """The line of this file that ends with `# marker`."""
    lines = inspect.getsource(inspect.getmodule(_line)).splitlines()  # type: ignore[arg-type]
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


def _issue(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    from ddpviz.probes import collectives

    assert collectives.install()
    posted: list[str] = []
    collectives.on_new_site = lambda g: posted.append(g.entries[-1].entry().site)
    t = torch.ones(3)
    for _ in range(2):
        dist.all_reduce(t)  # twice
    dist.all_reduce(t.double(), op=dist.ReduceOp.MAX)  # max
    dist.broadcast(torch.ones(2, dtype=torch.int64), src=1)  # broadcast
    dist.broadcast(t, group_src=0)  # group_src
    dist.all_gather([torch.zeros(3) for _ in range(world)], t)  # gather
    dist.all_to_all_single(torch.zeros(world), torch.ones(world))  # all_to_all
    dist.barrier()  # barrier
    dist.all_gather_object([None] * world, {"rank": rank})  # object
    dist.broadcast_object_list([1, 2], src=0)  # objects
    if rank == 0:
        dist.send(t, dst=1)  # send
    else:
        dist.recv(t, src=0)  # recv
    dist.all_reduce(t, group=dist.group.WORLD)  # after p2p
    collectives.on_new_site = None
    ledger = next(g for g in collectives.groups() if g.group is dist.group.WORLD)
    entries = [c.entry() for c in ledger.entries]
    remaps = funcol.traceable_collective_remaps
    traceable = [name for name in ("all_reduce", "all_gather_into_tensor",
                                   "reduce_scatter_tensor")
                 if remaps.get(getattr(dist, name)) is not None
                 and remaps[getattr(dist, name)] is remaps.get(
                     getattr(dist, name).__ddpviz_original__)]
    collectives.release()
    return {"entries": [(e.pos, e.span, e.op, e.sig, e.site, e.asym) for e in entries],
            "posted": posted, "traceable": traceable, "issued": collectives._issued}


def test_each_call_is_recorded_with_what_must_agree_and_its_call_site() -> None:
    results = run_ranks(_issue, 2, timeout=120)
    site = "test_collectives.py:{} in _issue".format
    for rank, r in results.items():
        entries = r["entries"]
        ops = [(op, sig) for _, _, op, sig, _, _ in entries]
        assert ops == [
            ("all_reduce", "float32 x3 sum"), ("all_reduce", "float32 x3 sum"),
            ("all_reduce", "float64 x3 max"), ("broadcast", "int64 x2 from rank 1"),
            ("broadcast", "float32 x3 from group rank 0"), ("all_gather", "float32 x3 into 2"),
            ("all_to_all_single", "float32"), ("barrier", ""), ("all_gather_object", ""),
            ("broadcast_object_list", "2 from rank 0"),
            ("send", "float32 x3 to rank 1") if rank == 0 else ("recv", "float32 x3 from rank 0"),
            ("all_reduce", "float32 x3 sum")], ops
        markers = ["twice", "twice", "max", "broadcast", "group_src", "gather", "all_to_all",
                   "barrier", "object", "objects", "send" if rank == 0 else "recv",
                   "after p2p"]
        assert [e[4] for e in entries] == [site(_line(m)) for m in markers]
        # positions: each call starts where the last one ended; the object collectives issue
        # several (the nested ones are not entries of their own); the point-to-point call is
        # not counted in the positions after it (gloo counts it on the ranks involved only)
        for before, after in itertools.pairwise(entries):
            assert after[0] == before[0] + (0 if before[5] else before[1]), (before, after)
        assert all(span == 1 for _, span, op, *_ in entries if not op.endswith("_object")
                   and op != "broadcast_object_list")
        assert [op for _, span, op, *_ in entries if span > 1] == ["all_gather_object",
                                                                  "broadcast_object_list"]
        assert [e[5] for e in entries] == [False] * 10 + [True, False]
        # a call site is posted before its first collective, once (not the point-to-point one)
        assert r["posted"] == [site(_line(m)) for m in dict.fromkeys(markers)
                               if m not in ("send", "recv")]
        assert r["issued"] == len(entries)
        assert r["traceable"] == ["all_reduce", "all_gather_into_tensor",
                                  "reduce_scatter_tensor"]
    assert [e[:4] for e in results[0]["entries"][:10]] == \
        [e[:4] for e in results[1]["entries"][:10]]
