"""Small hostile trace files that once made ddpviz allocate until MemoryError or run for
minutes (issue #12): a huge declared world size, ranks of +-2**63, 10**10 broadcast chunks,
100,000 buckets, 200,000 shape dimensions; and (issue #23) fields within the limits whose
product sized a widget: 256 ranks each declaring 65,536 broadcast chunks, a failed
verification across 131,072 ranks naming 300 parameters, ranks x parameters never ready,
ranks x the positions of a long reference hook order. Shared by tests/security and
benchmarks/bench_hostile.py. The events are built directly (constructors do not check limits,
decoders do), as an attacker's writer would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddpviz import events as ev
from ddpviz.events import Event, ParamInfo
from ddpviz.traces.fileformat import TraceWriter


def _ctor(rank: int = 0, world_size: int = 2) -> list[Event]:
    return [ev.VerificationStarted(rank, -1, 1_000, 0, world_size, 1, 0),
            ev.VerificationPassed(rank, -1, 2_000, 1, world_size, "d")]


def world_size() -> list[Event]:
    return _ctor(world_size=10**10)


def huge_ranks() -> list[Event]:
    return [*_ctor(rank=2**63 - 1), *_ctor(rank=-(2**63)),
            ev.ForwardStarted(2**63 - 1, 0, 3_000, 2)]


def chunks() -> list[Event]:
    return [ev.BroadcastStarted(0, -1, 1_000, 0, 0, 1, 10, 10**10),
            ev.BroadcastChunkSent(0, -1, 2_000, 1, 10**10 - 1, "float32", "cpu", 10, 1),
            ev.BroadcastChunkDone(0, -1, 3_000, 2, 10**10 - 1, 10)]


def many_buckets(n: int = 100_000) -> list[Event]:
    params = tuple(ParamInfo(i, f"p{i}", (1,), "float32", "cpu", False) for i in range(n))
    out: list[Event] = [ev.ParamsBuilt(0, -1, 1_000, 0, params, (), ()), *_ctor()]
    out.append(ev.BucketAssigned(0, -1, 3_000, 3, tuple((i,) for i in range(n)),
                                 (4,) * n, False))
    t, seq = 10_000, 4
    out.append(ev.ForwardStarted(0, 0, t, seq))
    out.append(ev.BackwardStarted(0, 0, t + 1, seq + 1))
    seq += 2
    for i in reversed(range(n)):
        t += 10
        out += [ev.GradReady(0, 0, t, seq, i, i), ev.BucketReady(0, 0, t + 1, seq + 1, i),
                ev.AllReduceLaunched(0, 0, t + 2, seq + 2, i, 4, "float32"),
                ev.AllReduceDone(0, 0, t + 5, seq + 3, i)]
        seq += 4
    out.append(ev.BackwardFinished(0, 0, t + 10, seq))
    return out


def many_dims(n: int = 200_000) -> list[Event]:
    p = ParamInfo(0, "w", (2,) * n, "float32", "cpu", False)
    return [ev.ParamsBuilt(0, -1, 1_000, 0, (p,), (), ()), *_ctor(),
            ev.BucketAssigned(0, -1, 3_000, 3, ((0,),), (4,), False)]


def broadcast_chunks(ranks: int = 256) -> list[Event]:
    """Each rank starts a broadcast of the most chunks allowed, and sends none (25 KB)."""
    return [ev.BroadcastStarted(r, -1, 1_000 + r, 0, 0, 1, 10, 65_536) for r in range(ranks)]


def verification_world(params: int = 300) -> list[Event]:
    """One rank reports a verification failed across the largest world allowed, with one
    shape mismatch per parameter between two ranks (24 KB)."""
    mismatches = tuple(ev.Mismatch("param", i, f"p{i}", "shape", (("(4,)", (0,)),
                                                                ("(5,)", (1,))))
                       for i in range(params))
    return [ev.VerificationFailed(0, -1, 1_000, 0, 1 << 17, mismatches)]


def unused_params(params: int = 12_000, ranks: int = 1_000) -> list[Event]:
    """A model of `params` parameters; in iteration 0 each rank fires one gradient hook and
    finishes backward: every other parameter is unused there, on every rank (0.9 MB)."""
    infos = tuple(ParamInfo(i, "p", (1,), "f", "c", False) for i in range(params))
    out: list[Event] = [ev.ParamsBuilt(0, -1, 1_000, 0, infos, (), ())]
    for r in range(ranks):
        out += [ev.BackwardStarted(r, 0, 10_000, 1), ev.GradReady(r, 0, 10_001, 2, r, 0),
                ev.BackwardFinished(r, 0, 10_002, 3)]
    return out


def long_reference_order(params: int = 12_000, ranks: int = 1_000) -> list[Event]:
    """Rank 0 fires all `params` hooks in iteration 0 (the reference order); every other rank
    fires one (1.6 MB): each departs from the reference at params - 1 positions."""
    infos = tuple(ParamInfo(i, "p", (1,), "f", "c", False) for i in range(params))
    out: list[Event] = [ev.ParamsBuilt(0, -1, 1_000, 0, infos, (), ()),
                        ev.BackwardStarted(0, 0, 10_000, 1)]
    out += [ev.GradReady(0, 0, 10_001 + i, 2 + i, i, 0) for i in range(params)]
    for r in range(1, ranks):
        out += [ev.BackwardStarted(r, 0, 10_000, 1), ev.GradReady(r, 0, 10_001, 2, r, 0)]
    return out


BOMBS: dict[str, Callable[[], list[Event]]] = {
    "world_size=10**10": world_size, "ranks +-2**63": huge_ranks,
    "10**10 broadcast chunks": chunks, "100,000 buckets": many_buckets,
    "200,000 shape dims": many_dims,
    "256 ranks x 65,536 broadcast chunks": broadcast_chunks,
    "131,072-rank verification x 300 params": verification_world,
    "1,000 ranks x 12,000 unused params": unused_params,
    "1,000 ranks x a 12,000-hook reference order": long_reference_order,
}


def write(path: Path, events: list[Event]) -> Path:
    with TraceWriter(path) as w:
        w.write_many(events)
    return path
