"""Build event lists by hand for diagnosis tests: what each rank of a run would have emitted."""

from __future__ import annotations

from typing import Any

from ddpviz import events as ev
from ddpviz.events import Event, Tap

NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


class Ranks:
    """One Tap per rank, all appending to `events`; `step(s)` sets every rank's step."""

    def __init__(self, world_size: int) -> None:
        self.events: list[Event] = []
        self.taps = [Tap(self.events.append, rank=r) for r in range(world_size)]

    def emit(self, rank: int, cls: type[Event], *fields: Any, step: int | None = None) -> None:
        tap = self.taps[rank]
        if step is not None:
            tap.step = step
        tap.emit(cls, *fields)

    def construct(self, ranks: list[int] | None = None, world_size: int | None = None,
                  buckets: tuple[tuple[int, ...], ...] = ((3, 2, 1, 0),)) -> None:
        """ParamsBuilt, verification passed and the constructor's bucket map."""
        world_size = world_size or len(self.taps)
        for r in ranks if ranks is not None else range(len(self.taps)):
            params = tuple(ev.ParamInfo(i, n, (4,), "float32", "cpu", False)
                           for i, n in enumerate(NAMES))
            self.emit(r, ev.ParamsBuilt, params, (), (), step=-1)
            self.emit(r, ev.VerificationStarted, world_size, 4, 0)
            self.emit(r, ev.VerificationPassed, world_size, "00")
            self.emit(r, ev.BucketAssigned, buckets, (1 << 20,) * len(buckets), False)

    def iteration(self, rank: int, step: int, order: tuple[int, ...] = (3, 2, 1, 0),
                  buckets: tuple[tuple[int, ...], ...] = ((3, 2, 1, 0),),
                  reduce: bool = True, finish: bool = True) -> None:
        """One forward/backward on `rank`: hooks in `order`, all-reduce of every bucket."""
        self.emit(rank, ev.ForwardStarted, step=step)
        self.emit(rank, ev.BackwardStarted)
        bucket_of = {p: b for b, members in enumerate(buckets) for p in members}
        for p in order:
            self.emit(rank, ev.GradReady, p, bucket_of.get(p, 0))
        if not reduce:
            return
        for b in range(len(buckets)):
            self.emit(rank, ev.BucketReady, b)
            self.emit(rank, ev.AllReduceLaunched, b, 64, "float32")
        if not finish:
            return
        for b in range(len(buckets)):
            self.emit(rank, ev.AllReduceDone, b)
        self.emit(rank, ev.BackwardFinished)
