"""Simulated paused ranks for the notebook side's tests: a session whose collector hands each
command to in-process fake ranks, which answer with the protocol's events (computed from numpy
arrays the way a rank summarises a tensor) on another thread, as a real collector's would."""

from __future__ import annotations

import base64
import hashlib
import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddpviz import events as ev
from ddpviz.debugger import protocol as p
from ddpviz.debugger.tensor_summary import _chunk_digest

_seq = itertools.count()


def event(cls: type[ev.E], rank: int, step: int, *fields: object) -> ev.E:
    return cls(rank, step, 0, next(_seq), *fields)


def _digest(b: bytes) -> str:
    return hashlib.blake2b(b, digest_size=16).hexdigest()


def summarize(rank: int, step: int, request: int, name: str, what: str,
              a: np.ndarray) -> ev.Inspected:
    """An Inspected of numpy array `a`, the fields computed as the protocol describes."""
    flat = a.reshape(-1)
    finite = np.isfinite(flat)
    chunk = max(1, -(-flat.size // 256))
    bins = np.array_split(~finite, min(64, max(flat.size, 1)))
    bad = np.flatnonzero(~finite)[:16]
    fin = flat[finite].astype(np.float64)
    return event(ev.Inspected, rank, step, request, name, what, "", tuple(a.shape),
                 str(a.dtype), "cpu", int(flat.size), float(np.sqrt((fin ** 2).sum())),
                 float(np.abs(fin).max()) if fin.size else 0.0,
                 int(np.isnan(flat).sum()), int(np.isposinf(flat).sum()),
                 int(np.isneginf(flat).sum()),
                 tuple(tuple(int(i) for i in np.unravel_index(int(j), a.shape)) for j in bad),
                 tuple(float(b.mean()) if b.size else 0.0 for b in bins),
                 _digest(a.tobytes()), chunk,
                 tuple(_chunk_digest(memoryview(flat[i:i + chunk].tobytes()))
                       for i in range(0, flat.size, chunk)),
                 tuple(float(x) for x in flat[:8]))


@dataclass
class Stats:
    received: dict[int, int] = field(default_factory=dict)
    closed: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class FakeRank:
    rank: int
    tensors: dict[tuple[str, str], np.ndarray]
    step: int = 3
    silent: set[str] = field(default_factory=set)  # command class names it never answers
    refuse: dict[str, str] = field(default_factory=dict)  # command class name -> reason
    parked: bool = False
    bucket_points: bool = True  # what its DebugArmed says

    def handle(self, c: p.Command) -> list[ev.Event]:
        kind = type(c).__name__
        if kind in self.silent:
            return []
        if kind in self.refuse:
            return [event(ev.DebugRefused, self.rank, self.step, c.request, self.refuse[kind])]
        if isinstance(c, p.Arm):
            return [event(ev.DebugArmed, self.rank, self.step, c.request, self.bucket_points,
                          "ddpviz" if self.bucket_points else "torch-hookless")]
        if isinstance(c, p.Pause):
            self.parked = True
            return [event(ev.Parked, self.rank, self.step, "forward", -1, "pause", c.request)]
        if isinstance(c, p.SetBreaks):
            hit = [b for b in c.breaks if isinstance(b, p.BreakAt)]
            if hit:  # a fake rank reaches the break at once
                b = hit[0]
                self.step = b.step
                self.parked = True
                return [event(ev.Parked, self.rank, b.step, b.where, b.bucket, "break_at", 0)]
            return []
        if isinstance(c, (p.Resume, p.Step)):
            self.parked = False
            out: list[ev.Event] = [event(ev.Unparked, self.rank, self.step, kind.lower(),
                                         c.request)]
            if isinstance(c, p.Step):
                self.step += 1
                self.parked = True
                out.append(event(ev.Parked, self.rank, self.step, "forward", -1, "step",
                                 c.request))
            return out
        if isinstance(c, p.Inspect):
            a = self.tensors.get((c.name, c.what))
            if a is None:
                return [event(ev.Inspected, self.rank, self.step, c.request, c.name, c.what,
                              f"no tensor {c.what} of {c.name!r} here")]
            return [summarize(self.rank, self.step, c.request, c.name, c.what, a)]
        if isinstance(c, p.Fetch):
            a = self.tensors[(c.name, c.what)].reshape(-1)
            if c.chunk >= 0:
                size = max(1, -(-a.size // 256))
                lo, hi = c.chunk * size, min((c.chunk + 1) * size, a.size)
            else:
                lo, hi = c.start, c.stop or a.size
            if hi - lo > c.max_elements:
                return [event(ev.Fetched, self.rank, self.step, c.request, c.name, c.what,
                              f"{hi - lo} elements is more than max_elements; ask for a slice")]
            raw = a[lo:hi].tobytes()
            half = len(raw) // 2 // a.itemsize * a.itemsize  # two parts, to join
            return [event(ev.Fetched, self.rank, self.step, c.request, c.name, c.what, "",
                          str(a.dtype), tuple(self.tensors[(c.name, c.what)].shape), lo + off,
                          i, 2, base64.b64encode(chunk).decode())
                    for i, (off, chunk) in enumerate(((0, raw[:half]),
                                                      (half // a.itemsize, raw[half:])))]
        if isinstance(c, p.RunCode):
            return [event(ev.CodeRan, self.rank, self.step, c.request, f"rank {self.rank}\n",
                          repr(self.step), "")]
        if isinstance(c, p.Stacks):
            return [event(ev.StacksTaken, self.rank, self.step, c.request, ("MainThread",),
                          (f"  train.py:{10 + self.rank % 2} in train",))]
        if isinstance(c, p.Abort):
            return []
        raise AssertionError(f"unexpected command {c!r}")


class FakeCollector:
    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.stats = Stats()
        self.sent: list[tuple[int | None, list[p.Command]]] = []

    def send_control(self, rank: int | None, commands: list[p.Command]) -> tuple[int, ...]:
        self.sent.append((rank, list(commands)))
        ranks = self.session.ranks
        targets = [r for r in ranks if rank is None or r == rank]
        if rank is not None and not targets:
            raise ValueError(f"ddpviz: rank {rank} has not connected to this collector")
        for r in targets:
            if r in self.stats.closed:
                continue
            for c in commands:
                self.session.inbox.put((r, c))
        return tuple(r for r in targets if r not in self.stats.closed)


class FakeSession:
    """Enough of a Session for a Debugger: subscribe, a collector with send_control."""

    def __init__(self, ranks: dict[int, FakeRank], history: list[ev.Event] = ()) -> None:
        self.ranks = ranks
        self.collector = FakeCollector(self)
        self.history = list(history)
        for r in ranks:
            self.collector.stats.received[r] = 1
        self.callbacks: list[Callable[[list[ev.Event]], None]] = []
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def subscribe(self, callback: Callable[[Any], None], *, batch: bool = False,
                  replay: bool = False) -> Callable[[], None]:
        assert batch
        if replay:
            callback(list(self.history))
        self.callbacks.append(callback)
        return lambda: self.callbacks.remove(callback)

    def deliver(self, events: list[ev.Event]) -> None:
        self.history.extend(events)
        for cb in list(self.callbacks):
            cb(events)

    def _serve(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                return
            r, c = item
            out = self.ranks[r].handle(c)
            if isinstance(c, p.Abort):
                self.collector.stats.closed[r] = (1, 0)
            if out:
                self.deliver(out)

    def close(self) -> None:
        self.inbox.put(None)
        self._thread.join(2)


def params_built(rank: int, names: list[str], shapes: list[tuple[int, ...]]) -> ev.ParamsBuilt:
    infos = tuple(ev.ParamInfo(i, n, s, "float32", "cpu", False, 4)
                  for i, (n, s) in enumerate(zip(names, shapes, strict=True)))
    return event(ev.ParamsBuilt, rank, -1, infos, (), ())


def bucket_assigned(rank: int, step: int, buckets: tuple[tuple[int, ...], ...]
                    ) -> ev.BucketAssigned:
    return event(ev.BucketAssigned, rank, step, buckets, (), step >= 0)
