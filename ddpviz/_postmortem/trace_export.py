"""A post-mortem as a ddpviz Trace, so that the dashboard and the JupyterLab viewer (which open
`.ddpviz` traces) show a folder of Flight Recorder dumps: the planned bucket maps, each DDP
bucket all-reduce a rank launched (and completed, where it did), buffer broadcasts, the rebuild,
and the findings. Times are the recorder's `time_created_ns`; a completion is placed 1 ns after
its launch (gloo records no completion time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpviz import events as ev
from ddpviz.traces.trace import Trace

if TYPE_CHECKING:
    from ddpviz._postmortem.report import PostMortem


def to_trace(pm: PostMortem) -> Trace:
    """Events per rank from the labelled dumps (DDP's group only) plus one FindingReported per
    finding, on the lowest rank it names (rank 0 when it names none)."""
    out: list[ev.Event] = []
    plan = pm.plan
    first_t = min((d.entries[0].time_created_ns for d in pm.dumps if d.entries), default=0)
    for d in pm.dumps:
        r = d.rank
        mine: list[ev.Event] = []

        def add(cls: Any, step: int, t: int, *, _rank: int = r, _mine: list[ev.Event] = mine,
                **fields: Any) -> None:
            _mine.append(cls(rank=_rank, step=step, t_ns=t, seq=len(_mine), **fields))

        if plan is not None:
            params = tuple(ev.ParamInfo(p.index, p.name, p.shape, p.dtype, p.device,
                                        p.sparse_grad, p.element_size) for p in plan.params)
            add(ev.ParamsBuilt, -1, first_t - 2, params=params, buffers=(), ignored=())
            add(ev.BucketAssigned, -1, first_t - 1,
                buckets=tuple(b.param_indices for b in plan.initial),
                limits=tuple(b.limit for b in plan.initial), rebuilt=False)
        for lab in pm.labels.get(r, []):
            e, ddp = lab.entry, lab.ddp
            if ddp is None:
                continue
            t = e.time_created_ns
            if ddp.phase == "rebuild" and plan is not None and plan.rebuilt is not None \
                    and ddp.numel == len(plan.rebuilt):
                add(ev.BucketsRebuilt, ddp.step, t, grad_ready_order=plan.grad_ready_order)
                add(ev.BucketAssigned, ddp.step, t,
                    buckets=tuple(b.param_indices for b in plan.rebuilt),
                    limits=tuple(b.limit for b in plan.rebuilt), rebuilt=True)
            elif ddp.phase == "buffer_broadcast" and e.completed:
                add(ev.BuffersSynced, ddp.step, t, n_buffers=len(ddp.names), nbytes=ddp.nbytes)
            elif ddp.phase == "bucket":
                add(ev.AllReduceLaunched, ddp.step, t, bucket=ddp.bucket, nbytes=ddp.nbytes,
                    dtype=ddp.dtype)
                if e.completed:
                    add(ev.AllReduceDone, ddp.step, t + 1, bucket=ddp.bucket)
        last_t = max((x.time_created_ns for x in d.entries), default=first_t)
        for f in pm.findings:
            if (min(f.ranks) if f.ranks else 0) == r:
                add(ev.FindingReported, f.step, last_t + 1, finding=f)
        out += mine
    return Trace(out, meta={"source": "ddpviz postmortem",
                            "dumps": [d.source for d in pm.dumps],
                            "world_size": pm.world_size})
