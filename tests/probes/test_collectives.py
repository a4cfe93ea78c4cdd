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


def _functional(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    from ddpviz.probes import collectives

    graphs: list[str] = []

    def backend(gm: Any, example: Any) -> Any:
        graphs.append(gm.code)
        return gm.forward

    def step(x: Any) -> Any:
        y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)  # f_step_reduce
        return funcol.all_gather_single(y + 1, 0, dist.group.WORLD).sum()  # f_step_gather

    x = torch.arange(4.0) + rank
    compiled_before = torch.compile(step, backend=backend, fullgraph=True)(x)
    torch._dynamo.reset()
    assert collectives.install()
    compiled_after = torch.compile(step, backend=backend, fullgraph=True)(x)
    before = len(collectives.groups()[0].entries) if collectives.groups() else 0
    eager = step(x)  # eager
    group = dist.group.WORLD
    out = [funcol.all_reduce(x, "max", group),  # f_all_reduce
           funcol.broadcast(x, 1, group),  # f_broadcast
           funcol.all_gather_tensor(x, 0, [0, 1]),  # f_gather_ranks
           funcol.reduce_scatter_tensor(x, "sum", 0, group),  # f_reduce_scatter
           funcol.all_to_all_single_autograd(x.double(), None, None, group),  # f_all_to_all
           *funcol.all_reduce_coalesced([x, x[:2]], "sum", group)]  # f_coalesced
    kinds = [type(o).__name__ for o in out]  # not waited for by the ledger
    values = [o.tolist() for o in out]
    ledger = next(g for g in collectives.groups() if g.group is group)
    entries = [c.entry() for c in ledger.entries]
    collectives.release()
    return {"same_graph": graphs[0] == graphs[1], "compiled_recorded": before,
            "results": [float(compiled_before), float(compiled_after), float(eager)],
            "entries": [(e.pos, e.span, e.op, e.sig, e.site) for e in entries],
            "kinds": kinds, "values": values}


def test_functional_collectives_are_recorded_by_name_and_compile_as_without() -> None:
    results = run_ranks(_functional, 2, timeout=180)
    site = "test_collectives.py:{} in _functional".format
    for r in results.values():
        # compiled code: the same graph as without the ledger, nothing recorded from it
        assert r["same_graph"]
        assert r["compiled_recorded"] == 0
        assert len(set(r["results"])) == 1
        assert [e[2:] for e in r["entries"]] == [
            ("all_reduce", "float32 x4 sum",
             "test_collectives.py:{} in step".format(_line("f_step_reduce"))),
            ("all_gather_into_tensor", "float32 x4",
             "test_collectives.py:{} in step".format(_line("f_step_gather"))),
            ("all_reduce", "float32 x4 max", site(_line("f_all_reduce"))),
            ("broadcast", "float32 x4 from rank 1", site(_line("f_broadcast"))),
            ("all_gather_into_tensor", "float32 x4", site(_line("f_gather_ranks"))),
            ("reduce_scatter_tensor", "float32 x4 sum", site(_line("f_reduce_scatter"))),
            ("all_to_all_single", "float64", site(_line("f_all_to_all"))),
            ("all_reduce_coalesced", "2 of float32 x4 sum", site(_line("f_coalesced")))]
        positions = [e[0] for e in r["entries"]]
        assert positions == list(range(positions[0], positions[0] + 8))
        assert all(e[1] == 1 for e in r["entries"])
        # what funcol returns is returned as it is: async tensors, their wait at first use
        assert r["kinds"] == ["AsyncCollectiveTensor"] * 7
    # the same results on both ranks where they must agree (all_reduce, broadcast, all_gather,
    # the coalesced all_reduce), and the right ones
    agree = [0, 1, 2, 5, 6]
    assert [results[0]["values"][i] for i in agree] == [results[1]["values"][i] for i in agree]
    assert results[0]["values"][0] == [1.0, 2.0, 3.0, 4.0]  # max over ranks of arange + rank
    assert results[0]["values"][1] == [1.0, 2.0, 3.0, 4.0]  # rank 1's x


def _marks(rank: int, world: int) -> list[tuple[int, int, int]]:
    import torch
    import torch.distributed as dist

    from ddpviz.probes import collectives

    assert collectives.install()
    marker = collectives.step_marker(dist.group.WORLD)
    t = torch.ones(2)
    marker(0)
    dist.all_reduce(t)
    collectives.mark_ddp_step(dist.group.WORLD, 1)  # (the locked path, for the same group)
    dist.all_reduce(t)
    dist.all_reduce(t)
    marker(2)
    ledger = next(g for g in collectives.groups() if g.group is dist.group.WORLD)
    marks = [(m.pos, m.step, m.bucket) for m in ledger.marks]
    collectives.release()
    return marks


def test_a_ddps_step_marker_marks_the_positions_mark_ddp_step_does() -> None:
    for marks in run_ranks(_marks, 2, timeout=120).values():
        assert marks == [(0, 0, -1), (1, 1, -1), (3, 2, -1)]


def test_the_poster_takes_the_marks_after_the_last_one_it_posted() -> None:
    from collections import deque

    from ddpviz.probes.collective_compare import Mark
    from ddpviz.probes.collectives import new_marks

    marks: deque[Mark] = deque(maxlen=4)
    assert new_marks(list(marks), None) == []
    first = [Mark(i, i, -1) for i in range(3)]
    marks.extend(first)
    assert new_marks(list(marks), None) == first
    assert new_marks(list(marks), first[1]) == first[2:]
    assert new_marks(list(marks), first[2]) == []
    same = Mark(2, 2, -1)  # equal to the last posted, but another mark: identity decides
    marks.append(same)
    assert new_marks(list(marks), first[2]) == [same]
    later = [Mark(10 + i, 10 + i, -1) for i in range(4)]
    marks.extend(later)  # the last posted rotated out of the deque: every kept one is new
    assert new_marks(list(marks), same) == later
