"""A deterministic, DDP-shaped event stream for trace/report tests (no processes needed)."""

from __future__ import annotations

from ddpviz import events as ev

PARAMS = (("fc1.weight", (16, 8)), ("fc1.bias", (16,)), ("fc2.weight", (4, 16)),
          ("fc2.bias", (4,)), ("head.weight", (2, 4)))


def rank_events(rank: int, steps: int = 3, *, unused: bool = False,
                hang_in_step: int | None = None) -> list[ev.Event]:
    """One rank's life: construction, then `steps` iterations with two buckets. With `unused`,
    parameter 4 never gets a gradient; with `hang_in_step`, that step's last all-reduce never
    finishes (the rank stops there)."""
    out: list[ev.Event] = []
    t = 1_000_000 * (rank + 1)
    seq = 0

    def emit(cls: type[ev.Event], step: int, *fields: object, dt: int = 1000) -> None:
        nonlocal t, seq
        t += dt
        out.append(cls(rank, step, t, seq, *fields))
        seq += 1

    infos = tuple(ev.ParamInfo(i, n, s, "float32", "cpu", False)
                  for i, (n, s) in enumerate(PARAMS))
    emit(ev.ParamsBuilt, -1, infos, ("bn.running_mean",), ())
    emit(ev.VerificationStarted, -1, 2, len(PARAMS), 1)
    emit(ev.VerificationPassed, -1, 2, "abc123")
    emit(ev.BroadcastStarted, -1, 0, 6, 1000, 2)
    emit(ev.BroadcastChunkSent, -1, 0, "float32", "cpu", 600, 3)
    emit(ev.BroadcastChunkSent, -1, 1, "float32", "cpu", 400, 3)
    emit(ev.BroadcastChunkDone, -1, 0, 600)
    emit(ev.BroadcastChunkDone, -1, 1, 400)
    emit(ev.BroadcastFinished, -1, 1000, 0.001)
    emit(ev.BucketAssigned, -1, ((4, 3, 2), (1, 0)), (1 << 20, 25 << 20), False)
    for step in range(steps):
        emit(ev.ForwardStarted, step, dt=50_000)
        emit(ev.BuffersSynced, step, 1, 64)
        emit(ev.BackwardStarted, step, dt=200_000)
        for p in (4, 3, 2, 1, 0):
            if unused and p == 4:
                continue
            emit(ev.GradReady, step, p, 0 if p >= 2 else 1)
            if p == 2:
                emit(ev.BucketReady, step, 0)
                emit(ev.AllReduceLaunched, step, 0, 104 * 4, "float32")
            if p == 0:
                emit(ev.BucketReady, step, 1)
                emit(ev.AllReduceLaunched, step, 1, 144 * 4, "float32")
        emit(ev.AllReduceDone, step, 0, dt=30_000)
        if hang_in_step == step:
            return out
        emit(ev.AllReduceDone, step, 1, dt=40_000)
        if unused:
            emit(ev.UnusedParametersFound, step, (4,), ("head.weight",))
        emit(ev.BackwardFinished, step)
        if step == 0:
            emit(ev.BucketsRebuilt, step, (4, 3, 2, 1, 0))
            emit(ev.BucketAssigned, step, ((4, 3), (2, 1, 0)), (1 << 20, 25 << 20), True)
    return out
