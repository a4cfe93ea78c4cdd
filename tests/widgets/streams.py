"""Synthetic but realistic event streams, shaped like the engine's (see a real 2-rank trace in
test_real_run.py): constructor (params, verification, coalesced broadcast with at most 2 chunks
in flight, initial buckets), then per iteration forward, backward with hooks in reverse
registration order, buckets launched as they fill, the rebuild before iteration 1's forward.
Defects can be planted on one rank: a different shape, a missing parameter, a swapped hook
order, unused parameters. Used by the widget tests and by benchmarks/bench_widgets.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ddpviz import events as ev
from ddpviz.events import Event, Mismatch, ParamInfo

MAXSIZE = sys.maxsize
US = 1_000  # ns


@dataclass
class Plant:
    """Defects to plant (all default to none)."""

    shape: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)  # rank->(p, shape)
    missing: dict[int, int] = field(default_factory=dict)  # rank -> param index it lacks
    swap: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # rank -> (step, i, j)
    unused: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> param indices
    slow: dict[int, int] = field(default_factory=dict)  # rank -> extra us per gradient hook


def mlp_params(n: int, width: int = 16) -> list[ParamInfo]:
    """n parameters: weight/bias pairs of Linear(width, width) layers."""
    out = []
    for i in range(n):
        layer, is_bias = divmod(i, 2)
        shape = (width,) if is_bias else (width, width)
        out.append(ParamInfo(i, f"{layer}.{'bias' if is_bias else 'weight'}", shape, "float32",
                             "cpu", False))
    return out


def nbytes(p: ParamInfo) -> int:
    n = 4
    for d in p.shape:
        n *= d
    return n


def rebuilt_map(params: Sequence[ParamInfo], order: Sequence[int],
                cap: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    buckets: list[list[int]] = [[]]
    size = 0
    for i in order:
        buckets[-1].append(i)
        size += nbytes(params[i])
        if size >= cap:
            buckets.append([])
            size = 0
    if not buckets[-1]:
        buckets.pop()
    return tuple(tuple(b) for b in buckets), tuple(cap for _ in buckets)


class _Rank:
    def __init__(self, rank: int, t0: int) -> None:
        self.rank, self.t, self.seq, self.step = rank, t0, 0, -1
        self.out: list[Event] = []

    def emit(self, cls: type[Event], *fields: object, dt: int = 20 * US) -> None:
        self.t += dt
        self.out.append(cls(self.rank, self.step, self.t, self.seq, *fields))
        self.seq += 1


def synthetic_run(world_size: int = 2, n_params: int = 6, steps: int = 3, *,
                  width: int = 16, cap: int = 1100, chunk_bytes: int = 1024,
                  buffers: Sequence[str] = (), plant: Plant | None = None,
                  hook_us: int = 30, allreduce_us: int = 400) -> list[Event]:
    """Every rank's events, each rank's in emission order (ranks concatenated).

    Args:
        chunk_bytes: the broadcast's coalescing limit (250 MiB in DDP; small here for chunks).
        cap: the rebuilt buckets' byte limit.
    """
    plant = plant or Plant()
    params = mlp_params(n_params, width)
    out: list[Event] = []
    for rank in range(world_size):
        out += _one_rank(rank, world_size, params, steps, cap, chunk_bytes, buffers, plant,
                         hook_us, allreduce_us, width)
    return out


def _mismatches(world_size: int, params: Sequence[ParamInfo], plant: Plant) -> list[Mismatch]:
    found = []
    for rank, (p, shape) in plant.shape.items():
        others = tuple(r for r in range(world_size) if r != rank)
        found.append(Mismatch("param", p, params[p].name, "shape",
                              ((str(params[p].shape), others), (str(shape), (rank,)))))
    for rank, p in plant.missing.items():
        others = tuple(r for r in range(world_size) if r != rank)
        found.append(Mismatch("count", -1, "parameters", "count",
                              ((str(len(params)), others), (str(len(params) - 1), (rank,)))))
        found.append(Mismatch("param", p, params[p].name, "present",
                              (("present", others), ("missing", (rank,)))))
    return found


def _one_rank(rank: int, world_size: int, params: Sequence[ParamInfo], steps: int, cap: int,
              chunk_bytes: int, buffers: Sequence[str], plant: Plant, hook_us: int,
              allreduce_us: int, width: int) -> list[Event]:
    r = _Rank(rank, 1_000_000_000 + 7 * US * rank)
    mine = list(params)
    if rank in plant.shape:
        p, shape = plant.shape[rank]
        mine[p] = ParamInfo(p, mine[p].name, shape, "float32", "cpu", False)
    if rank in plant.missing:
        gone = plant.missing[rank]
        mine = [ParamInfo(i, q.name, q.shape, q.dtype, q.device, q.sparse_grad)
                for i, q in enumerate(x for x in mine if x.index != gone)]
    r.emit(ev.ParamsBuilt, tuple(mine), tuple(buffers), ())
    r.emit(ev.VerificationStarted, world_size, len(mine), len(buffers))
    mismatches = _mismatches(world_size, params, plant)
    if mismatches:
        r.emit(ev.VerificationFailed, world_size, tuple(mismatches), dt=300 * US)
        return r.out
    r.emit(ev.VerificationPassed, world_size, "0123456789abcdef", dt=300 * US)
    # coalesced broadcast: chunks of at most chunk_bytes, at most 2 in flight
    sizes = [nbytes(p) for p in params] + [4 * width for _ in buffers]
    chunks: list[tuple[int, int]] = []  # (bytes, tensors)
    for s in sizes:
        if chunks and chunks[-1][0] + s <= chunk_bytes:
            chunks[-1] = (chunks[-1][0] + s, chunks[-1][1] + 1)
        else:
            chunks.append((s, 1))
    r.emit(ev.BroadcastStarted, 0, len(sizes), sum(sizes), len(chunks))
    in_flight: list[int] = []
    for i, (b, n) in enumerate(chunks):
        if len(in_flight) >= 2:
            j = in_flight.pop(0)
            r.emit(ev.BroadcastChunkDone, j, chunks[j][0], dt=200 * US)
        r.emit(ev.BroadcastChunkSent, i, "float32", "cpu", b, n)
        in_flight.append(i)
    for j in in_flight:
        r.emit(ev.BroadcastChunkDone, j, chunks[j][0], dt=200 * US)
    r.emit(ev.BroadcastFinished, sum(sizes), 0.001)
    all_params = tuple(range(len(params)))
    buckets: tuple[tuple[int, ...], ...] = (all_params,)
    r.emit(ev.BucketAssigned, buckets, (MAXSIZE,), False)
    reverse = list(reversed(all_params))
    for step in range(steps):
        r.step = step
        r.emit(ev.ForwardStarted, dt=1000 * US)
        if step == 1:
            r.emit(ev.BucketsRebuilt, tuple(reverse))
            buckets, limits = rebuilt_map(params, reverse, cap)
            r.emit(ev.BucketAssigned, buckets, limits, True)
        r.emit(ev.BackwardStarted, dt=500 * US)
        order = list(reverse)
        if rank in plant.swap and plant.swap[rank][0] == step:
            _, i, j = plant.swap[rank]
            order[i], order[j] = order[j], order[i]
        unused = set(plant.unused.get(rank, ()))
        bucket_of = {p: b for b, members in enumerate(buckets) for p in members}
        pending = {b: set(members) - unused for b, members in enumerate(buckets)}
        launched: list[tuple[int, int]] = []  # (bucket, done time)
        next_launch = 0
        for p in order:
            if p in unused:
                continue
            b = bucket_of[p]
            r.emit(ev.GradReady, p, b, dt=(hook_us + plant.slow.get(rank, 0)) * US)
            pending[b].discard(p)
            while next_launch < len(buckets) and not pending[next_launch]:
                r.emit(ev.BucketReady, next_launch, dt=2 * US)
                nb = sum(nbytes(params[i]) for i in buckets[next_launch])
                r.emit(ev.AllReduceLaunched, next_launch, nb, "float32", dt=3 * US)
                launched.append((next_launch, r.t + allreduce_us * US))
                next_launch += 1
            while launched and launched[0][1] <= r.t:
                r.emit(ev.AllReduceDone, launched.pop(0)[0], dt=1)
        if unused:
            r.emit(ev.UnusedParametersFound, tuple(sorted(unused)),
                   tuple(params[i].name for i in sorted(unused)))
        for b, done in launched:
            r.t = max(r.t, done)
            r.emit(ev.AllReduceDone, b, dt=1)
        r.emit(ev.BackwardFinished)
    return r.out


def summarize_steps(events: Sequence[Event], steps: Iterable[int]) -> list[Event]:
    """`events` as a detail level that aggregates `steps` would have emitted them: on those
    steps every bucket's GradReady events become one GradsSummarized (count, bytes, first and
    last ready time) just before that bucket's BucketReady (see recording.py)."""
    chosen = set(steps)
    sizes: dict[tuple[int, int], int] = {}
    for e in events:
        if isinstance(e, ev.ParamsBuilt):
            for p in e.params:
                sizes[(e.rank, p.index)] = nbytes(p)
    pending: dict[tuple[int, int, int], list[ev.GradReady]] = {}
    out: list[Event] = []
    for e in events:
        if isinstance(e, ev.GradReady) and e.step in chosen:
            pending.setdefault((e.rank, e.step, e.bucket), []).append(e)
            continue
        if isinstance(e, ev.BucketReady) and e.step in chosen:
            grads = pending.pop((e.rank, e.step, e.bucket), [])
            if grads:
                out.append(ev.GradsSummarized(
                    e.rank, e.step, e.t_ns - 1, e.seq, e.bucket, len(grads), grads[0].t_ns,
                    grads[-1].t_ns, sum(sizes[(e.rank, g.param)] for g in grads)))
        out.append(e)
    return out
