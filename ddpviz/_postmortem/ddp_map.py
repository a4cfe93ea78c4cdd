"""DDP's collectives, in the order torch 2.13's DistributedDataParallel launches them on its
process group, from the exact bucket planner: the constructor's verification and state
broadcasts, then per step the rebuild broadcasts, the buffer broadcast, the bucket all-reduces
of the initial or rebuilt map and find_unused's used-map all-reduce. `match_rank` walks one
rank's Flight Recorder entries along that schedule and names each entry in DDP's terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ddpviz._postmortem.dumps import FrEntry
from ddpviz.engine.params import build_buffers, build_params_for_reducer, parameters_to_ignore
from ddpviz.plan import BucketPlan, PlannedBucket
from ddpviz.units import human_bytes

# torch's broadcast_bucket_size: the state and buffer broadcasts are coalesced in 250 MiB chunks.
BROADCAST_BUCKET_BYTES = 250 * 2**20


@dataclass(frozen=True)
class DdpCollective:
    """One collective DDP launches, with what it carries."""

    phase: str  # "verify" | "state_broadcast" | "rebuild" | "buffer_broadcast" | "bucket"
    # | "used_map"
    step: int  # DDP iteration; -1 for the constructor
    op: str  # Flight Recorder's op name: "all_reduce", "broadcast", "all_gather"
    dtype: str
    numel: int
    bucket: int = -1  # bucket index in reduction order
    names: tuple[str, ...] = ()  # parameters (bucket) or buffers carried
    param_indices: tuple[int, ...] = ()
    nbytes: int = 0
    which: str = ""  # "initial" | "rebuilt" for buckets

    def label(self) -> str:
        """'bucket 5 of step 812 (layers.10.weight … layers.11.bias, 23.1 MiB)'."""
        where = "the constructor" if self.step < 0 else f"step {self.step}"
        if self.phase == "bucket":
            return (f"bucket {self.bucket} of {where} ({name_span(self.names)}, "
                    f"{human_bytes(self.nbytes)})")
        what = {"verify": "model verification", "state_broadcast": "state broadcast",
                "rebuild": "bucket-rebuild broadcast", "buffer_broadcast": "buffer broadcast",
                "used_map": "used-parameter map all-reduce"}[self.phase]
        return f"the {what} of {where} ({self.op} of {self.numel:,} {self.dtype})"

    def matches(self, e: FrEntry) -> bool:
        return e.op == self.op and e.numel == self.numel and set(e.dtypes) == {self.dtype}


def name_span(names: Sequence[str]) -> str:
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]} … {names[-1]}, {len(names)} params"


class DdpSchedule:
    """The sequence of DDP's collectives for a module, a bucket plan and DDP's settings."""

    def __init__(self, module: nn.Module, plan: BucketPlan, *, broadcast_buffers: bool = True,
                 init_sync: bool = True):
        self.plan = plan
        ignore = parameters_to_ignore(module)
        entries = build_params_for_reducer(module)
        self.constructor: list[DdpCollective] = []
        if init_sync:
            dims = sum(2 * e.param.dim() for e in entries)
            self.constructor.append(DdpCollective("verify", -1, "all_gather", "int64", 1))
            self.constructor.append(DdpCollective("verify", -1, "broadcast", "int64", dims))
            states: list[tuple[str, Any]] = [
                (n, p) for n, p in module.named_parameters() if n not in ignore]
            if broadcast_buffers:
                states += build_buffers(module, ignore)
            self.constructor += _coalesced("state_broadcast", -1, states)
        buffers = build_buffers(module, ignore) if broadcast_buffers else []
        self._buffers = _coalesced("buffer_broadcast", 0, buffers)
        settings = plan.settings
        self.rebuild_step = -1 if plan.rebuilt is None else (2 if settings.static_graph else 1)
        self._stable = max(self.rebuild_step + 1, 1)
        self._steps = [self._make_step(s) for s in range(self._stable + 1)]

    def _make_step(self, step: int) -> list[DdpCollective]:
        out: list[DdpCollective] = []
        n = len(self.plan.params)
        rebuilt = self.plan.rebuilt
        if step == self.rebuild_step and rebuilt is not None:
            out.append(DdpCollective("rebuild", step, "broadcast", "int32", n + 1))
            out.append(DdpCollective("rebuild", step, "broadcast", "int32", len(rebuilt)))
        out += [DdpCollective(b.phase, step, b.op, b.dtype, b.numel, names=b.names,
                              nbytes=b.nbytes) for b in self._buffers]
        use_rebuilt = rebuilt is not None and 0 <= self.rebuild_step <= step
        buckets: Sequence[PlannedBucket] = rebuilt if use_rebuilt and rebuilt else \
            self.plan.initial
        which = "rebuilt" if use_rebuilt else "initial"
        out += [DdpCollective("bucket", step, "all_reduce", b.dtype, b.numel, b.index, b.names,
                              b.param_indices, b.nbytes, which) for b in buckets]
        if self.plan.settings.find_unused_parameters:
            out.append(DdpCollective("used_map", step, "all_reduce", "int32", n))
        return out

    def at(self, position: int) -> DdpCollective:
        """The collective at 0-based `position` in DDP's sequence on its process group."""
        if position < len(self.constructor):
            return self.constructor[position]
        position -= len(self.constructor)
        for items in self._steps[:-1]:
            if position < len(items):
                return items[position]
            position -= len(items)
        period = self._steps[-1]
        step, k = divmod(position, len(period))
        c = period[k]
        return DdpCollective(c.phase, self._stable + step, c.op, c.dtype, c.numel, c.bucket,
                             c.names, c.param_indices, c.nbytes, c.which)

    def bucket_count(self, step: int) -> int:
        items = self._steps[min(step, self._stable)]
        return sum(c.phase == "bucket" for c in items)


def _coalesced(phase: str, step: int, named: Sequence[tuple[str, object]]
               ) -> list[DdpCollective]:
    """torch's _broadcast_coalesced: one flat broadcast per dtype chunk of 250 MiB."""
    from ddpviz.engine.broadcast import chunk_indices

    tensors = [t for _, t in named]
    if not tensors:
        return []
    out = []
    for chunk in chunk_indices(tensors, BROADCAST_BUCKET_BYTES):  # type: ignore[arg-type]
        ts = [tensors[i] for i in chunk]
        numel = sum(t.numel() for t in ts)  # type: ignore[attr-defined]
        dtype = str(ts[0].dtype).removeprefix("torch.")  # type: ignore[attr-defined]
        size = ts[0].element_size()  # type: ignore[attr-defined]
        out.append(DdpCollective(phase, step, "broadcast", dtype, numel,
                                 names=tuple(named[i][0] for i in chunk), nbytes=numel * size))
    return out


@dataclass(frozen=True)
class Labelled:
    """A rank's entry and what it is in DDP's terms (None: not one of DDP's collectives)."""

    entry: FrEntry
    ddp: DdpCollective | None
    expected: DdpCollective | None  # for an unplanned entry: what DDP would launch there


def match_rank(schedule: DdpSchedule, entries: Sequence[FrEntry]) -> list[Labelled]:
    """Walk one rank's collectives (sorted by sequence id) along DDP's schedule. The oldest
    retained entry with sequence id s is taken as DDP's collective s (no foreign collective
    before the ring buffer's window); an entry that differs from DDP's next collective is
    labelled unplanned and the walk waits for DDP's collective to come. An entry whose stack
    says the job's code launched it (`FrEntry.origin` "job") is never taken for DDP's, even
    when its op and size are those of DDP's next collective."""
    out: list[Labelled] = []
    if not entries:
        return out
    pos = max(entries[0].seq - 1, 0)
    for e in entries:
        want = schedule.at(pos)
        if e.origin != "job" and want.matches(e):
            out.append(Labelled(e, want, None))
            pos += 1
        else:
            out.append(Labelled(e, None, want))
    return out
