"""Diagnosis: turns the events of a run (live or recorded) into findings. Pure over events:
no processes, no torch.

What it reads: VerificationFailed (model mismatches), FindingReported (what ranks diagnosed
themselves: hangs, initial values, reassigned buffers, unsynced gradients),
UnusedParametersFound per rank (diffed across ranks), GradReady per rank and step (hooks firing
twice; ready order diffed across ranks and mapped to buckets through BucketAssigned), the
collectives each rank issued per step, each rank's last event (missing, lagging and stuck
ranks), and EventsDropped.

It reads the columnar store (ddpviz/traces/columns.py): the hot events (gradient hooks, bucket and
all-reduce events, phase instants) as numpy columns, never as one object each; the rare ones
(parameters, maps, verification, findings, ...) as their objects.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from ddpviz import events as ev
from ddpviz.events import Event
from ddpviz.findings import (
    Finding,
    Findings,
    fix_for,
    format_ranges,
    format_ranks,
    group_ranks,
    merge_findings,
    odd_ranks,
    said_live,
    sort_findings,
)
from ddpviz.model_mismatch import mismatch_findings
from ddpviz.traces import columns as col
from ddpviz.traces.columns import Table
from ddpviz.traces.fileformat import End
from ddpviz.traces.source import open_run

if TYPE_CHECKING:
    from ddpviz.traces.trace import Trace

_STUCK_KINDS = ("rank_hang", "rank_exited", "missing_rank", "peer_failed", "collective_mismatch")


def diagnose(source: Any, *, ended: Mapping[int, End] | None = None,
             rings: Iterable[str | os.PathLike[str]] | None = None) -> Findings:
    """Findings from a run: a `Run` (from ddpviz.launch), a `Session`, a `Trace`, a path to a
    `.ddpviz` file or a folder of them, or any iterable of events (e.g. a list an emitter
    appended to); see ddpviz/traces/source.py.

    Args:
        source: a `Run`, `Session`, `Trace`, a `.ddpviz` path or folder, or an iterable of
            events.
        ended: the ranks whose trace file ends with its end record (`fileformat.read_end`), by
            rank: they finished, so none is named as hung. None: what the source tells (the
            files of a path or folder, a session attached with `listen(follow=)`).
        rings: the folders whose rings of each rank's last collectives to compare (`ddpviz
            record --out`'s folder: a mismatch that ended the job before the ranks compared
            live; See [Note: the ring], probes/ledger_ring.py). None: the folders of a path
            or folder source, none for other sources.

    Returns:
        The findings, errors first, each identical no matter which rank's events reported it;
        a list that prints as one message.

    Raises:
        ValueError: `source` is no kind of run, or names no trace (a SourceError: see
            traces/source.py).
        TraceError: a file that is not a readable trace.

    Example:
        >>> findings = ddpviz.diagnose("run.ddpviz")   # or a Run, a Session, a Trace
        >>> print(findings)                            # the house-style message, errors first
        >>> [f.kind for f in findings if f.severity == "error"]
    """
    run = open_run(source, refusal="diagnose() cannot read")
    if ended is None:
        ended = run.ended  # before the trace's columns are read: a rank ended has its events
    ended = ended if isinstance(ended, Mapping) else None
    trace = run.gathered  # (bare events a verb gathered already: read from that Trace)
    if trace is None:
        return diagnose_tables(_seq_ordered(col.tables_of(run.events)), ended=ended)
    if rings is None:
        rings = {f.parent for f in run.files} if run.kind == "files" else ()
    ring = rings_of(Path(folder) for folder in rings)
    return diagnose_tables(_trace_tables(trace), clock=dict(trace.clock), ended=ended,
                           ring=ring, live=run.running)



def trace_said_live(trace: Trace) -> bool:
    """Whether a rank of `trace` named a mismatch of the job's collectives live (`said_live`):
    then the rings' comparison after the job has nothing to add."""
    return said_live(e.finding for t in trace.columns().values()
                     for e in t.rare(ev.FindingReported))


def rings_of(folders: Iterable[Path]) -> list[Finding]:
    """What the ranks' rings of last collectives in `folders` show (See [Note: the ring],
    probes/ledger_ring.py): [] when there are none or they agree."""
    from ddpviz.probes.ledger_ring import folder_findings

    return [f for folder in sorted(folders) for f in folder_findings(folder)]


def _trace_tables(trace: Trace) -> dict[int, Table]:
    tables = trace.columns()
    clock = dict(trace.clock)
    # the ranks in the order their first event comes in Trace.events() (aligned time)
    first = {r: (int(t.t.min()) + clock.get(r, (0, 0))[0], r) for r, t in tables.items()
             if len(t)}
    return {r: tables[r].sorted_by_seq(then_time=True)
            for r in sorted(first, key=lambda r: first[r])}


def _seq_ordered(tables: Mapping[int, Table]) -> dict[int, Table]:
    return {r: t.sorted_by_seq() for r, t in tables.items() if len(t)}


def diagnose_events(events: Iterable[Event]) -> Findings:
    """`diagnose` over a list of events from any ranks."""
    return diagnose_tables(_seq_ordered(col.tables_of(events)))


# [Note: a run still going]
# diagnose() of a live source (a Run still running, a Session not closed: what a live view
# shows every few seconds) reads events that stop mid-step, at a different step on each rank:
# one rank's last step is 41 while another's events end in step 40. Read as a run that is
# over, that is "rank 1 stopped at step 40 while others reached step 41" (uneven_iterations),
# or a rank "still waiting in a collective when the events end" (rank_hang): measured on a
# healthy 2-rank launch() diagnosed every 50 ms, an uneven_iterations warning came in about
# one diagnosis in ten. So a run still going is judged on the steps every rank has finished
# (those before the least of the ranks' last steps), the ranks' own live findings and
# dropped-event counts kept whatever their step; how the ranks ended (uneven steps, a rank
# left inside a collective, a rank with no events) is judged once the run is over, or once
# every rank's trace has its end record (a followed folder whose job ended).

_LIVE_KEPT = (ev.FindingReported, ev.EventsDropped)  # rows a run still going keeps at any step


def diagnose_tables(per_rank: Mapping[int, Table],
                    clock: Mapping[int, tuple[int, int]] | None = None,
                    ended: Mapping[int, End] | None = None,
                    ring: Sequence[Finding] = (), live: bool = False) -> Findings:
    """`diagnose` over the columns of each rank (rows in seq order; see ddpviz/traces/columns.py);
    `clock`: the ranks' offsets onto one clock (Trace.clock), for who is slow; `ended`: the
    ranks whose file ends with its end record (see `diagnose`); `ring`: what the ranks' rings
    of last collectives show (`rings_of`), counted as reported when no rank named a mismatch
    of collectives live; `live`: the run is still going (See [Note: a run still going])."""
    live = live and bool(per_rank) and not set(per_rank) <= set(ended or {})
    if live:
        done = min(int(t.step.max()) if len(t) else -1 for t in per_rank.values())
        per_rank = {r: t.before(done, *_LIVE_KEPT) for r, t in per_rank.items()}
    world_size = _world_size(per_rank)
    names = _names(per_rank)
    reported = _reported(per_rank)
    if ring and not said_live(reported):
        reported = [*ring, *reported]
    forwards = {r: set(np.unique(t.step[t.rows(ev.ForwardStarted)]).tolist())
                for r, t in per_rank.items()}  # rank -> the steps it started a forward in
    last_step = {r: int(t.step.max()) if len(t) else -1 for r, t in per_rank.items()}
    computed = [*_verification(per_rank, world_size),
                *_unused(per_rank, names, world_size),
                *_grad_ready(per_rank, names, forwards, world_size),
                *_collectives(per_rank, forwards, last_step, world_size),
                *(() if live else _progress(per_rank, last_step, world_size, reported,
                                            ended or {})),
                *_dropped(per_rank, world_size),
                *_straggler(per_rank, clock, names, world_size, reported)]
    seen = {(f.kind, f.name) for f in reported}
    out = list(reported)
    for f in computed:
        if _earlier_mismatch(f, reported):
            out.insert(0, f)  # where the mismatch began leads
        elif (f.kind, f.name) not in seen and f not in out:
            out.append(f)
    return Findings(sort_findings(_crashes_first(out, per_rank, clock or {})))


def _earlier_mismatch(f: Finding, reported: Sequence[Finding]) -> bool:
    """A mismatch of collectives read from the steps' events, at a step before every one the
    ranks reported live (the live check compares op, dtype and size by position: collectives
    alike in those pair silently, and it names the mismatch only where they stop being
    alike): the earlier one is where it began."""
    live = [g.step for g in reported if g.kind == f.kind]
    return (f.kind == "collective_mismatch" and f.field == "collectives" and bool(live)
            and 0 <= f.step < min(live))


# [Note: a crash leads]
# A rank that died of an uncaught exception reported it itself (probes/exit_error.py: a
# rank_exited finding with field "exception"). Its peers then see a rank that stopped early:
# fewer steps, a closed connection, "left the loop". Those are the crash seen from outside,
# not uneven data: findings that name only crashed ranks as having stopped early
# (uneven_iterations) are dropped, and the crashes come first, the earliest first.


def _crashes_first(findings: list[Finding], per_rank: Mapping[int, Table],
                   clock: Mapping[int, tuple[int, int]]) -> list[Finding]:
    """See [Note: a crash leads]."""
    crashes = [f for f in findings if f.kind == "rank_exited" and f.field == "exception"]
    if not crashes:
        return findings
    when: dict[Finding, int] = {}
    for rank, t in per_rank.items():
        offset = clock.get(rank, (0, -1))[0]
        for e in t.rare(ev.FindingReported):
            if e.finding in crashes:
                when[e.finding] = min(when.get(e.finding, e.t_ns + offset), e.t_ns + offset)
    crashes.sort(key=lambda f: when.get(f, 0))
    crashed = {r for f in crashes for r in f.ranks}
    rest = [f for f in findings if f not in crashes
            and not (f.kind == "uneven_iterations" and f.ranks and set(f.ranks) <= crashed)]
    return [*crashes, *rest]


def _straggler(per_rank: Mapping[int, Table], clock: Mapping[int, tuple[int, int]] | None,
               names: Mapping[int, Mapping[int, str]], world_size: int,
               reported: Sequence[Finding]) -> list[Finding]:
    from ddpviz._diagnose.straggler import straggler_findings

    nonfinite = [f.step for f in reported if f.kind.startswith("nonfinite") and f.step >= 0]
    return straggler_findings(per_rank, clock, world_size, names,
                              nonfinite_step=min(nonfinite, default=None))


# --- context ----------------------------------------------------------------------------------


def _world_size(per_rank: Mapping[int, Table]) -> int:
    size = max(per_rank, default=-1) + 1
    for t in per_rank.values():
        for e in t.rare_any(ev.VerificationStarted, ev.VerificationPassed, ev.VerificationFailed,
                        ev.FindingReported):
            if isinstance(e, ev.FindingReported):
                size = max(size, e.finding.world_size)
            else:
                size = max(size, e.world_size)  # type: ignore[attr-defined]
    return size


def _names(per_rank: Mapping[int, Table]) -> dict[int, dict[int, str]]:
    """{rank: {param index: dotted name}} from each rank's latest ParamsBuilt."""
    out: dict[int, dict[int, str]] = {}
    made: dict[int, dict[int, str]] = {}  # by id of the params tuple (shared by alike ranks)
    for rank, t in per_rank.items():
        built = t.rare(ev.ParamsBuilt)
        if built:
            params = built[-1].params
            if id(params) not in made:
                made[id(params)] = {p.index: p.name for p in params}
            out[rank] = made[id(params)]
    return out


def _name(names: Mapping[int, Mapping[int, str]], rank: int, index: int) -> str:
    return names.get(rank, {}).get(index, f"#{index}")


# --- what the ranks reported ------------------------------------------------------------------


def _reported(per_rank: Mapping[int, Table]) -> list[Finding]:
    """FindingReported, de-duplicated: the same finding from several ranks counts once; a
    rank-local finding seen on several ranks is merged into one naming all of them
    (`merge_findings`, which `ddpviz record` says live with, too)."""
    return merge_findings((rank, e.finding) for rank in sorted(per_rank)
                          for e in per_rank[rank].rare(ev.FindingReported)
                          if e.finding.kind != "rank_waiting")  # live-only: the verdict follows


def _replace(f: Finding, **changes: Any) -> Finding:
    return msgspec.structs.replace(f, **changes)


# --- model verification -----------------------------------------------------------------------


def _verification(per_rank: Mapping[int, Table], world_size: int) -> list[Finding]:
    for rank in sorted(per_rank):
        for e in per_rank[rank].rare(ev.VerificationFailed):
            assert isinstance(e, ev.VerificationFailed)
            return mismatch_findings(e.mismatches, e.world_size)
    return []


# --- unused parameters ------------------------------------------------------------------------


def _steps_seen(t: Table) -> set[int]:
    steps = t.step
    return set(np.unique(steps[steps >= 0]).tolist())


def _unused(per_rank: Mapping[int, Table], names: Mapping[int, Mapping[int, str]],
            world_size: int) -> list[Finding]:
    unused: dict[tuple[int, int], set[str]] = {}  # (rank, step) -> names
    index_of: dict[str, int] = {}
    for rank, t in per_rank.items():
        for e in t.rare(ev.UnusedParametersFound):
            if isinstance(e, ev.UnusedParametersFound):
                unused.setdefault((rank, e.step), set()).update(e.names)
                index_of.update(zip(e.names, e.params, strict=False))
    if not unused:
        return []
    active = {r: _steps_seen(t) for r, t in per_rank.items()}
    first: dict[str, tuple[int, dict[int, str]]] = {}  # name -> (step, {rank: used|unused})
    steps_of: dict[str, set[int]] = {}
    for step in sorted({s for _, s in unused}):
        ranks = [r for r in sorted(per_rank) if step in active[r]]
        union = set().union(*(unused.get((r, step), set()) for r in ranks))
        for name in sorted(union, key=lambda n: index_of.get(n, 0)):
            steps_of.setdefault(name, set()).add(step)
            if name not in first:
                first[name] = (step, {r: "unused" if name in unused.get((r, step), set())
                                      else "used" for r in ranks})
    out = []
    for name, (step, states) in first.items():
        values = group_ranks(states)
        unused_ranks = tuple(r for r, s in states.items() if s == "unused")
        everywhere = len(unused_ranks) == len(states)
        more = len(steps_of[name]) - 1
        later = f" (and {more} later step{'s' if more > 1 else ''})" if more else ""
        index = index_of.get(name, -1)
        where = "every rank" if everywhere else format_ranks(unused_ranks)
        out.append(Finding(
            kind="unused_parameter", severity="warning",
            title=f"parameter {index} '{name}' got no gradient on {where} at step {step}{later}",
            ranks=unused_ranks, param=index, name=name, field="unused", step=step,
            values=values, fix=fix_for("unused_parameter", "all" if everywhere else ""),
            world_size=world_size))
    return out


# --- gradient-ready order ---------------------------------------------------------------------


def _bucket_maps(t: Table) -> list[tuple[int, tuple[tuple[int, ...], ...]]]:
    return [(max(e.step, -1), e.buckets) for e in t.rare(ev.BucketAssigned)
            if isinstance(e, ev.BucketAssigned)]


def _map_at(maps: Sequence[tuple[int, tuple[tuple[int, ...], ...]]], step: int
            ) -> tuple[tuple[int, ...], ...]:
    current: tuple[tuple[int, ...], ...] = ()
    for s, buckets in maps:
        if s <= step:
            current = buckets
    return current


def _flat(buckets: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """A bucket map as (its params bucket after bucket, each bucket's size)."""
    sizes = np.array([len(b) for b in buckets], dtype=np.int64)
    members = np.fromiter(itertools.chain.from_iterable(buckets), dtype=np.int64,
                          count=int(sizes.sum()))
    return members, sizes


def _launch_positions(order: np.ndarray, flat: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """For each bucket of `flat` (see _flat), after how many gradients it can start (buckets
    launch in order): the position of its last gradient (a missing one counts as the end), at
    least the previous bucket's."""
    members, sizes = flat
    if not len(sizes):
        return np.zeros(0, dtype=np.int64)
    n = len(order)
    lo = min(int(order.min()) if n else 0, int(members.min()) if len(members) else 0)
    top = max(int(order.max()) if n else 0, int(members.max()) if len(members) else 0)
    if lo < 0 or not _countable(0, top, n + len(members)):  # renumbered 0.., order kept
        ids = np.unique(np.concatenate([order, members]))
        order, members, top = np.searchsorted(ids, order), np.searchsorted(ids, members), len(ids)
    position = np.full(top + 1, n, dtype=np.int64)
    if _repeats(order):  # 1-based; a param listed twice (a hook that fired twice): its last
        params, from_end = np.unique(order[::-1], return_index=True)
        position[params] = n - from_end
    elif n:
        position[order] = np.arange(1, n + 1)
    ready = np.zeros(len(sizes), dtype=np.int64)
    filled = sizes > 0
    if filled.any():
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])[filled]
        ready[filled] = np.maximum.reduceat(position[members], starts)
    return np.maximum.accumulate(ready)


def _step_slices(steps: np.ndarray) -> tuple[np.ndarray | None, list[tuple[int, slice]]]:
    """Rows grouped by step, each step's in their order: a stable permutation of the rows
    (None when their steps already ascend, the usual case) and each step's slice of them."""
    order = None
    if len(steps) > 1 and not bool((steps[1:] >= steps[:-1]).all()):
        order = np.argsort(steps, kind="stable")
        steps = steps[order]
    bounds = [0, *(np.flatnonzero(steps[1:] != steps[:-1]) + 1).tolist(), len(steps)]
    return order, [(int(steps[i]), slice(i, j)) for i, j in itertools.pairwise(bounds)
                   if j > i]


def _grad_orders(t: Table) -> tuple[dict[int, np.ndarray], set[int]]:
    """step -> the params of one rank's GradReady events of that step, in seq order; and the
    steps in which a param occurs more than once."""
    rows = t.rows(ev.GradReady)
    order, slices = _step_slices(t.step[rows])
    params = t.a[rows if order is None else rows[order]]
    return {step: params[part] for step, part in slices}, _repeated_steps(params, slices)


def _repeated_steps(params: np.ndarray, slices: Sequence[tuple[int, slice]]) -> set[int]:
    """The steps of `slices` whose part of `params` holds a value twice: counted at once for
    every step when (step, param) pairs can be (see _countable), else step by step."""
    if len(params) < 2:
        return set()
    lo, hi = int(params.min()), int(params.max())
    span = hi - lo + 1
    if not _countable(0, span * len(slices) - 1, len(params)):
        return {step for step, part in slices if _repeats(params[part])}
    sizes = [part.stop - part.start for _, part in slices]
    pairs = np.repeat(np.arange(len(slices)) * span, sizes) + (params - lo)
    twice = np.unique(np.flatnonzero(np.bincount(pairs) > 1) // span)
    return {slices[i][0] for i in twice.tolist()}


def _countable(lo: int, hi: int, n: int) -> bool:
    """Whether n values from lo to hi can be counted in an array of hi - lo + 1 entries, not
    much more than the values themselves: parameter indices can, the arbitrary 64-bit values
    of an untrusted trace cannot (they are sorted instead)."""
    return hi - lo <= 4 * n + 1024


def _repeats(order: np.ndarray) -> bool:
    """Whether a value occurs more than once."""
    n = len(order)
    if n < 2:
        return False
    lo, hi = int(order.min()), int(order.max())
    if _countable(lo, hi, n):
        return bool(np.bincount(order - lo).max() > 1)
    ordered = np.sort(order)
    return bool((ordered[1:] == ordered[:-1]).any())


def _twice(order: np.ndarray) -> list[int]:
    """The params that occur more than once, in the order of their second occurrence."""
    if not _repeats(order):
        return []
    seen: set[int] = set()
    again: list[int] = []
    for p in order.tolist():
        if p in seen and p not in again:
            again.append(p)
        seen.add(p)
    return again


def _grad_ready(per_rank: Mapping[int, Table], names: Mapping[int, Mapping[int, str]],
                forwards: Mapping[int, set[int]], world_size: int) -> list[Finding]:
    arrays: dict[int, dict[int, np.ndarray]] = {}  # step -> rank -> param indices (columns)
    twice: dict[tuple[int, int], list[int]] = {}  # (param, step) -> ranks
    summarized: dict[int, set[int]] = {}  # step -> ranks with GradsSummarized (detail levels)
    for rank, t in per_rank.items():
        for step in np.unique(t.step[t.rows(ev.GradsSummarized)]).tolist():
            summarized.setdefault(int(step), set()).add(rank)
        orders, repeated = _grad_orders(t)
        for step, order in orders.items():
            arrays.setdefault(step, {})[rank] = order
            for p in _twice(order) if step in repeated else ():
                twice.setdefault((p, step), []).append(rank)
    out = []
    for (param, step), ranks in sorted(twice.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        name = _name(names, ranks[0], param)
        states = {r: "fired twice" if r in ranks else "fired once"
                  for r in arrays.get(step, {})}
        out.append(Finding(
            kind="hook_fired_twice", severity="error",
            title=f"parameter {param} '{name}' was marked ready twice at step {step} on "
                  f"{format_ranks(ranks)}",
            ranks=tuple(sorted(ranks)), param=param, name=name, field="hook", step=step,
            values=group_ranks(states), fix=fix_for("hook_fired_twice"), world_size=world_size))
    fired = {(s, r) for s, rs in arrays.items() for r in rs}
    out += _not_recorded(summarized, fired, world_size)
    out += _no_backward_events(forwards, fired, summarized, world_size)
    differing = []
    seqs_of: dict[int, dict[int, np.ndarray]] = {}  # step -> rank -> order over common params
    for step in sorted(arrays):
        by_rank_arrays = arrays[step]
        if len(by_rank_arrays) < 2:
            continue
        first = next(iter(by_rank_arrays.values()))
        if all(np.array_equal(first, o) for o in by_rank_arrays.values()):
            continue  # the same order everywhere (the usual case)
        seqs_of[step] = seqs = _common_orders(by_rank_arrays)
        ref_seq = next(iter(seqs.values()))
        if not all(np.array_equal(ref_seq, o) for o in seqs.values()):
            differing.append(step)
    if not differing:
        return out
    maps = {r: _bucket_maps(t) for r, t in per_rank.items()}
    step = differing[0]
    seqs = seqs_of[step]
    labels: dict[bytes, str] = {}  # one label per distinct order (group_ranks groups by value)
    groups = group_ranks({r: labels.setdefault(o.tobytes(), str(len(labels)))
                          for r, o in seqs.items()})
    ref_rank = groups[0][1][0]
    ref = seqs[ref_rank]
    odd = odd_ranks(groups)
    at = min(int(np.flatnonzero(seqs[r] != ref)[0]) for r in odd if len(seqs[r]) == len(ref)
             and not np.array_equal(seqs[r], ref))
    param = int(ref[at])
    name = _name(names, ref_rank, param)
    shown = tuple((_order_text(seqs[rs[0]].tolist(), names, rs[0], at), rs) for _, rs in groups)
    detail: list[str] = []
    bucket = -1
    for s in differing:  # the first step where the difference delays a bucket
        found = _bucket_delay(arrays[s], _ordered_maps(maps, arrays[s], s), names, ref_rank, s)
        if found is not None:
            bucket, lines = found
            detail += lines
            break
    if len(differing) > 1:
        steps = ", ".join(map(str, differing[:6])) + (", ..." if len(differing) > 6 else "")
        detail.append(f"the order differs in {len(differing)} steps ({steps})")
    out.append(Finding(
        kind="grad_order", severity="warning",
        title=f"gradients became ready in a different order on {format_ranks(odd)} at step "
              f"{step} (first at position {at}: parameter {param} '{name}')",
        ranks=odd, param=param, name=name, field="grad_order", bucket=bucket, step=step,
        values=shown, detail=tuple(detail), fix=fix_for("grad_order"), world_size=world_size))
    return out


def _no_backward_events(forwards: Mapping[int, set[int]], fired: Collection[tuple[int, int]],
                        summarized: Mapping[int, set[int]], world_size: int) -> list[Finding]:
    """Steps with a forward but no gradient event at all on a rank that records them at other
    steps (watch() without the guard records backward on the steps `Recording.every` picks
    only), before that rank's last forward: said, so that a clean diagnosis is not read as
    covering them."""
    missing: dict[int, list[int]] = {}  # rank -> steps
    hooked = {r for _, r in fired}  # ranks with gradient events at some step
    for rank, seen in forwards.items():
        if rank not in hooked or not seen:
            continue
        last = max(seen)
        gaps = sorted(s for s in seen if s < last and s >= 0 and (s, rank) not in fired
                      and rank not in summarized.get(s, ()))
        if gaps:
            missing[rank] = gaps
    return _unchecked_steps(
        missing, "no gradient events",
        "gradient-ready order, hooks firing twice and unused parameters were",
        "those steps were recorded without per-parameter hooks (watch() without the guard "
        "hooks only the steps Recording.every picks; every=None none), or ran a forward "
        "without a backward", world_size)


def _not_recorded(summarized: Mapping[int, set[int]], fired: Collection[tuple[int, int]],
                  world_size: int) -> list[Finding]:
    """Steps whose per-parameter gradient events were not recorded on some ranks (detail
    levels "buckets"/"sampled": GradsSummarized only): said, not silently passed over."""
    missing: dict[int, list[int]] = {}  # rank -> steps
    for step in sorted(summarized):
        for rank in sorted(summarized[step]):
            if (step, rank) not in fired:
                missing.setdefault(rank, []).append(step)
    return _unchecked_steps(
        missing, "per-parameter gradient events were not recorded",
        "gradient-ready order and hooks firing twice were",
        "those steps were recorded (Recording.every skipped them) with one GradsSummarized per "
        "bucket (count, bytes, first and last ready time) instead of a GradReady per "
        "parameter", world_size)


def _unchecked_steps(missing: Mapping[int, Sequence[int]], what: str, unchecked: str,
                     why: str, world_size: int) -> list[Finding]:
    """The info finding for steps a diagnosis could not check (`missing`: rank -> its sorted
    steps), or none."""
    if not missing:
        return []
    ranks = tuple(sorted(missing))
    steps = sorted({s for rank_steps in missing.values() for s in rank_steps})
    return [Finding(
        kind="grad_order", severity="info",
        title=f"{what} at {len(steps)} step{'s' if len(steps) != 1 else ''} "
              f"({_step_ranges(steps)}) on {format_ranks(ranks)}: {unchecked} not checked "
              "there",
        ranks=ranks, field="not_recorded", step=steps[0],
        values=group_ranks({r: _step_ranges(missing[r]) for r in ranks}),
        detail=(why,), fix=fix_for("grad_order", "not_recorded"), world_size=world_size)]


def _step_ranges(steps: Sequence[int]) -> str:
    """[3, 4, 5, 9] -> "3-5, 9" (two steps in a row already a range; at most 6 shown)."""
    return format_ranges(steps, run=2, most=6)


def _common_orders(by_rank: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Each rank's order restricted to the params every rank has, each param once (its first
    time). Without repeats and with one set of params on every rank: the orders themselves."""
    if _one_set(list(by_rank.values())):
        return dict(by_rank)
    lists = {r: o.tolist() for r, o in by_rank.items()}
    common = set.intersection(*(set(o) for o in lists.values()))
    return {r: np.array(_dedupe(p for p in o if p in common), dtype=np.int64)
            for r, o in lists.items()}


def _one_set(orders: Sequence[np.ndarray]) -> bool:
    """Whether every order holds the same params, each once."""
    ref = orders[0]
    n = len(ref)
    if any(len(o) != n for o in orders) or _repeats(ref):
        return False
    if not n:
        return True
    lo, hi = int(ref.min()), int(ref.max())
    if _countable(lo, hi, n):
        want = np.bincount(ref - lo, minlength=hi - lo + 1)
        return all(int(o.min()) >= lo and int(o.max()) <= hi and
                   np.array_equal(np.bincount(o - lo, minlength=hi - lo + 1), want)
                   for o in orders[1:])
    ref_set = np.sort(ref)
    return all(np.array_equal(np.sort(o), ref_set) for o in orders[1:])


def _ordered_maps(maps: Mapping[int, list[tuple[int, tuple[tuple[int, ...], ...]]]],
                  by_rank: Mapping[int, np.ndarray], step: int
                  ) -> dict[int, tuple[tuple[int, ...], ...]]:
    return {r: m for r in by_rank if (m := _map_at(maps.get(r, []), step))}


def _bucket_delay(by_rank: Mapping[int, np.ndarray],
                  bucket_maps: Mapping[int, tuple[tuple[int, ...], ...]],
                  names: Mapping[int, Mapping[int, str]], ref_rank: int, step: int
                  ) -> tuple[int, list[str]] | None:
    """The first bucket whose all-reduce can start after a different number of gradients on
    some ranks (buckets launch strictly in order), with a line per group of ranks."""
    if len(bucket_maps) < 2:
        return None
    flat: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # by id of the map (alike ranks share it)
    launches = {r: (_launch_positions(by_rank[r], flat.get(id(m)) or
                                      flat.setdefault(id(m), _flat(m))), len(by_rank[r]), m)
                for r, m in bucket_maps.items()}
    n_buckets = min(len(v[2]) for v in launches.values())
    if not n_buckets:
        return None
    counts = {v[1] for v in launches.values()}
    table = np.stack([v[0][:n_buckets] for v in launches.values()])
    differs = np.flatnonzero((table != table[0]).any(axis=0))
    if len(counts) > 1:
        b = 0  # "of N gradients" differs in every bucket's text
    elif len(differs):
        b = int(differs[0])
    else:
        return None
    texts = {r: f"after {v[0][b]} of {v[1]} gradients" for r, v in launches.items()}
    members = launches[ref_rank if ref_rank in launches else min(launches)][2][b]
    label = ", ".join(repr(_name(names, ref_rank, p)) for p in members[:3])
    label += ", ..." if len(members) > 3 else ""
    lines = [f"at step {step}, bucket {b} ({label}) can start its all-reduce:"]
    lines += [f"  {format_ranks(rs)}: {t}" for t, rs in group_ranks(texts)]
    return b, lines


def _dedupe(items: Iterable[int]) -> list[int]:
    seen: set[int] = set()
    return [p for p in items if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def _order_text(order: Sequence[int], names: Mapping[int, Mapping[int, str]], rank: int,
                at: int) -> str:
    start = max(0, at - 1)
    shown = [_name(names, rank, p) for p in order[start:at + 3]]
    return ("... " if start else "") + " -> ".join(shown) + (" ..." if at + 3 < len(order) else "")


# --- collectives per step ---------------------------------------------------------------------

# The collective each event type stands for in a step's signature.
_SIGNATURE_TYPES = (ev.AllReduceLaunched, ev.BuffersSynced, ev.BucketsRebuilt)
_SIGNATURE_TEXT = {col.CODE[ev.BuffersSynced]: "buffer broadcast",
                   col.CODE[ev.BucketsRebuilt]: "bucket rebuild broadcast"}


def _signatures(t: Table) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """step -> (kinds, buckets) of the collectives a rank issued in it, in seq order."""
    rows = t.rows(*_SIGNATURE_TYPES)
    order, slices = _step_slices(t.step[rows])
    if order is not None:
        rows = rows[order]
    kinds = t.kind[rows]
    buckets = np.where(kinds == col.LAUNCHED, t.a[rows], 0)
    return {step: (kinds[part], buckets[part]) for step, part in slices}


def _signature_text(sig: tuple[np.ndarray, np.ndarray] | None) -> str:
    if sig is None or not len(sig[0]):
        return "no collectives"
    return ", ".join(_SIGNATURE_TEXT.get(k, f"all-reduce b{b}")
                     for k, b in zip(sig[0].tolist(), sig[1].tolist(), strict=True))


def _same(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray] | None
          ) -> bool:
    if a is None or b is None:
        return (a is None or not len(a[0])) and (b is None or not len(b[0]))
    return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


# [Note: who issued the extra collective]
# Ranks that issued different collectives in one step are named by what they did, not by
# which group comes first. With a value most ranks hold, the others are named; when theirs are
# that value plus some (or less some) collectives, they issued extra ones (or skipped some).
# With two ranks no value is more common, and one rank's extra collective is the other's
# skipped one, so what differs decides, by DDP's rules: a missing all-reduce is a backward
# that did not sync on the rank that lacks it (no_sync() there); an extra buffer broadcast is
# a forward only that rank ran (an evaluation through the DDP on rank 0 only). That rank is
# named only when what it issued at this step is unlike every earlier step (where all ranks
# agreed): a rank that skips its next broadcast after such a forward issues what it always
# issues at a gradient-accumulation micro-step. An extra broadcast issued after the step's
# backward began is set apart too, wherever seen before: DDP broadcasts at the start of its
# forward, so it came from a forward that is not the step's own (DDP counts a step by its
# training forward; an evaluation's forward under no_grad is none). Otherwise both are named:
# nothing sets one apart.


def _subsequence(a: Sequence[str], b: Sequence[str]) -> bool:
    """Are the collectives `a` a proper subsequence of `b`?"""
    it = iter(b)
    return len(a) < len(b) and all(x in it for x in a)


def _who_differs(values: Sequence[tuple[str, tuple[int, ...]]], step: int,
                 usual: set[str], late: set[int]) -> tuple[tuple[int, ...], str]:
    """The ranks to name and the title, from each group's collectives at `step` as text and
    those of the steps before it (`usual`); `late`: the ranks that broadcast buffers after
    the step's backward (See [Note: who issued the extra collective])."""
    items = [([] if v == "no collectives" else v.split(", "), rs) for v, rs in values]
    if len(items[0][1]) > len(items[1][1]):  # a value most ranks hold: the others differ
        ref = items[0][0]
        odd = [(seq, rs) for seq, rs in items[1:]]
        ranks = tuple(sorted(r for _, rs in odd for r in rs))
        if all(_subsequence(ref, seq) for seq, _ in odd):
            return ranks, (f"{format_ranks(ranks)} issued collectives at step {step} that "
                           f"{format_ranks(items[0][1])} did not")
        if all(_subsequence(seq, ref) for seq, _ in odd):
            return ranks, (f"{format_ranks(ranks)} skipped collectives at step {step} that "
                           f"{format_ranks(items[0][1])} issued")
        return ranks, f"ranks issued different collectives at step {step}"
    # no value is more common (two ranks): one rank's extra is the other's skip, told apart
    # by what differs and by what the ranks issued before (See [Note: who issued the extra
    # collective])
    if len(items) == 2:
        (small, few), (large, many) = sorted(items, key=lambda x: len(x[0]))
        if _subsequence(small, large):
            extra = list(large)
            for x in small:
                extra.remove(x)
            if all(x.startswith("all-reduce") for x in extra):
                candidate, word = few, "skipped"  # a backward that did not all-reduce
            elif all(x == "buffer broadcast" for x in extra):
                candidate, word = many, "issued"  # a forward only these ranks ran
            else:
                candidate, word = (), ""
            mine = small if candidate == few else large
            if candidate and (", ".join(mine) not in usual
                              or (word == "issued" and set(candidate) <= late)):
                others = many if candidate == few else few
                tail = "issued" if word == "skipped" else "did not"
                return candidate, (f"{format_ranks(candidate)} {word} collectives at step "
                                   f"{step} that {format_ranks(others)} {tail}")
    return (tuple(sorted(r for _, rs in items for r in rs)),
            f"ranks issued different collectives at step {step}")


_BACKWARD = (col.CODE[ev.BackwardStarted], col.CODE[ev.BackwardComputed],
             col.CODE[ev.BackwardFinished])


def _late_broadcast(t: Table, step: int) -> bool:
    """Did the rank broadcast buffers after `step`'s backward began (a forward that is not
    the step's own: DDP broadcasts before its forward)?"""
    kinds = t.kind[t.step == step]
    back = np.flatnonzero(np.isin(kinds, _BACKWARD))
    synced = np.flatnonzero(kinds == col.CODE[ev.BuffersSynced])
    return bool(len(back) and len(synced) and synced[-1] > back[0])


def _collectives(per_rank: Mapping[int, Table], forwards: Mapping[int, set[int]],
                 last_step: Mapping[int, int], world_size: int) -> list[Finding]:
    if len(per_rank) < 2:
        return []
    complete = min(last_step.values())  # steps below it are finished on every rank
    sigs_of = {r: _signatures(t) for r, t in per_rank.items()}
    ref = next(iter(sigs_of.values()))
    for step in sorted(s for s in set().union(*forwards.values()) if 0 <= s < complete):
        if not all(step in f for f in forwards.values()):
            continue
        if all(_same(ref.get(step), s.get(step)) for s in sigs_of.values()):
            continue
        sigs = {r: _signature_text(s.get(step)) for r, s in sigs_of.items()}
        values = group_ranks(sigs)
        # what the ranks issued at the steps before, where every rank issued the same
        usual = {_signature_text(sigs_of[r].get(st)) for r in sigs_of for st in forwards[r]
                 if 0 <= st < step}
        late = {r for r, t in per_rank.items() if _late_broadcast(t, step)}
        odd, title = _who_differs(values, step, usual, late)
        return [Finding(
            kind="collective_mismatch", severity="error", title=title, ranks=odd,
            field="collectives", step=step, values=values,
            detail=("later collectives pair up with the wrong partners: gradients are "
                    "averaged across different iterations, and the last rank waits forever",),
            fix=fix_for("collective_mismatch"), world_size=world_size)]
    return []


# --- progress: missing, lagging and stuck ranks -----------------------------------------------

_OPEN_TYPES = (ev.AllReduceLaunched, ev.AllReduceDone, ev.BroadcastStarted, ev.BroadcastFinished,
               ev.VerificationStarted, ev.VerificationPassed, ev.VerificationFailed,
               ev.BackwardFinished)
_LAUNCH, _DONE, _B_START, _B_END, _V_START, _V_PASS, _V_FAIL, _BACK_END = (
    col.CODE[c] for c in _OPEN_TYPES)


def _open_collective(t: Table) -> str | None:
    """What a rank was inside when its events end, if a collective never finished: an
    all-reduce launched after its last end of backward (which closes them all) and not done
    since, else a broadcast started and not finished, else a verification not concluded."""
    rows = t.rows(*_OPEN_TYPES)
    kinds = t.kind[rows]
    ends = np.flatnonzero(kinds == _BACK_END)
    tail = rows[ends[-1] + 1:] if len(ends) else rows
    tail = tail[(t.kind[tail] == _LAUNCH) | (t.kind[tail] == _DONE)]
    if len(tail):
        buckets = t.a[tail]
        ids, from_end = np.unique(buckets[::-1], return_index=True)
        last = tail[len(tail) - 1 - from_end]  # each bucket's last launch or done
        still = np.flatnonzero(t.kind[last] == _LAUNCH)
        if len(still):  # the lowest bucket still open
            return (f"inside the all-reduce of bucket {int(ids[still[0]])} at step "
                    f"{int(t.step[last[still[0]]])}")
    broadcast = _last_of(kinds, _B_START, _B_END)
    if broadcast >= 0 and kinds[broadcast] == _B_START:
        return f"inside a broadcast at step {int(t.step[rows[broadcast]])}"
    verification = _last_of(kinds, _V_START, _V_PASS, _V_FAIL)
    if verification >= 0 and kinds[verification] == _V_START:
        return "inside model verification"
    return None


def _last_of(kinds: np.ndarray, *codes: int) -> int:
    """The index of the last of `kinds` that is one of `codes`; -1 when none is."""
    mask = np.zeros(len(kinds), dtype=bool)
    for code in codes:
        mask |= kinds == code
    found = np.flatnonzero(mask)
    return int(found[-1]) if len(found) else -1


# [Note: ranks that ended cleanly]
# A rank whose file ends with its end record (tracefile.py) closed its trace at exit: it waits
# in nothing, so it is never "still waiting in a collective", whatever its last events say. Nor
# is it hung: if it ended at an earlier step than the ranks left waiting, it left them (named,
# as having ended, with the fix for uneven steps); if it ended at their step or later, it
# reached the collective they are in, so they are not waiting for it: they were finishing it
# when the files were read (a job still running), and no hang is named for it.


def _progress(per_rank: Mapping[int, Table], last_step: Mapping[int, int], world_size: int,
              reported: Sequence[Finding], ended: Mapping[int, End] | None = None
              ) -> list[Finding]:
    out: list[Finding] = []
    missing = tuple(r for r in range(world_size) if r not in per_rank)
    if missing and per_rank:
        states = {r: "sent events" if r in per_rank else "no events" for r in range(world_size)}
        out.append(Finding(
            kind="missing_rank", severity="error",
            title=f"{format_ranks(missing)} sent no events", ranks=missing, field="events",
            values=group_ranks(states),
            fix=fix_for("missing_rank", "events"), world_size=world_size))
    if len(per_rank) < 2:
        return out
    top = max(last_step.values())
    behind = tuple(sorted(r for r, s in last_step.items() if s < top))
    if behind and not any(f.kind == "uneven_iterations" for f in reported) \
            and not _stuck_alive(behind, reported, ended or {}) \
            and not _mispaired(behind, reported, ended or {}):
        # (a rank named live as having left the loop says more: whereabouts.py)
        states = {r: f"last step {s}" for r, s in last_step.items()}
        out.append(Finding(
            kind="uneven_iterations", severity="warning",
            title=f"{format_ranks(behind)} stopped at step "
                  f"{min(last_step[r] for r in behind)} while others reached step {top}",
            ranks=behind, field="iterations", step=top, values=group_ranks(states),
            fix=fix_for("uneven_iterations"), world_size=world_size))
    if any(f.kind in _STUCK_KINDS for f in reported):
        return out  # the ranks already said where they were, more precisely than events can
    # See [Note: ranks that ended cleanly]
    done = {r: last_step[r] for r, e in (ended or {}).items() if r in per_rank and not e.error}
    stuck = {r: _open_collective(t) for r, t in per_rank.items() if r not in done}
    inside = {r: s for r, s in stuck.items() if s is not None}
    if inside:
        at = min(last_step[r] for r in inside)
        left = tuple(sorted(r for r, s in done.items() if s < at))
        outside = tuple(sorted(r for r in per_rank if r not in inside and r not in done))
        if done and not outside and not left:
            return out  # every other rank ended after reaching this step: no one is waited for
        states = {r: inside.get(r) or (f"ended cleanly after step {done[r]}" if r in done else
                  f"not in a collective (last event: "
                  f"{col.KINDS[int(t.kind[-1])].__name__} at step {int(t.step[-1])})")
                  for r, t in per_rank.items()}
        waiting = format_ranks(tuple(inside))
        title = (f"{waiting} {'was' if len(inside) == 1 else 'were'} still waiting in a "
                 "collective when the events end")
        if outside:
            title += f"; {format_ranks(outside)} {'was' if len(outside) == 1 else 'were'} not in it"
        if left:
            title += (f"; {format_ranks(left)} had already ended cleanly, at an earlier step")
        out.append(Finding(
            kind="rank_hang", severity="error",
            title=title if outside or left
            else f"{waiting} were all inside collectives when the events end",
            ranks=tuple(sorted(outside + left)), field="collective", values=group_ranks(states),
            fix=fix_for("uneven_iterations", "left_loop") if left and not outside
            else fix_for("collective_mismatch"), world_size=world_size))
    return out


# [Note: a stuck rank is not uneven data]
# A rank that ran fewer steps than the others is uneven data only if it left the loop. One
# that a live hang finding named as the rank the others waited for (rank_hang, rank_waiting:
# it was alive, at its step, its stack taken where it was), that no finding names as exited
# and whose trace has no clean end was stuck inside its step, not out of data: the hang
# finding says so, and an uneven_iterations warning beside it would give a wrong cause and
# the uneven-data fix. Likewise when the ranks issued different collectives (a
# collective_mismatch or unmatched_collective error): the collectives parted first, and where
# each rank's steps stopped follows from that (gloo aborts one, the other waits or fails later).
# A rank that left the loop says so itself (whereabouts.py: a live
# uneven_iterations finding), and one that ended cleanly after fewer steps keeps the warning.


def _stuck_alive(behind: Sequence[int], reported: Sequence[Finding],
                 ended: Mapping[int, End]) -> bool:
    """Were all the ranks `behind` named stuck while alive? See [Note: a stuck rank is not
    uneven data]."""
    hung = {r for f in reported if f.kind in ("rank_hang", "rank_waiting") for r in f.ranks}
    gone = {r for f in reported if f.kind == "rank_exited" for r in f.ranks}
    return all(r in hung and r not in gone and (r not in ended or ended[r].error)
               for r in behind)


def _mispaired(behind: Sequence[int], reported: Sequence[Finding],
               ended: Mapping[int, End]) -> bool:
    """Did the ranks issue different collectives (an error named live), with no rank `behind`
    ending cleanly? Then the step counts parted because the collectives did, not because a rank
    ran out of data. See [Note: a stuck rank is not uneven data]."""
    return any(f.kind in ("collective_mismatch", "unmatched_collective")
               and f.severity == "error" for f in reported) \
        and all(r not in ended or ended[r].error for r in behind)


def _dropped(per_rank: Mapping[int, Table], world_size: int) -> list[Finding]:
    counts = {r: sum(e.count for e in t.rare(ev.EventsDropped)
                     ) for r, t in per_rank.items()}
    counts = {r: n for r, n in counts.items() if n}
    if not counts:
        return []
    return [Finding(
        kind="events_dropped", severity="info",
        title=f"{format_ranks(tuple(counts))} dropped {sum(counts.values())} events, so this "
              "diagnosis may be incomplete", ranks=tuple(sorted(counts)), field="events",
        values=tuple((f"{n} dropped", (r,)) for r, n in sorted(counts.items())),
        fix=fix_for("events_dropped"),
        world_size=world_size)]
