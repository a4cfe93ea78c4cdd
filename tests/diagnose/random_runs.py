"""Random runs with defects, event by event as ranks would emit them: orders that differ, hooks
that fire twice, skipped or unfinished all-reduces (hangs), ranks that lag, crash or never
start, unused parameters, dropped events, failed verification, reported findings, events that
arrive out of seq order. For comparing two implementations of one analysis."""

from __future__ import annotations

import random

from ddpviz import events as ev
from ddpviz.events import Event, Tap
from ddpviz.findings import Finding

DEFECTS = ("order", "twice", "skip_allreduce", "hang", "lag", "crash", "missing", "unused",
           "unused_everywhere", "dropped", "verification", "reported", "shuffled",
           "buffers", "rebuild", "rebuilt_map")


def random_run(seed: int, defects: tuple[str, ...] | None = None) -> list[Event]:
    rng = random.Random(seed)
    if defects is None:
        defects = tuple(d for d in DEFECTS if rng.random() < 0.25)
    world = rng.randint(2, 5)
    n_params = rng.randint(3, 12)
    steps = rng.randint(1, 4)
    names = [f"layer{i // 2}.{'weight' if i % 2 == 0 else 'bias'}" for i in range(n_params)]
    reverse = tuple(range(n_params - 1, -1, -1))
    cut = max(1, n_params // rng.randint(1, 3))
    buckets = tuple(tuple(reverse[i:i + cut]) for i in range(0, n_params, cut))
    bucket_of = {p: b for b, ps in enumerate(buckets) for p in ps}
    per_rank: dict[int, list[Event]] = {r: [] for r in range(world)}
    taps = {r: Tap(per_rank[r].append, rank=r) for r in range(world)}
    t = [10**9]

    def emit(r: int, cls: type[Event], *fields: object) -> None:
        tap = taps[r]
        t[0] += rng.randint(1, 50)
        tap._emitter(cls(r, tap.step, t[0] + 1000 * r, next(tap._counter), *fields))  # type: ignore[misc]

    odd = rng.randrange(world)
    missing = {odd} if "missing" in defects and world > 2 else set()
    for r in range(world):
        if r in missing:
            continue
        tap = taps[r]
        params = tuple(ev.ParamInfo(i, n, (4, 2), "float32", "cpu", False, 4)
                       for i, n in enumerate(names))
        emit(r, ev.ParamsBuilt, params, ("bn.running_mean",), ())
        emit(r, ev.VerificationStarted, world, n_params, 1)
        if "verification" in defects:
            m = ev.Mismatch("param", 1, names[1], "shape",
                            (("(4, 2)", tuple(x for x in range(world) if x != odd)),
                             ("(4, 3)", (odd,))))
            emit(r, ev.VerificationFailed, world, (m,))
            continue
        emit(r, ev.VerificationPassed, world, "abc")
        emit(r, ev.BroadcastStarted, 0, n_params, 64 * n_params, 1)
        emit(r, ev.BroadcastChunkSent, 0, "float32", "cpu", 64 * n_params, n_params)
        if "hang" in defects and r == odd and rng.random() < 0.3:
            continue  # stuck inside the broadcast
        emit(r, ev.BroadcastChunkDone, 0, 64 * n_params)
        emit(r, ev.BroadcastFinished, 64 * n_params, 0.001)
        emit(r, ev.BucketAssigned, buckets, (1 << 20,) * len(buckets), False)
        last = steps
        if r == odd and ("lag" in defects or "crash" in defects):
            last = rng.randint(0, steps - 1)
        for step in range(last):
            tap.step = step
            emit(r, ev.ForwardStarted)
            if "buffers" in defects and (r != odd or step != 0):
                emit(r, ev.BuffersSynced, 1, 16)
            if "rebuild" in defects and step == 1 and r != odd:
                emit(r, ev.BucketsRebuilt, reverse)
            if "rebuilt_map" in defects and step == 1:
                emit(r, ev.BucketAssigned, buckets[::-1], (1 << 20,) * len(buckets), True)
            emit(r, ev.BackwardStarted)
            order = list(reverse)
            unused: list[int] = []
            if "unused_everywhere" in defects:
                unused.append(0)
            if "unused" in defects and r == odd:
                unused.append(n_params - 1)
            if "order" in defects and r == odd and len(order) > 2 and step >= steps - 2:
                i = rng.randrange(len(order) - 1)
                order[i], order[i + 1] = order[i + 1], order[i]
            order = [p for p in order if p not in unused]
            if "twice" in defects and r == odd and step == 0:
                order.append(order[0])
            for p in order:
                emit(r, ev.GradReady, p, bucket_of[p])
            hung = "hang" in defects and r == odd and step == last - 1
            if "crash" in defects and r == odd and step == last - 1:
                break
            for b in range(len(buckets)):
                if "skip_allreduce" in defects and r == odd and b == 0 and step == 0:
                    continue
                emit(r, ev.BucketReady, b)
                emit(r, ev.AllReduceLaunched, b, 32 * len(buckets[b]), "float32")
            if hung:
                emit(r, ev.AllReduceDone, 0)
                break
            for b in range(len(buckets)):
                emit(r, ev.AllReduceDone, b)
            if unused:
                emit(r, ev.UnusedParametersFound, tuple(unused),
                     tuple(names[p] for p in unused))
            emit(r, ev.BackwardFinished)
        if "dropped" in defects and r == odd:
            emit(r, ev.EventsDropped, rng.randint(1, 9))
            del per_rank[r][rng.randrange(1, len(per_rank[r]) - 1)]
        if "reported" in defects:
            f = Finding(kind="buffer_reassigned", severity="warning",
                        title=f"buffer 'bn.running_mean' was reassigned on rank {r}",
                        ranks=(r,), name="bn.running_mean", field="buffer",
                        values=((f"id {r}", (r,)),), world_size=world)
            emit(r, ev.FindingReported, f)
    if "shuffled" in defects:
        lst = per_rank[odd]
        if len(lst) > 3:
            i = rng.randrange(len(lst) - 2)
            lst[i], lst[i + 1] = lst[i + 1], lst[i]
    # interleave the ranks as a collector would receive them: in chunks, by time
    out: list[Event] = []
    cursors = dict.fromkeys(per_rank, 0)
    while any(cursors[r] < len(per_rank[r]) for r in per_rank):
        r = rng.choice([r for r in per_rank if cursors[r] < len(per_rank[r])])
        n = rng.randint(1, 8)
        out += per_rank[r][cursors[r]:cursors[r] + n]
        cursors[r] += n
    return out
