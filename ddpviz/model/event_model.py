"""EventModel: an event stream folded into per-rank state, thread-safe and free of any UI.

Every widget reads this model, never the engine: the constructor's facts (parameters,
verification, broadcast chunks, bucket maps) per rank, and per (rank, step) the forward and
backward instants, gradient-ready hooks (or, on steps a detail level aggregated, one
summary per bucket: `StepRecord.summaries`), bucket readiness and all-reduce spans. Times are kept
on the aligned clock (`t_ns` + the rank's offset, see Trace.aligned_ns) so ranks compare, and
every query takes an optional `as_of` time so a replay can show the state at any instant.
Feeding is the hot path. A live run feeds event objects (`feed`, one dispatch per event); a
trace feeds its columns (`feed_table`, ddpviz/traces/columns.py): a rank's hooks, bucket and
all-reduce events are folded a step at a time with numpy, and a step's gradient hooks stay
columns (`GradArray`), read like the list of (t, param, bucket) tuples a live feed builds.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast, overload

import numpy as np

from ddpviz import events as ev
from ddpviz.events import Event
from ddpviz.model.phases import STATUS_OF
from ddpviz.traces import columns as col
from ddpviz.traces.columns import Table

CONSTRUCTION = -1  # the step of every event the constructor emits


class GradArray:
    """A step's gradient hooks on one rank as columns: a read-only sequence of
    (aligned t, param, bucket) tuples, like the list a live feed builds (equal to it, too).
    `t`, `params` and `buckets` are the numpy columns, for vectorised readers."""

    __slots__ = ("_tail", "buckets", "params", "t")

    def __init__(self, t: np.ndarray, params: np.ndarray, buckets: np.ndarray) -> None:
        self.t, self.params, self.buckets = t, params, buckets
        self._tail: list[tuple[int, int, int]] = []  # hooks fed later as objects

    def __len__(self) -> int:
        return len(self.t) + len(self._tail)

    @overload
    def __getitem__(self, i: int) -> tuple[int, int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> GradArray: ...

    def __getitem__(self, i: int | slice) -> tuple[int, int, int] | GradArray:
        if isinstance(i, slice):
            if self._tail:
                return GradArray.of(list(self)[i])
            return GradArray(self.t[i], self.params[i], self.buckets[i])
        n = len(self.t)
        if i < 0:
            i += len(self)
        if 0 <= i < n:
            return int(self.t[i]), int(self.params[i]), int(self.buckets[i])
        return self._tail[i - n]

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        yield from zip(self.t.tolist(), self.params.tolist(), self.buckets.tolist(),
                       strict=True)
        yield from self._tail

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GradArray | list):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GradArray({list(self)!r})"

    def append(self, grad: tuple[int, int, int]) -> None:
        self._tail.append(grad)

    def param_column(self) -> np.ndarray:
        """Every hook's parameter in order (the column, and the hooks fed later as objects)."""
        if not self._tail:
            return self.params
        return np.concatenate([self.params, np.array([p for _, p, _ in self._tail],
                                                     dtype=np.int64)])

    def bucket_column(self) -> np.ndarray:
        """Every hook's bucket in order, like `param_column`."""
        if not self._tail:
            return self.buckets
        return np.concatenate([self.buckets, np.array([b for _, _, b in self._tail],
                                                      dtype=np.int64)])

    def copy(self) -> GradArray:
        out = GradArray(self.t, self.params, self.buckets)  # the columns are never written
        out._tail = list(self._tail)
        return out

    @classmethod
    def of(cls, grads: Iterable[tuple[int, int, int]]) -> GradArray:
        rows = list(grads)
        if not rows:
            return cls(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
        t, p, b = zip(*rows, strict=True)
        return cls(np.array(t, dtype=np.int64), np.array(p, dtype=np.int64),
                   np.array(b, dtype=np.int64))


Grads = list[tuple[int, int, int]] | GradArray


class BucketSummary(NamedTuple):
    """One bucket's gradients in one aggregated step (a GradsSummarized; aligned ns)."""

    first: int  # first gradient of the bucket ready
    last: int  # last one ready
    n_grads: int
    nbytes: int
    t: int  # when the summary was emitted (just before the bucket's BucketReady)


@dataclass(slots=True)
class StepRecord:
    """One rank's events of one iteration; every time is aligned ns."""

    first: int  # earliest event of this step on this rank
    last: int  # latest event
    forward: int | None = None
    backward: int | None = None
    backward_end: int | None = None
    grads: Grads = field(default_factory=list)  # (t, param, bucket); columns from a trace
    bucket_ready: dict[int, int] = field(default_factory=dict)
    launched: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # (t, nbytes, dtype)
    done: dict[int, int] = field(default_factory=dict)
    unused: tuple[int, ...] = ()
    unused_names: tuple[str, ...] = ()
    rebuilt_order: tuple[int, ...] | None = None
    buffers: tuple[int, int, int] | None = None  # (t, n_buffers, nbytes)
    # GradsSummarized per bucket (steps recorded at detail "buckets"/"sampled", where no
    # GradReady was emitted): bucket -> BucketSummary (aligned first and last ready time)
    summaries: dict[int, BucketSummary] = field(default_factory=dict)
    first_forward: int | None = None  # the step's first ForwardStarted (`forward`: its last)
    # What the training thread did between the step's hooks (the advisor's launch and finalize
    # costs, see [Note: hook gaps]): indexes into `grads` of the hooks that did not come right
    # after another hook of this step; (hook index, ns since the AllReduceLaunched right before
    # that hook); ns from an AllReduceDone to the BackwardFinished right after it.
    hook_breaks: list[int] = field(default_factory=list)
    launch_gaps: list[tuple[int, int]] = field(default_factory=list)
    finalize_gaps: list[int] = field(default_factory=list)

    @property
    def summarized(self) -> bool:
        """True when this step's gradients were recorded per bucket only (no per-parameter
        hooks: the detail level aggregated it)."""
        return bool(self.summaries) and not self.grads

    def copy(self, as_of: int | None = None) -> StepRecord:
        """A copy holding only what happened at or before `as_of` (everything if None)."""
        if as_of is None or self.last <= as_of:
            return StepRecord(self.first, self.last, self.forward, self.backward,
                              self.backward_end, self.grads.copy(), dict(self.bucket_ready),
                              dict(self.launched), dict(self.done), self.unused,
                              self.unused_names, self.rebuilt_order, self.buffers,
                              dict(self.summaries), self.first_forward, list(self.hook_breaks),
                              list(self.launch_gaps), list(self.finalize_gaps))

        def upto(t: int | None) -> int | None:
            return t if t is not None and t <= as_of else None

        # grads arrive in time order on one rank: cut with a binary search
        n = bisect.bisect_right(self.grads, as_of, key=lambda g: g[0])
        return StepRecord(
            self.first, min(self.last, as_of), upto(self.forward), upto(self.backward),
            upto(self.backward_end), self.grads[:n],
            {b: t for b, t in self.bucket_ready.items() if t <= as_of},
            {b: v for b, v in self.launched.items() if v[0] <= as_of},
            {b: t for b, t in self.done.items() if t <= as_of},
            self.unused if self.unused and self.last <= as_of else (),
            self.unused_names if self.unused and self.last <= as_of else (),
            self.rebuilt_order, self.buffers if self.buffers and self.buffers[0] <= as_of
            else None, {b: v for b, v in self.summaries.items() if v.t <= as_of},
            upto(self.first_forward), [i for i in self.hook_breaks if i < n],
            [g for g in self.launch_gaps if g[0] < n],
            list(self.finalize_gaps) if upto(self.backward_end) is not None else [])


class Timed(NamedTuple):
    """A constructor event with its aligned time."""

    t: int
    event: Event


@dataclass(slots=True)
class RankState:
    """Everything one rank reported."""

    rank: int
    count: int = 0
    dropped: int = 0  # events its sender reported dropped
    last_type: type[Event] | None = None
    last_t: int = 0
    step: int = CONSTRUCTION  # highest step seen
    params: Timed | None = None  # ParamsBuilt
    verify_started: Timed | None = None
    verify_result: Timed | None = None  # VerificationPassed | VerificationFailed
    broadcast_started: Timed | None = None
    chunks_sent: dict[int, Timed] = field(default_factory=dict)
    chunks_done: dict[int, Timed] = field(default_factory=dict)
    broadcast_finished: Timed | None = None
    maps: list[Timed] = field(default_factory=list)  # BucketAssigned, in order
    steps: dict[int, StepRecord] = field(default_factory=dict)
    prev_type: type[Event] | None = None  # the latest event's type and step (at `last_t`)
    prev_step: int = CONSTRUCTION


class Status(NamedTuple):
    """What the dashboard's header shows."""

    ranks: tuple[int, ...]
    world_size: int | None
    phases: dict[int, str]  # rank -> phase of its latest event
    steps: dict[int, int]  # rank -> highest iteration seen
    events: int
    events_per_s: float  # arrival rate over the last second (live), else over the steps
    dropped: int  # reported by EventsDropped markers
    t_first: int | None
    t_last: int | None


# The debugger's traffic (ddpviz/debugger): not DDP's life. Counted, never folded into a step:
# a rank parked for a minute and inspected would otherwise stretch its paused step's window
# (and the hook timeline drawn over it) to the last answer it sent.
DEBUGGER_EVENTS: frozenset[type[Event]] = frozenset({
    ev.DebugArmed, ev.Parked, ev.Unparked, ev.Inspected, ev.Fetched, ev.CodeRan,
    ev.StacksTaken, ev.DebugRefused})


def aligned_offset(clock: Mapping[int, tuple[int, int]], rank: int) -> int:
    return clock.get(rank, (0, 0))[0]


class EventModel:
    """Per-rank state of a run, fed from any thread; queried from any thread.

    Args:
        clock: {rank: (offset_ns, error_ns)} as in `Trace.clock`; offsets are added to t_ns.
    """

    def __init__(self, clock: Mapping[int, tuple[int, int]] | None = None) -> None:
        self._lock = threading.RLock()
        self._offsets = {r: o for r, (o, _) in (clock or {}).items()}
        self._ranks: dict[int, RankState] = {}
        self._world_size: int | None = None
        # step -> [first, last] aligned t over all ranks, and a version per step
        self._step_bounds: dict[int, list[int]] = {}
        self._step_versions: dict[int, int] = {}
        self.version = 0  # bumped by every feed
        self.versions = {"construction": 0, "maps": 0}
        self._findings: list[Timed] = []  # FindingReported events
        self._full_steps: set[int] = set()  # steps with per-parameter hooks on some rank
        self._arrivals: deque[tuple[float, int]] = deque()  # (monotonic s, events) per feed
        self._total = 0

    # --- feeding ------------------------------------------------------------------------------

    def aligned_ns(self, rank: int, t_ns: int) -> int:
        """Rank `rank`'s clock reading `t_ns` on the aligned clock the model's times use."""
        with self._lock:
            return t_ns + self._offsets.get(rank, 0)

    def set_clock(self, clock: Mapping[int, tuple[int, int]]) -> None:
        """Offsets for ranks not yet seen (events already fed keep their times)."""
        with self._lock:
            for r, (o, _) in clock.items():
                if r not in self._ranks:
                    self._offsets[r] = o

    def feed(self, events: Iterable[Event]) -> int:
        """Fold events in (any ranks, each rank's in emission order). Returns how many."""
        n = 0
        with self._lock:
            cache_key: tuple[int, int] | None = None
            rec: StepRecord | None = None
            state: RankState | None = None
            offset = 0
            for e in events:
                n += 1
                cls = type(e)
                if state is None or state.rank != e.rank:
                    state = self._rank(e.rank)
                    offset = self._offsets.get(e.rank, 0)
                t = e.t_ns + offset
                state.count += 1
                if cls in DEBUGGER_EVENTS:
                    continue
                if cls in STATUS_OF:
                    state.last_type = cls
                step = e.step
                if step >= 0:
                    if step > state.step:
                        state.step = step
                    key = (e.rank, step)
                    if key != cache_key or rec is None:
                        rec = state.steps.get(step)
                        if rec is None:
                            rec = state.steps[step] = StepRecord(t, t)
                        cache_key = key
                    if t > rec.last:
                        rec.last = t
                    self._step_event(state, rec, cls, e, t)
                else:
                    self._construction_event(state, cls, e, t)
                state.last_t, state.prev_type, state.prev_step = t, cls, step
                bounds = self._step_bounds.get(step)
                if bounds is None:
                    self._step_bounds[step] = [t, t]
                    self._step_versions[step] = 1
                else:
                    if t < bounds[0]:
                        bounds[0] = t
                    elif t > bounds[1]:
                        bounds[1] = t
                    self._step_versions[step] += 1
            if n:
                self._arrived(n)
        return n

    def feed_table(self, table: Table) -> int:
        """Fold in one rank's columns (a trace's: `Trace.columns()`), as `feed` would fold
        `table.events()`, without an object per hot event. Returns how many events."""
        n = len(table)
        if not n:
            return 0
        debugger = table.rows(*DEBUGGER_EVENTS)
        if len(debugger):  # counted below, not folded (as in `feed`)
            table = _without_rows(table, debugger)
        with self._lock:
            state = self._rank(table.rank)
            if not len(table):
                state.count += n
                self._arrived(n)
                return n
            t = table.t + self._offsets.get(table.rank, 0)
            kind, step = table.kind, table.step
            # what came right before hooks and BackwardFinished (see [Note: hook gaps])
            marks = _hook_marks(table, t, _Before(
                col.CODE.get(state.prev_type, -1) if state.prev_type else -1, state.prev_step,
                state.last_t))
            state.count += n
            phased = np.flatnonzero(_PHASED[kind])
            if len(phased):
                state.last_type = col.KINDS[int(kind[phased[-1]])]
            state.last_t = int(t[-1])
            hot = _HOT[kind]
            self.versions["construction"] += int(np.count_nonzero(hot & (step < 0)))
            top = int(step.max())
            if top > state.step:
                state.step = top
            self._fold_runs(state, table, t, marks)
            state.prev_type, state.prev_step = col.KINDS[int(kind[-1])], int(step[-1])
            # rare events in arrival order, through the object handlers
            for row in sorted(table.objects):
                e = table.objects[row]
                cls = type(e)
                tr = int(t[row])
                if e.step >= 0:
                    rec = state.steps[e.step]
                    self._step_event(state, rec, cls, e, tr)
                else:
                    self._construction_event(state, cls, e, tr)
            self._arrived(n)
        return n

    def _arrived(self, n: int) -> None:
        """`n` events were folded in (under the lock): a new version, and the last second's
        arrivals for the rate."""
        self.version += 1
        self._total += n
        now = time.monotonic()
        self._arrivals.append((now, n))
        while self._arrivals and self._arrivals[0][0] < now - 1.0:
            self._arrivals.popleft()

    # [Note: runs of a step]
    # A rank's rows come step after step, so a step is a run of rows (a table whose steps
    # interleave is first sorted by step, stably: a step's rows keep their arrival order). Per
    # step, the numpy calls of a fold cost more than its rows at 1,000 parameters (~45 calls of
    # ~1 us for ~1,000 rows), so the rank is folded whole: its hooks are gathered once and each
    # step's GradArray is a slice of them; the few other hot rows (instants, bucket readiness,
    # all-reduces: ~3 per bucket) are gathered per kind into lists, and a run takes its slice
    # of each (dict.update over zip: no Python loop per row). What a step gets is
    # what `feed` builds from the same events in arrival order (tests/widgets/
    # test_columnar_model.py holds them equal, with steps in order and interleaved).
    def _fold_runs(self, state: RankState, table: Table, t: np.ndarray,
                   marks: _HookMarks) -> None:
        """The hot events of one rank (`t`: aligned), a run of rows of one step at a time:
        each step's bounds and version, and its StepRecord. See [Note: runs of a step]."""
        kind, step, a, b, strs = table.kind, table.step, table.a, table.b, table.s
        rows_of: np.ndarray | None = None  # the table's row of each (sorted) row
        if not bool(np.all(step[1:] >= step[:-1])):
            rows_of = np.argsort(step, kind="stable")  # a step's rows keep arrival order
            kind, step, t, a, b, strs = (x[rows_of] for x in (kind, step, t, a, b, strs))
        n = len(kind)
        starts = np.concatenate([[0], np.flatnonzero(step[1:] != step[:-1]) + 1])
        cut = [*starts.tolist(), n]
        hooks = kind == col.GRAD_READY
        g = np.flatnonzero(hooks)
        g_cut = np.searchsorted(g, cut).tolist()
        tg, ag, bg = t[g], a[g], b[g]
        g_rows = g if rows_of is None else rows_of[g]  # the hooks' table rows (marks name them)
        # the other hot rows by kind: their columns as lists, and where each run's begin
        other = np.flatnonzero(~hooks)
        ko = kind[other]
        rows = {code: other[ko == code] for code in _FOLDED}
        at = {code: np.searchsorted(r, cut).tolist() for code, r in rows.items()}
        ts = {code: t[r].tolist() for code, r in rows.items()}
        ready_b, done_b = a[rows[_BUCKET_READY]].tolist(), a[rows[_DONE]].tolist()
        launched_b = a[rows[_LAUNCHED]].tolist()
        strings = table.strings
        launches = list(zip(ts[_LAUNCHED], b[rows[_LAUNCHED]].tolist(),
                            [strings[i] for i in strs[rows[_LAUNCHED]].tolist()], strict=True))
        lows = np.minimum.reduceat(t, starts).tolist()
        highs = np.maximum.reduceat(t, starts).tolist()
        firsts = t[starts].tolist()
        for i, s in enumerate(step[starts].tolist()):
            lo, hi, size = lows[i], highs[i], cut[i + 1] - cut[i]
            bounds = self._step_bounds.get(s)
            if bounds is None:
                self._step_bounds[s] = [lo, hi]
                self._step_versions[s] = size
            else:
                bounds[0], bounds[1] = min(bounds[0], lo), max(bounds[1], hi)
                self._step_versions[s] += size
            if s < 0:
                continue
            rec = state.steps.get(s)
            if rec is None:
                rec = state.steps[s] = StepRecord(firsts[i], hi)
            elif hi > rec.last:
                rec.last = hi
            for code, attr in _INSTANTS:
                j, k = at[code][i], at[code][i + 1]
                if k > j:
                    setattr(rec, attr, ts[code][k - 1])
                    if code == col.FORWARD and rec.first_forward is None:
                        rec.first_forward = ts[code][j]
            if s in marks.finalized:
                rec.finalize_gaps.extend(marks.finalized[s])
            gl, gh = g_cut[i], g_cut[i + 1]
            if gh > gl:
                self._full_steps.add(s)
                base = len(rec.grads)  # hook rows -> indexes into rec.grads
                r = g_rows[gl:gh]
                if s in marks.breaks:
                    rec.hook_breaks.extend((np.searchsorted(r, marks.breaks[s]) + base).tolist())
                if s in marks.launched:
                    rows_l, gaps = zip(*marks.launched[s], strict=True)
                    found = np.searchsorted(r, rows_l) + base
                    rec.launch_gaps.extend(zip(found.tolist(), gaps, strict=True))
                grads = GradArray(tg[gl:gh], ag[gl:gh], bg[gl:gh])
                rec.grads = GradArray.of([*rec.grads, *grads]) if rec.grads else grads
            j, k = at[_BUCKET_READY][i], at[_BUCKET_READY][i + 1]
            if k > j:
                rec.bucket_ready.update(zip(ready_b[j:k], ts[_BUCKET_READY][j:k], strict=True))
            j, k = at[_DONE][i], at[_DONE][i + 1]
            if k > j:
                rec.done.update(zip(done_b[j:k], ts[_DONE][j:k], strict=True))
            j, k = at[_LAUNCHED][i], at[_LAUNCHED][i + 1]
            if k > j:
                rec.launched.update(zip(launched_b[j:k], launches[j:k], strict=True))

    def _rank(self, rank: int) -> RankState:
        state = self._ranks.get(rank)
        if state is None:
            state = self._ranks[rank] = RankState(rank)
        return state

    def _step_event(self, state: RankState, rec: StepRecord, cls: type[Event], e: Event,
                    t: int) -> None:
        handler = _STEP_HANDLERS.get(cls)
        if handler is None:
            self._construction_event(state, cls, e, t)
        else:
            handler(self, state, rec, e, t)

    # One handler per event type of an iteration (step >= 0), typed with its event class;
    # _STEP_HANDLERS maps the types to them. Others go on to _construction_event.
    def _grad_ready(self, state: RankState, rec: StepRecord, e: ev.GradReady, t: int) -> None:
        if not rec.grads:
            self._full_steps.add(e.step)
        if state.prev_type is not ev.GradReady or state.prev_step != e.step:
            rec.hook_breaks.append(len(rec.grads))  # See [Note: hook gaps]
            if state.prev_type is ev.AllReduceLaunched and state.prev_step == e.step:
                rec.launch_gaps.append((len(rec.grads), t - state.last_t))
        rec.grads.append((t, e.param, e.bucket))

    def _grads_summarized(self, state: RankState, rec: StepRecord, e: ev.GradsSummarized,
                          t: int) -> None:
        shift = t - e.t_ns  # the rank's clock offset
        rec.summaries[e.bucket] = BucketSummary(e.first_t_ns + shift, e.last_t_ns + shift,
                                                e.n_grads, e.nbytes, t)

    def _allreduce_launched(self, state: RankState, rec: StepRecord, e: ev.AllReduceLaunched,
                            t: int) -> None:
        rec.launched[e.bucket] = (t, e.nbytes, e.dtype)

    def _allreduce_done(self, state: RankState, rec: StepRecord, e: ev.AllReduceDone,
                        t: int) -> None:
        rec.done[e.bucket] = t

    def _bucket_ready(self, state: RankState, rec: StepRecord, e: ev.BucketReady,
                      t: int) -> None:
        rec.bucket_ready[e.bucket] = t

    def _backward_started(self, state: RankState, rec: StepRecord, e: ev.BackwardStarted,
                          t: int) -> None:
        rec.backward = t

    def _backward_finished(self, state: RankState, rec: StepRecord, e: ev.BackwardFinished,
                           t: int) -> None:
        rec.backward_end = t
        if state.prev_type is ev.AllReduceDone:
            rec.finalize_gaps.append(t - state.last_t)

    def _forward_started(self, state: RankState, rec: StepRecord, e: ev.ForwardStarted,
                         t: int) -> None:
        rec.forward = t
        if rec.first_forward is None:
            rec.first_forward = t

    def _unused_found(self, state: RankState, rec: StepRecord, e: ev.UnusedParametersFound,
                      t: int) -> None:
        rec.unused = tuple(e.params)
        rec.unused_names = tuple(e.names)

    def _buffers_synced(self, state: RankState, rec: StepRecord, e: ev.BuffersSynced,
                        t: int) -> None:
        rec.buffers = (t, e.n_buffers, e.nbytes)

    def _buckets_rebuilt(self, state: RankState, rec: StepRecord, e: ev.BucketsRebuilt,
                         t: int) -> None:
        rec.rebuilt_order = tuple(e.grad_ready_order)

    def _step_map(self, state: RankState, rec: StepRecord, e: ev.BucketAssigned,
                  t: int) -> None:
        state.maps.append(Timed(t, e))
        self.versions["maps"] += 1

    def _step_dropped(self, state: RankState, rec: StepRecord, e: ev.EventsDropped,
                      t: int) -> None:
        state.dropped += e.count

    def _construction_event(self, state: RankState, cls: type[Event], e: Event, t: int) -> None:
        timed = Timed(t, e)
        self.versions["construction"] += 1
        handler = _CONSTRUCTION_HANDLERS.get(cls)
        if handler is not None:
            handler(self, state, timed, e)

    # One handler per event type of construction (and findings, at any step), typed likewise.
    def _chunk_sent(self, state: RankState, timed: Timed, e: ev.BroadcastChunkSent) -> None:
        state.chunks_sent[e.chunk] = timed

    def _chunk_done(self, state: RankState, timed: Timed, e: ev.BroadcastChunkDone) -> None:
        state.chunks_done[e.chunk] = timed

    def _params_built(self, state: RankState, timed: Timed, e: ev.ParamsBuilt) -> None:
        state.params = timed

    def _verification_started(self, state: RankState, timed: Timed,
                              e: ev.VerificationStarted) -> None:
        state.verify_started = timed
        self._world_size = e.world_size

    def _verification_result(self, state: RankState, timed: Timed,
                             e: ev.VerificationPassed | ev.VerificationFailed) -> None:
        state.verify_result = timed
        self._world_size = e.world_size

    def _broadcast_started(self, state: RankState, timed: Timed, e: ev.BroadcastStarted) -> None:
        state.broadcast_started = timed

    def _broadcast_finished(self, state: RankState, timed: Timed,
                            e: ev.BroadcastFinished) -> None:
        state.broadcast_finished = timed

    def _construction_map(self, state: RankState, timed: Timed, e: ev.BucketAssigned) -> None:
        state.maps.append(timed)
        self.versions["maps"] += 1

    def _construction_dropped(self, state: RankState, timed: Timed,
                              e: ev.EventsDropped) -> None:
        state.dropped += e.count

    def _finding_reported(self, state: RankState, timed: Timed, e: ev.FindingReported) -> None:
        self._findings.append(timed)  # diagnosis results, at any step

    # --- queries ------------------------------------------------------------------------------

    @property
    def ranks(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._ranks))

    @property
    def world_size(self) -> int | None:
        """From the verification events; else the highest rank seen + 1 (None: no events)."""
        with self._lock:
            if self._world_size is not None:
                return self._world_size
            return max(self._ranks) + 1 if self._ranks else None

    def __len__(self) -> int:
        with self._lock:
            return self._total

    def rank_states(self) -> dict[int, RankState]:
        """The per-rank states (live objects: read them under `lock()` or copy what you need;
        the constructor fields only ever get replaced, never mutated)."""
        with self._lock:
            return dict(self._ranks)

    def lock(self) -> threading.RLock:
        return self._lock

    def construction(self, as_of: int | None = None) -> dict[int, RankState]:
        """Per rank, the constructor's facts known at `as_of` (step records left out)."""
        def seen(x: Timed | None) -> Timed | None:
            return x if x is not None and (as_of is None or x.t <= as_of) else None

        def upto(d: dict[int, Timed]) -> dict[int, Timed]:
            return {k: v for k, v in d.items() if as_of is None or v.t <= as_of}

        with self._lock:
            return {r: RankState(
                r, s.count, s.dropped, s.last_type, s.last_t, s.step, seen(s.params),
                seen(s.verify_started), seen(s.verify_result), seen(s.broadcast_started),
                upto(s.chunks_sent), upto(s.chunks_done), seen(s.broadcast_finished),
                [m for m in s.maps if as_of is None or m.t <= as_of], {})
                for r, s in sorted(self._ranks.items())}

    def maps(self, as_of: int | None = None) -> dict[int, list[Timed]]:
        """Per rank, the BucketAssigned events (with aligned times) up to `as_of`."""
        with self._lock:
            return {r: [m for m in s.maps if as_of is None or m.t <= as_of]
                    for r, s in sorted(self._ranks.items())}

    @property
    def steps(self) -> list[int]:
        """Iterations with at least one event (not the constructor's -1)."""
        with self._lock:
            return sorted(s for s in self._step_bounds if s >= 0)

    def step_bounds(self, step: int) -> tuple[int, int] | None:
        with self._lock:
            b = self._step_bounds.get(step)
            return (b[0], b[1]) if b else None

    def settled(self, step: int, as_of: int | None) -> int | None:
        """`as_of`, or None when it lies after every event of `step` received so far (the
        state of that step is then the same as with no cut: lets views skip recomputing)."""
        if as_of is None:
            return None
        with self._lock:
            b = self._step_bounds.get(step)
            return None if b is None or as_of >= b[1] else as_of

    def step_version(self, step: int) -> int:
        with self._lock:
            return self._step_versions.get(step, 0)

    def step_at(self, t: int) -> int | None:
        """The iteration going on at aligned time `t`: the latest one started by then
        (CONSTRUCTION before the first; None before any event)."""
        with self._lock:
            starts = sorted((b[0], s) for s, b in self._step_bounds.items())
        i = bisect.bisect_right(starts, (t, float("inf"))) - 1
        if i < 0:
            return None
        return max(s for _, s in starts[: i + 1])

    def step_records(self, step: int, as_of: int | None = None) -> dict[int, StepRecord]:
        """Per rank, copies of its record of `step` (cut at `as_of`)."""
        with self._lock:
            return {r: s.steps[step].copy(as_of) for r, s in sorted(self._ranks.items())
                    if step in s.steps and (as_of is None or s.steps[step].first <= as_of)}

    def step_history(self, ranks: Iterable[int] | None = None) -> dict[int, dict[int, StepRecord]]:
        """step -> rank -> record, uncopied (for aggregates over many iterations; read only)."""
        with self._lock:
            chosen = set(self._ranks if ranks is None else ranks)
            out: dict[int, dict[int, StepRecord]] = {}
            for r in sorted(chosen & set(self._ranks)):
                for step, rec in self._ranks[r].steps.items():
                    out.setdefault(step, {})[r] = rec
            return out

    def full_steps(self) -> list[int]:
        """Iterations with per-parameter gradient hooks (GradReady) on at least one rank; at
        detail "sampled" the others have per-bucket summaries only (StepRecord.summaries)."""
        with self._lock:
            return sorted(self._full_steps)

    def findings(self, as_of: int | None = None) -> list[object]:
        """The findings reported by ranks (`ddpviz.findings.Finding`), up to `as_of`."""
        with self._lock:
            return [cast(ev.FindingReported, x.event).finding for x in self._findings
                    if as_of is None or x.t <= as_of]

    def time_range(self) -> tuple[int, int] | None:
        with self._lock:
            if not self._step_bounds:
                return None
            return (min(b[0] for b in self._step_bounds.values()),
                    max(b[1] for b in self._step_bounds.values()))

    def status(self, as_of: int | None = None) -> Status:
        """Ranks, phases, iteration, counts and rates for the status header."""
        with self._lock:
            ranks = tuple(sorted(self._ranks))
            phases = {r: STATUS_OF.get(s.last_type, "started") if s.last_type else "waiting"
                      for r, s in sorted(self._ranks.items())}
            steps = {r: s.step for r, s in sorted(self._ranks.items())}
            dropped = sum(s.dropped for s in self._ranks.values())
            span = self.time_range()
            now = time.monotonic()
            recent = sum(n for t, n in self._arrivals if t >= now - 1.0)
            total = self._total
            # the rate of a finished run is over its steps: the time before (the model
            # comparison, construction, the script's setup) has few events and may be long
            starts = [b[0] for s, b in self._step_bounds.items() if s >= 0]
            in_steps = sum(n for s, n in self._step_versions.items() if s >= 0)
        rate = float(recent)
        if (as_of is not None or not recent) and span and span[1] > span[0]:
            rate = total / ((span[1] - span[0]) / 1e9)
            if starts and span[1] > min(starts):
                rate = in_steps / ((span[1] - min(starts)) / 1e9)
        if as_of is not None:
            with self._lock:
                phases, steps = self._phases_at(as_of)
        return Status(ranks, self.world_size, phases, steps, total, rate, dropped,
                      span[0] if span else None, span[1] if span else None)

    def _phases_at(self, as_of: int) -> tuple[dict[int, str], dict[int, int]]:
        phases: dict[int, str] = {}
        steps: dict[int, int] = {}
        for r, s in sorted(self._ranks.items()):
            started = [st for st, rec in s.steps.items() if rec.first <= as_of]
            step = max(started) if started else CONSTRUCTION
            steps[r] = step
            if step >= 0:
                rec = s.steps[step]
                if rec.backward_end is not None and rec.backward_end <= as_of:
                    phases[r] = STATUS_OF[ev.BackwardFinished]
                elif rec.backward is not None and rec.backward <= as_of:
                    phases[r] = STATUS_OF[ev.BackwardStarted]
                else:
                    phases[r] = STATUS_OF[ev.ForwardStarted]
                continue
            seen = [(x.t, type(x.event)) for x in (s.params, s.verify_started, s.verify_result,
                                                   s.broadcast_started, s.broadcast_finished,
                                                   *s.maps) if x is not None and x.t <= as_of]
            seen += [(x.t, type(x.event)) for x in s.chunks_sent.values() if x.t <= as_of]
            phases[r] = STATUS_OF.get(max(seen, key=lambda p: p[0])[1], "started") if seen \
                else "waiting"
        return phases, steps


# Handlers take (model, rank state, step record or timed event, event, [t]); each is typed with
# its event class, which the table's key guarantees.
_STEP_HANDLERS: dict[type[Event], Any] = {
    ev.GradReady: EventModel._grad_ready,
    ev.GradsSummarized: EventModel._grads_summarized,
    ev.AllReduceLaunched: EventModel._allreduce_launched,
    ev.AllReduceDone: EventModel._allreduce_done,
    ev.BucketReady: EventModel._bucket_ready,
    ev.BackwardStarted: EventModel._backward_started,
    ev.BackwardFinished: EventModel._backward_finished,
    ev.ForwardStarted: EventModel._forward_started,
    ev.UnusedParametersFound: EventModel._unused_found,
    ev.BuffersSynced: EventModel._buffers_synced,
    ev.BucketsRebuilt: EventModel._buckets_rebuilt,
    ev.BucketAssigned: EventModel._step_map,
    ev.EventsDropped: EventModel._step_dropped,
}
_CONSTRUCTION_HANDLERS: dict[type[Event], Any] = {
    ev.BroadcastChunkSent: EventModel._chunk_sent,
    ev.BroadcastChunkDone: EventModel._chunk_done,
    ev.ParamsBuilt: EventModel._params_built,
    ev.VerificationStarted: EventModel._verification_started,
    ev.VerificationPassed: EventModel._verification_result,
    ev.VerificationFailed: EventModel._verification_result,
    ev.BroadcastStarted: EventModel._broadcast_started,
    ev.BroadcastFinished: EventModel._broadcast_finished,
    ev.BucketAssigned: EventModel._construction_map,
    ev.EventsDropped: EventModel._construction_dropped,
    ev.FindingReported: EventModel._finding_reported,
}


# For feed_table: which kinds set the phase shown, which are hot, and the instants per step.
_PHASED = np.array([cls in STATUS_OF for cls in col.KINDS], dtype=bool)
_HOT = np.array([cls in col.HOT for cls in col.KINDS], dtype=bool)
_BUCKET_READY, _LAUNCHED, _DONE = col.BUCKET_READY, col.LAUNCHED, col.DONE
_INSTANTS = ((col.FORWARD, "forward"), (col.BACKWARD, "backward"),
             (col.BACKWARD_END, "backward_end"))
_FOLDED = (_BUCKET_READY, _LAUNCHED, _DONE, *(code for code, _ in _INSTANTS))


class _Before(NamedTuple):
    """The event a rank fed before a table's first row: kind code (-1: none), step, aligned t."""

    kind: int
    step: int
    t: int


class _HookMarks(NamedTuple):
    """One table's rows that follow something the advisor prices, by step (rows ascending):
    hooks not right after a hook of their step, hooks right after an AllReduceLaunched of
    their step (row, gap), and the gaps of BackwardFinished right after an AllReduceDone."""

    breaks: dict[int, list[int]]
    launched: dict[int, list[tuple[int, int]]]
    finalized: dict[int, list[int]]


def _without_rows(table: Table, rows: np.ndarray) -> Table:
    """`table` less `rows` (its rare objects renumbered)."""
    keep = np.ones(len(table), dtype=bool)
    keep[rows] = False
    renumbered = np.cumsum(keep) - 1
    # (not table._replace: a Table's len() is its rows', which namedtuple's _make checks)
    return Table(table.rank, table.kind[keep], table.step[keep], table.t[keep],
                 table.seq[keep], table.a[keep], table.b[keep], table.s[keep],
                 {int(renumbered[r]): e for r, e in table.objects.items() if keep[r]},
                 table.strings)


def _hook_marks(table: Table, t: np.ndarray, before: _Before) -> _HookMarks:
    """The table's `_HookMarks` (t: its aligned times): a few vector passes over the rows, then
    a loop over the few rows marked."""
    kind, step = table.kind, table.step
    prev_kind = np.empty(len(kind), dtype=np.int16)
    prev_kind[0], prev_kind[1:] = before.kind, kind[:-1]
    same = np.empty(len(kind), dtype=bool)  # the row before is of the same step
    same[0], same[1:] = step[0] == before.step, step[1:] == step[:-1]
    hook = kind == col.GRAD_READY
    breaks = np.flatnonzero(hook & ~(same & (prev_kind == col.GRAD_READY)))
    launched = np.flatnonzero(hook & same & (prev_kind == col.LAUNCHED))
    finalized = np.flatnonzero((kind == col.BACKWARD_END) & (prev_kind == col.DONE))

    def gaps(rows: np.ndarray) -> list[int]:
        prev_t = t[rows - 1]
        if len(rows) and rows[0] == 0:  # (row -1 read the table's last)
            prev_t[0] = before.t
        return (t[rows] - prev_t).tolist()

    out = _HookMarks({}, {}, {})
    for s, row in zip(step[breaks].tolist(), breaks.tolist(), strict=True):
        out.breaks.setdefault(s, []).append(row)
    for s, row, gap in zip(step[launched].tolist(), launched.tolist(), gaps(launched),
                           strict=True):
        out.launched.setdefault(s, []).append((row, gap))
    for s, gap in zip(step[finalized].tolist(), gaps(finalized), strict=True):
        out.finalized.setdefault(s, []).append(gap)
    return out


# [Note: hook gaps]
# The advisor prices a bucket launch and finalize's work per bucket on the training thread from
# what lies between events: the gap from an AllReduceLaunched to the GradReady right after it
# (against the gaps between two consecutive hooks), and from the last AllReduceDone to the
# BackwardFinished right after it. "Right after" is in the rank's arrival order, which the
# step records do not keep, so the fold notes it: per step the hooks not right after another
# hook of the step (`hook_breaks`; the others' gaps are the differences of `grads` times), the
# launch gaps and the finalize gaps. `feed` reads the rank's previous event from its state
# (`prev_type`, `prev_step`, `last_t`); `feed_table` compares each row with the one before
# (`_hook_marks`).
