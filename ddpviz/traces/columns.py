"""The columnar event store: one rank's events as numpy columns, a few bytes per event.

A run of 256 ranks x 10,000 parameters emits 2.6M gradient hooks per iteration; a Python
object per event costs ~150 bytes and a dispatch per event in every analysis. Here every event
of a rank is a row of fixed-width columns, in the order the rank's events arrived:

    kind (u8)  step (i64)  t (i64, the rank's t_ns)  seq (i64)  a (i64)  b (i64)  s (i32)

`a`, `b` and `s` hold the fields of the hot event types (`HOT`: every field is in the
columns, no object is kept): GradReady (a=param, b=bucket), BucketReady, AllReduceDone
(a=bucket), AllReduceLaunched (a=bucket, b=nbytes, s=dtype as an index into `strings`),
ForwardStarted, BackwardStarted, BackwardFinished (no fields). Every other event (ParamsBuilt,
BucketAssigned, VerificationFailed, FindingReported, GradsSummarized, ...) is rare: its row
carries kind/step/t/seq (a=bucket, b=n_grads for GradsSummarized) and the object itself is kept
in `objects` under its row number. The typed events stay the public vocabulary:
`RankColumns.events()` rebuilds them on demand, equal to the ones that came in.

Events are added in batches (a decoded frame, a wire message) and sealed into columns every
`SEAL` events; `table()` seals the rest and returns an immutable snapshot (`Table`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import numpy as np

from ddpviz import events as ev
from ddpviz.events import E, Event
from ddpviz.limits import LimitError

if TYPE_CHECKING:
    from ddpviz.traces.framecolumns import EventColumns

# Every event type, by code (the `kind` column). Append only: codes are not stored in files.
KINDS: tuple[type[Event], ...] = (
    ev.ParamsBuilt, ev.VerificationStarted, ev.VerificationPassed, ev.VerificationFailed,
    ev.BroadcastStarted, ev.BroadcastChunkSent, ev.BroadcastChunkDone, ev.BroadcastFinished,
    ev.BucketAssigned, ev.ForwardStarted, ev.BuffersSynced, ev.BackwardStarted, ev.GradReady,
    ev.BucketReady, ev.GradsSummarized, ev.AllReduceLaunched, ev.AllReduceDone,
    ev.BackwardFinished, ev.UnusedParametersFound, ev.BucketsRebuilt, ev.EventsDropped,
    ev.FindingReported, ev.OptimizerStepStarted, ev.OptimizerStepFinished, ev.BackwardComputed,
    ev.DebugArmed, ev.Parked, ev.Unparked, ev.Inspected, ev.Fetched, ev.CodeRan, ev.StacksTaken,
    ev.DebugRefused)
CODE: dict[type[Event], int] = {cls: i for i, cls in enumerate(KINDS)}
HOT: frozenset[type[Event]] = frozenset({
    ev.GradReady, ev.BucketReady, ev.AllReduceLaunched, ev.AllReduceDone, ev.ForwardStarted,
    ev.BackwardStarted, ev.BackwardFinished})

GRAD_READY = CODE[ev.GradReady]
BUCKET_READY = CODE[ev.BucketReady]
LAUNCHED = CODE[ev.AllReduceLaunched]
# The hot types' fields held in columns a, b and s (a string, interned), read by name.
_FIELDS: dict[type[Event], tuple[str | None, str | None, str | None]] = {
    ev.GradReady: ("param", "bucket", None),
    ev.BucketReady: ("bucket", None, None),
    ev.AllReduceDone: ("bucket", None, None),
    ev.AllReduceLaunched: ("bucket", "nbytes", "dtype"),
    ev.GradsSummarized: ("bucket", "n_grads", None),
    ev.BackwardComputed: ("param", "first_t_ns", None),
}
DONE = CODE[ev.AllReduceDone]
FORWARD = CODE[ev.ForwardStarted]
BACKWARD = CODE[ev.BackwardStarted]
BACKWARD_END = CODE[ev.BackwardFinished]
OPTIMIZER = CODE[ev.OptimizerStepStarted]  # rare (sampled steps only): no object per step saved
OPTIMIZER_END = CODE[ev.OptimizerStepFinished]
COMPUTED = CODE[ev.BackwardComputed]  # rare (one a step): a=param, b=its gradient's time

SEAL = 4096  # pending events sealed into columns at once
# a Table's dtypes: kind, step, t, seq, a, b, s
_DTYPES = tuple(map(np.dtype, (np.uint8, np.int64, np.int64, np.int64, np.int64, np.int64,
                               np.int32)))
_INT64 = (-(1 << 63), (1 << 63) - 1)


def codes(*types: type[Event]) -> np.ndarray:
    """The kind codes of `types`, for `np.isin(table.kind, codes(...))`."""
    return np.array([CODE[t] for t in types], dtype=np.uint8)


class Table(NamedTuple):
    """One rank's events as columns (rows in arrival order); read only."""

    rank: int
    kind: np.ndarray  # uint8 code into KINDS
    step: np.ndarray  # int64
    t: np.ndarray  # int64: the rank's t_ns (add the clock offset for aligned time)
    seq: np.ndarray  # int64
    a: np.ndarray  # int64: param (GradReady), bucket (BucketReady, AllReduce*, GradsSummarized)
    b: np.ndarray  # int64: bucket (GradReady), nbytes (AllReduceLaunched), n_grads (Summarized)
    s: np.ndarray  # int32: dtype of AllReduceLaunched as an index into `strings`; -1 otherwise
    objects: dict[int, Event]  # row -> event, for the rare (not HOT) types
    strings: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.kind)

    def rows(self, *types: type[Event]) -> np.ndarray:
        """Row numbers of the events of these types, in arrival order."""
        kind = self.kind
        mask = np.zeros(len(kind), dtype=bool)
        for cls in types:  # an equality per type: faster than np.isin over uint8 codes
            mask |= kind == CODE[cls]
        return np.flatnonzero(mask)

    def rare(self, cls: type[E]) -> list[E]:
        """The kept objects of this (rare) type, in arrival order."""
        return [e for i in sorted(self.objects) if type(e := self.objects[i]) is cls]

    def rare_any(self, *types: type[Event]) -> list[Event]:
        """The kept objects of these (rare) types, in arrival order."""
        return [self.objects[i] for i in sorted(self.objects) if type(self.objects[i]) in types]

    def event(self, row: int) -> Event:
        """The event of one row (rebuilt for a hot type)."""
        obj = self.objects.get(row)
        if obj is not None:
            return obj
        return _build(self, np.array([row]))[0]

    def events(self, rows: np.ndarray | None = None) -> list[Event]:
        """The typed events of `rows` (all by default), in the given order."""
        if rows is None:
            rows = np.arange(len(self.kind))
        out: list[Event | None] = [None] * len(rows)
        kinds = self.kind[rows]
        for code in np.unique(kinds).tolist():
            where = np.flatnonzero(kinds == code)
            cls = KINDS[code]
            if cls in HOT:
                built = _build(self, rows[where])
                for i, e in zip(where.tolist(), built, strict=True):
                    out[i] = e
            else:
                objects = self.objects
                for i, r in zip(where.tolist(), rows[where].tolist(), strict=True):
                    out[i] = objects[r]
        return out  # type: ignore[return-value]

    def before(self, step: int, *keep: type[Event]) -> Table:
        """This table with only the rows of steps before `step` (the constructor's, step -1,
        included) and the rows of the `keep` types at any step. Itself when none is left
        out."""
        mask = self.step < step
        for cls in keep:
            mask |= self.kind == CODE[cls]
        if bool(mask.all()):
            return self
        rows = np.flatnonzero(mask)
        new_row = {int(r): i for i, r in enumerate(rows.tolist())}
        objects = {new_row[r]: e for r, e in self.objects.items() if r in new_row}
        return Table(self.rank, self.kind[rows], self.step[rows], self.t[rows],
                     self.seq[rows], self.a[rows], self.b[rows], self.s[rows], objects,
                     self.strings)

    def sorted_by_seq(self, *, then_time: bool = False) -> Table:
        """This table with its rows sorted by seq (stable; with `then_time`, equal seqs by t,
        then arrival). Itself when already in order (the usual case)."""
        seq = self.seq
        if len(seq) < 2 or bool(np.all(seq[1:] > seq[:-1])):
            return self
        order = np.lexsort((self.t, seq)) if then_time else np.argsort(seq, kind="stable")
        new_row = np.empty(len(order), dtype=np.int64)
        new_row[order] = np.arange(len(order))
        objects = {int(new_row[r]): e for r, e in self.objects.items()}
        return Table(self.rank, self.kind[order], self.step[order], self.t[order],
                     seq[order], self.a[order], self.b[order], self.s[order],
                     dict(sorted(objects.items())), self.strings)


def _build(table: Table, rows: np.ndarray) -> list[Event]:
    """Hot events of one kind rebuilt from their columns."""
    if not len(rows):
        return []
    cls = KINDS[int(table.kind[rows[0]])]
    n = len(rows)
    rank = [table.rank] * n
    common = (rank, table.step[rows].tolist(), table.t[rows].tolist(), table.seq[rows].tolist())
    if cls is ev.GradReady:
        return list(map(cls, *common, table.a[rows].tolist(), table.b[rows].tolist()))
    if cls is ev.AllReduceLaunched:
        strings = table.strings
        dtypes = [strings[i] for i in table.s[rows].tolist()]
        return list(map(cls, *common, table.a[rows].tolist(), table.b[rows].tolist(), dtypes))
    if cls in (ev.BucketReady, ev.AllReduceDone):
        return list(map(cls, *common, table.a[rows].tolist()))
    return list(map(cls, *common))


class Shared:
    """One copy of the big payloads that every rank reports alike (the parameter list of
    ParamsBuilt, bucket maps, the ready order of a rebuild: 10,000 entries each per rank of a
    big model): a rare event whose big field equals one seen before gets that one's copy.
    Found by comparing with the few distinct values kept per field (no hashing)."""

    KEEP = 4  # distinct values remembered per (type, field)
    BIG = 64  # tuples shorter than this are not worth sharing

    def __init__(self) -> None:
        self._seen: dict[tuple[type, str], list[tuple[Any, ...]]] = {}

    def share(self, e: Event) -> Event:
        changes: dict[str, Any] = {}
        for name in e.__struct_fields__:
            value = getattr(e, name)
            if not isinstance(value, tuple) or len(value) < self.BIG:
                continue
            seen = self._seen.setdefault((type(e), name), [])
            same = next((v for v in seen if v is value or v == value), None)
            if same is None:
                if len(seen) < self.KEEP:
                    seen.append(value)
            elif same is not value:
                changes[name] = same
        return msgspec.structs.replace(e, **changes) if changes else e


class RankColumns:
    """One rank's events, growing: `add` batches, `table()` a sealed snapshot. Not thread-safe
    (Trace holds its lock around every call)."""

    __slots__ = ("_blocks", "_n_sealed", "_pending", "_shared", "_string_index", "objects",
                 "rank", "strings")

    def __init__(self, rank: int, shared: Shared | None = None) -> None:
        self.rank = rank
        self._shared = shared if shared is not None else Shared()
        self._blocks: list[tuple[np.ndarray, ...]] = []
        self._n_sealed = 0
        self._pending: list[Event] = []
        self.objects: dict[int, Event] = {}
        self.strings: list[str] = []
        self._string_index: dict[str, int] = {}

    def __len__(self) -> int:
        return self._n_sealed + len(self._pending)

    def add(self, events: Iterable[Event]) -> None:
        self._pending.extend(events)
        if len(self._pending) >= SEAL:
            self.seal()

    def seal(self) -> None:
        """Convert the pending events into a block of columns."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            block = self._convert(pending)
        except OverflowError:
            for e in pending:  # name the offending value (never happens for decoded events)
                for name in ("step", "t_ns", "seq", "param", "bucket", "nbytes"):
                    v = getattr(e, name, 0)
                    if isinstance(v, int) and not _INT64[0] <= v <= _INT64[1]:
                        raise LimitError(f"ddpviz: {type(e).__name__} of rank {e.rank} has "
                                         f"{name}={v}, beyond 64 bits.\nBuild events with "
                                         "values that fit a signed 64-bit integer.") from None
            raise
        self._blocks.append(block)
        self._n_sealed += len(pending)

    def add_columns(self, block: EventColumns, rows: np.ndarray | None,
                    rare: Mapping[int, Event]) -> None:
        """This rank's events of a block decoded straight into columns (`rows`, increasing, or
        all of them), after the events added before. `rare`: the block's rare events of these
        rows, by position in `rows` (`block.rare` itself when `rows` is None).

        [Note: a block of many ranks]
        A block may hold every rank's events (a session's recording: 1,024 ranks' start-up in
        one frame), so the work here is this rank's rows only: the caller splits the rare
        events by rank once per block (trace.py), and only the strings this rank's rows use
        are looked up. A pass over the block's rare events or strings per rank was quadratic:
        1,500 ranks' EventsDropped (86 KB) took 4-8 s, a 1,024-rank start-up 17-23 s."""
        self.seal()
        n = len(block) if rows is None else len(rows)
        if not n:
            return
        cols = [block.kind, block.step, block.t, block.seq, block.a, block.b, block.s]
        if rows is not None:
            cols = [c[rows] for c in cols]
        kind, step, t, seq, a, b, s = cols
        known = self._known(block.strings) if rows is None else None
        if known is not None:  # (every string interned before: no new one to intern)
            if known != list(range(len(known))):
                s = np.where(s >= 0, np.array([*known, -1], dtype=np.int32)[s], -1)
        elif block.strings:
            has = np.flatnonzero(s >= 0)
            used, first, inverse = np.unique(s[has], return_index=True, return_inverse=True)
            mine = np.empty(len(used), dtype=np.int32)
            names = [block.strings[i] for i in used.tolist()]
            for j in np.argsort(first).tolist():  # interned in order of first use, as
                mine[j] = self._intern(names[j])  # `_convert` does
            s = np.full(n, -1, dtype=np.int32)
            s[has] = mine[inverse]
        start = self._n_sealed
        if rare:
            a, b = a.astype(np.int64), b.astype(np.int64)  # (copies, wide enough for any field)
            share = self._shared.share
            for i, e in rare.items():
                field_a, field_b, _ = _FIELDS.get(type(e), (None, None, None))
                if field_a is not None:
                    a[i] = getattr(e, field_a)
                if field_b is not None:
                    b[i] = getattr(e, field_b)
                self.objects[start + i] = share(e)
        self._blocks.append((kind, step, t, seq, a, b, s))
        self._n_sealed += n

    def _known(self, strings: Sequence[str]) -> list[int] | None:
        """The index of each of a single rank's block's strings (as many as its rows may use:
        linear in the block), if every one is interned already; else None."""
        index = self._string_index
        known = [index.get(x, -1) for x in strings]
        return None if -1 in known else known

    def _intern(self, value: str) -> int:
        i = self._string_index.get(value)
        if i is None:
            i = self._string_index[value] = len(self.strings)
            self.strings.append(value)
        return i

    def _convert(self, events: Sequence[Event]) -> tuple[np.ndarray, ...]:
        n = len(events)
        code = CODE
        kind = np.array([code[type(e)] for e in events], dtype=np.uint8)
        step = np.array([e.step for e in events], dtype=np.int64)
        t = np.array([e.t_ns for e in events], dtype=np.int64)
        seq = np.array([e.seq for e in events], dtype=np.int64)
        a = np.zeros(n, dtype=np.int64)
        b = np.zeros(n, dtype=np.int64)
        s = np.full(n, -1, dtype=np.int32)
        start = self._n_sealed
        present = np.unique(kind).tolist()
        for k in present:
            cls = KINDS[k]
            if len(present) == 1:
                idx = np.arange(n)
                sel: Sequence[Event] = events
            else:
                idx = np.flatnonzero(kind == k)
                sel = [events[i] for i in idx.tolist()]
            field_a, field_b, field_s = _FIELDS.get(cls, (None, None, None))
            if field_a is not None:
                a[idx] = [getattr(e, field_a) for e in sel]
            if field_b is not None:
                b[idx] = [getattr(e, field_b) for e in sel]
            if field_s is not None:
                s[idx] = [self._intern(getattr(e, field_s)) for e in sel]
            if cls not in HOT:
                share = self._shared.share
                for i, e in zip(idx.tolist(), sel, strict=True):
                    self.objects[start + i] = share(e)
        return kind, step, t, seq, a, b, s

    def table(self) -> Table:
        """Every event so far as one snapshot (its arrays are never written to again)."""
        self.seal()
        blocks = self._blocks
        if len(blocks) > 1 or (blocks and any(c.dtype != d for c, d in zip(blocks[0], _DTYPES,
                                                                            strict=True))):
            # (a COLUMNS frame's block holds its columns as narrow as they lay in the file:
            # widened here, as they are joined)
            self._blocks = [tuple(np.concatenate(cols, dtype=d) for cols, d in zip(
                zip(*blocks, strict=True), _DTYPES, strict=True))]
        if self._blocks:
            kind, step, t, seq, a, b, s = self._blocks[0]
        else:
            kind = np.zeros(0, dtype=np.uint8)
            step, t, seq, a, b = (np.zeros(0, dtype=np.int64) for _ in range(5))
            s = np.zeros(0, dtype=np.int32)
        return Table(self.rank, kind, step, t, seq, a, b, s, dict(self.objects),
                     tuple(self.strings))

    def nbytes(self) -> int:
        """Bytes held by the sealed columns (the kept rare objects not counted)."""
        return sum(c.nbytes for block in self._blocks for c in block)


def tables_of(events: Iterable[Event]) -> dict[int, Table]:
    """Columns per rank from any events (each rank's in the order given)."""
    per_rank: dict[int, RankColumns] = {}
    shared = Shared()
    for rank, lst in by_rank(e for e in events if isinstance(e, Event)).items():
        cols = per_rank[rank] = RankColumns(rank, shared)
        cols.add(lst)
    return {r: c.table() for r, c in per_rank.items()}


def by_rank(events: Iterable[Event]) -> dict[int, list[Event]]:
    """The events per rank, each rank's in the order given."""
    out: dict[int, list[Event]] = {}
    for e in events:
        lst = out.get(e.rank)
        if lst is None:
            lst = out[e.rank] = []
        lst.append(e)
    return out
