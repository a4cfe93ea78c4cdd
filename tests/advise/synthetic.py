"""Synthetic runs whose answer is known: events generated from a model with a given all-reduce
latency and bandwidth, gradient-ready spacing and optimizer time (no processes)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from torch import nn

from ddpviz import events as ev
from ddpviz.plan import bucket_plan
from ddpviz.traces.trace import Trace

MS = 1_000_000  # ns


def linear_stack(n: int, width: int) -> nn.Module:
    """n bias-free Linear(width, width) layers: n equal parameters."""
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(n)])


def run_trace(module: nn.Module, *, bucket_cap_mb: float | None, latency_s: float,
              seconds_per_byte: float, steps: int = 6, world_size: int = 2,
              forward_ms: float = 5.0, grad_gap_ms: float = 10.0, optimizer_ms: float = 2.0,
              done_at_finalize: bool = False,
              hook_gap_ms: Sequence[float] | None = None) -> Trace:
    """The events of `steps` training steps of `module` with these costs. Gradients become
    ready in reverse registration order, `grad_gap_ms` apart (or `hook_gap_ms[i]` before the
    i-th); all-reduces run in bucket order through one queue (latency + bytes * s/B).
    done_at_finalize: AllReduceDone seen only after the backward, as ddpviz's DDP emits it."""
    n = len(list(module.parameters()))
    order = list(reversed(range(n)))
    plan = bucket_plan(module, bucket_cap_mb=bucket_cap_mb, grad_ready_order=order)
    assert plan.rebuilt is not None
    infos = tuple(ev.ParamInfo(p.index, p.name, p.shape, p.dtype, p.device, False,
                               p.element_size) for p in plan.params)
    events: list[Any] = []
    for rank in range(world_size):
        seq = itertools.count()
        t = 1_000 * MS

        def emit(cls: Any, step: int, at: int, *fields: Any, rank: int = rank,
                 seq: Any = seq) -> None:
            events.append(cls(rank, step, at, next(seq), *fields))

        emit(ev.ParamsBuilt, -1, t, infos, (), ())
        emit(ev.BucketAssigned, -1, t + 1, tuple(b.param_indices for b in plan.initial),
             tuple(b.limit for b in plan.initial), False)
        t += 10 * MS
        for step in range(steps):
            buckets = plan.initial if step == 0 else plan.rebuilt
            emit(ev.ForwardStarted, step, t)
            if step == 1:
                emit(ev.BucketsRebuilt, step, t + 1, tuple(order))
                emit(ev.BucketAssigned, step, t + 2, tuple(b.param_indices for b in buckets),
                     tuple(b.limit for b in buckets), True)
            t += int(forward_ms * MS)
            emit(ev.BackwardStarted, step, t)
            owner = {i: k for k, b in enumerate(buckets) for i in b.param_indices}
            pending = [len(b.slots) for b in buckets]
            ready: list[int] = []
            launches: list[tuple[int, int]] = []
            nxt = 0
            for k, i in enumerate(order):
                t += int((hook_gap_ms[k] if hook_gap_ms else grad_gap_ms) * MS)
                emit(ev.GradReady, step, t, i, owner[i])
                ready.append(t)
                pending[owner[i]] -= 1
                while nxt < len(buckets) and pending[nxt] == 0:
                    launches.append((nxt, t))
                    emit(ev.AllReduceLaunched, step, t + 1, nxt, buckets[nxt].nbytes,
                         buckets[nxt].dtype)
                    nxt += 1
            # the queue (every rank launches alike, so the collective starts at the launch)
            finish, prev = [], 0
            for b, at in launches:
                start = max(at, prev)
                prev = start + int((latency_s + buckets[b].nbytes * seconds_per_byte) * 1e9)
                finish.append(prev)
            last = t
            if done_at_finalize:
                at = last
                for b, f in enumerate(finish):
                    at = max(at + 10_000, f)
                    emit(ev.AllReduceDone, step, at, b)
                end = at
            else:
                for b, f in enumerate(finish):
                    emit(ev.AllReduceDone, step, f, b)
                end = max(last, finish[-1])
            t = end + 100_000
            emit(ev.BackwardFinished, step, t)
            t += int(optimizer_ms * MS)
    events.sort(key=lambda e: (e.rank, e.seq))
    return Trace(events)
