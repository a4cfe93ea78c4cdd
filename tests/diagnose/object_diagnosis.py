"""The object path of diagnosis, as it was before the columnar store (ddpviz/traces/columns.py):
one Python object per event, dispatched one by one. Kept here only as the oracle that
test_columnar_diagnosis.py compares ddpviz.diagnose with; not part of ddpviz."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from ddpviz import events as ev
from ddpviz.engine.verify import mismatch_findings
from ddpviz.events import Collective, Event
from ddpviz.findings import (
    Finding,
    Findings,
    fix_for,
    format_ranks,
    group_ranks,
    odd_ranks,
    sort_findings,
)

_STUCK_KINDS = ("rank_hang", "rank_exited", "missing_rank", "peer_failed", "collective_mismatch")


def diagnose(source: Any) -> Findings:
    """Findings from a run: a `Run` (from ddpviz.launch), a `Session`, a `Trace`, a path to a
    `.ddpviz` file, or any iterable of events (e.g. a list an emitter appended to).

    Returns:
        The findings, errors first, each identical no matter which rank's events reported it;
        a list that prints as one message.
    """
    return diagnose_events(_events(source))


def _events(source: Any) -> list[Event]:
    from ddpviz.traces.trace import Trace

    if isinstance(source, (str, os.PathLike)):
        source = Trace.load(source)
    if not isinstance(source, Trace) and hasattr(source, "trace"):
        source = source.trace  # Run, Session
    if isinstance(source, Trace):
        return source.events()
    if isinstance(source, Iterable):
        return [e for e in source if isinstance(e, Event)]
    raise TypeError(f"ddpviz: diagnose() takes a Run, Session, Trace, trace path or events, not "
                    f"{type(source).__name__}.\nPass run (from ddpviz.launch) or run.trace.")


def diagnose_events(events: Iterable[Event]) -> Findings:
    """`diagnose` over a list of events from any ranks."""
    per_rank: dict[int, list[Event]] = {}
    for e in events:
        per_rank.setdefault(e.rank, []).append(e)
    for lst in per_rank.values():
        lst.sort(key=lambda e: e.seq)
    world_size = _world_size(per_rank)
    names = _names(per_rank)
    reported = _reported(per_rank)
    computed = [*_verification(per_rank, world_size),
                *_unused(per_rank, names, world_size),
                *_grad_ready(per_rank, names, world_size),
                *_collectives(per_rank, world_size),
                *_progress(per_rank, names, world_size, reported),
                *_dropped(per_rank, world_size)]
    seen = {(f.kind, f.name) for f in reported}
    out = list(reported)
    for f in computed:
        if (f.kind, f.name) not in seen and f not in out:
            out.append(f)
    return Findings(sort_findings(out))


# --- context ----------------------------------------------------------------------------------


def _world_size(per_rank: Mapping[int, list[Event]]) -> int:
    size = max(per_rank, default=-1) + 1
    for lst in per_rank.values():
        for e in lst:
            if isinstance(e, (ev.VerificationStarted, ev.VerificationPassed,
                              ev.VerificationFailed)):
                size = max(size, e.world_size)
            elif isinstance(e, ev.FindingReported):
                size = max(size, e.finding.world_size)
    return size


def _names(per_rank: Mapping[int, list[Event]]) -> dict[int, dict[int, str]]:
    """{rank: {param index: dotted name}} from each rank's latest ParamsBuilt."""
    out: dict[int, dict[int, str]] = {}
    for rank, lst in per_rank.items():
        for e in lst:
            if isinstance(e, ev.ParamsBuilt):
                out[rank] = {p.index: p.name for p in e.params}
    return out


def _name(names: Mapping[int, Mapping[int, str]], rank: int, index: int) -> str:
    return names.get(rank, {}).get(index, f"#{index}")


# --- what the ranks reported ------------------------------------------------------------------


def _reported(per_rank: Mapping[int, list[Event]]) -> list[Finding]:
    """FindingReported, de-duplicated: the same finding from several ranks counts once; a
    rank-local finding seen on several ranks is merged into one naming all of them."""
    out: list[Finding] = []
    merged: dict[tuple[Any, ...], int] = {}
    for rank in sorted(per_rank):
        for e in per_rank[rank]:
            if not isinstance(e, ev.FindingReported):
                continue
            f = e.finding
            if f in out or f.kind == "rank_waiting":  # live-only: the verdict, if any, follows
                continue
            if f.kind == "rank_hang":  # each waiting rank's side of one wait: the first's
                key = ("hang", f.severity, f.ranks, f.field, f.step)
                if key not in merged:
                    merged[key] = len(out)
                    out.append(f)
                continue
            key = (f.kind, f.title.replace(f"rank {rank}", "rank ?"), f.name, f.field, f.step,
                   f.detail)
            if f.kind in ("buffer_reassigned", "unsynced_gradients") and key in merged:
                i = merged[key]
                old = out[i]
                values = _merge_values(old.values, f.values)
                out[i] = _replace(old, ranks=tuple(sorted({*old.ranks, *f.ranks})),
                                  values=values,
                                  title=old.title.replace(format_ranks(old.ranks),
                                                          format_ranks((*old.ranks, *f.ranks))))
                continue
            merged[key] = len(out)
            out.append(f)
    return out


def _merge_values(a: Sequence[tuple[str, tuple[int, ...]]],
                  b: Sequence[tuple[str, tuple[int, ...]]]
                  ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    per: dict[int, str] = {}
    for value, ranks in (*a, *b):
        for r in ranks:
            per[r] = value
    return group_ranks(per)


def _replace(f: Finding, **changes: Any) -> Finding:
    return msgspec.structs.replace(f, **changes)


# --- model verification -----------------------------------------------------------------------


def _verification(per_rank: Mapping[int, list[Event]], world_size: int) -> list[Finding]:
    for rank in sorted(per_rank):
        for e in per_rank[rank]:
            if isinstance(e, ev.VerificationFailed):
                return mismatch_findings(e.mismatches, e.world_size)
    return []


# --- unused parameters ------------------------------------------------------------------------


def _steps_seen(lst: Sequence[Event]) -> set[int]:
    return {e.step for e in lst if e.step >= 0}


def _unused(per_rank: Mapping[int, list[Event]], names: Mapping[int, Mapping[int, str]],
            world_size: int) -> list[Finding]:
    unused: dict[tuple[int, int], set[str]] = {}  # (rank, step) -> names
    index_of: dict[str, int] = {}
    for rank, lst in per_rank.items():
        for e in lst:
            if isinstance(e, ev.UnusedParametersFound):
                unused.setdefault((rank, e.step), set()).update(e.names)
                index_of.update(zip(e.names, e.params, strict=False))
    if not unused:
        return []
    active = {r: _steps_seen(lst) for r, lst in per_rank.items()}
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


def _bucket_maps(lst: Sequence[Event]) -> list[tuple[int, tuple[tuple[int, ...], ...]]]:
    return [(max(e.step, -1), e.buckets) for e in lst if isinstance(e, ev.BucketAssigned)]


def _map_at(maps: Sequence[tuple[int, tuple[tuple[int, ...], ...]]], step: int
            ) -> tuple[tuple[int, ...], ...]:
    current: tuple[tuple[int, ...], ...] = ()
    for s, buckets in maps:
        if s <= step:
            current = buckets
    return current


def _launch_positions(order: Sequence[int], buckets: Sequence[Sequence[int]]) -> list[int]:
    """For each bucket, after how many gradients it can start (buckets launch in order)."""
    position = {p: i + 1 for i, p in enumerate(order)}
    out, running = [], 0
    for bucket in buckets:
        ready = max((position.get(p, len(order)) for p in bucket), default=0)
        running = max(running, ready)
        out.append(running)
    return out


def _grad_ready(per_rank: Mapping[int, list[Event]], names: Mapping[int, Mapping[int, str]],
                world_size: int) -> list[Finding]:
    orders: dict[int, dict[int, list[int]]] = {}  # step -> rank -> param indices
    fired: dict[tuple[int, int], set[int]] = {}  # (step, rank) -> params (linear lookups)
    twice: dict[tuple[int, int], list[int]] = {}  # (param, step) -> ranks
    for rank, lst in per_rank.items():
        for e in lst:
            if isinstance(e, ev.GradReady):
                order = orders.setdefault(e.step, {}).setdefault(rank, [])
                seen = fired.setdefault((e.step, rank), set())
                if e.param in seen and rank not in twice.get((e.param, e.step), []):
                    twice.setdefault((e.param, e.step), []).append(rank)
                seen.add(e.param)
                order.append(e.param)
    out = []
    for (param, step), ranks in sorted(twice.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        name = _name(names, ranks[0], param)
        states = {r: "fired twice" if r in ranks else "fired once"
                  for r in orders.get(step, {})}
        out.append(Finding(
            kind="hook_fired_twice", severity="error",
            title=f"parameter {param} '{name}' was marked ready twice at step {step} on "
                  f"{format_ranks(ranks)}",
            ranks=tuple(sorted(ranks)), param=param, name=name, field="hook", step=step,
            values=group_ranks(states), fix=fix_for("hook_fired_twice"), world_size=world_size))
    maps = {r: _bucket_maps(lst) for r, lst in per_rank.items()}
    differing = []
    for step in sorted(orders):
        by_rank = orders[step]
        if len(by_rank) < 2:
            continue
        common = set.intersection(*(set(o) for o in by_rank.values()))
        seqs = {r: tuple(_dedupe(p for p in o if p in common)) for r, o in by_rank.items()}
        if len(set(seqs.values())) > 1:
            differing.append(step)
    if not differing:
        return out
    step = differing[0]
    by_rank = orders[step]
    common = set.intersection(*(set(o) for o in by_rank.values()))
    seqs = {r: tuple(_dedupe(p for p in o if p in common)) for r, o in by_rank.items()}
    groups = group_ranks({r: ",".join(map(str, s)) for r, s in seqs.items()})
    ref_rank = groups[0][1][0]
    ref = seqs[ref_rank]
    odd = odd_ranks(groups)
    at = next(i for i in range(len(ref)) if any(seqs[r][i] != ref[i] for r in odd))
    param = ref[at]
    name = _name(names, ref_rank, param)
    shown = tuple((_order_text(seqs[rs[0]], names, rs[0], at), rs) for _, rs in groups)
    detail: list[str] = []
    bucket = -1
    for s in differing:  # the first step where the difference delays a bucket
        found = _bucket_delay(orders[s], _ordered_maps(maps, orders[s], s), names, ref_rank, s)
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


def _ordered_maps(maps: Mapping[int, list[tuple[int, tuple[tuple[int, ...], ...]]]],
                  by_rank: Mapping[int, list[int]], step: int
                  ) -> dict[int, tuple[tuple[int, ...], ...]]:
    return {r: m for r in by_rank if (m := _map_at(maps.get(r, []), step))}


def _bucket_delay(by_rank: Mapping[int, list[int]],
                  bucket_maps: Mapping[int, tuple[tuple[int, ...], ...]],
                  names: Mapping[int, Mapping[int, str]], ref_rank: int, step: int
                  ) -> tuple[int, list[str]] | None:
    """The first bucket whose all-reduce can start after a different number of gradients on
    some ranks (buckets launch strictly in order), with a line per group of ranks."""
    if len(bucket_maps) < 2:
        return None
    launches = {r: (_launch_positions(by_rank[r], m), len(by_rank[r]), m)
                for r, m in bucket_maps.items()}
    for b in range(min(len(v[2]) for v in launches.values())):
        texts = {r: f"after {v[0][b]} of {v[1]} gradients" for r, v in launches.items()}
        if len(set(texts.values())) > 1:
            members = launches[ref_rank if ref_rank in launches else min(launches)][2][b]
            label = ", ".join(repr(_name(names, ref_rank, p)) for p in members[:3])
            label += ", ..." if len(members) > 3 else ""
            lines = [f"at step {step}, bucket {b} ({label}) can start its all-reduce:"]
            lines += [f"  {format_ranks(rs)}: {t}" for t, rs in group_ranks(texts)]
            return b, lines
    return None


def _dedupe(items: Iterable[int]) -> list[int]:
    seen: set[int] = set()
    return [p for p in items if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def _order_text(order: Sequence[int], names: Mapping[int, Mapping[int, str]], rank: int,
                at: int) -> str:
    start = max(0, at - 1)
    shown = [_name(names, rank, p) for p in order[start:at + 3]]
    return ("... " if start else "") + " -> ".join(shown) + (" ..." if at + 3 < len(order) else "")


# --- collectives per step ---------------------------------------------------------------------


def _all_reduce_part(e: ev.AllReduceLaunched) -> str:
    return f"all-reduce b{e.bucket}"


def _collective_part(name: Collective) -> Callable[[Event], str]:
    return lambda e: name


# The collective each event type stands for in a step's signature (typed per event class).
_SIGNATURE_PART: dict[type[Event], Callable[[Any], str]] = {
    ev.AllReduceLaunched: _all_reduce_part,
    ev.BuffersSynced: _collective_part("buffer broadcast"),
    ev.BucketsRebuilt: _collective_part("bucket rebuild broadcast"),
}


def _signature(lst: Sequence[Event], step: int) -> str:
    parts = []
    for e in lst:
        if e.step != step:
            continue
        part = _SIGNATURE_PART.get(type(e))
        if part is not None:
            parts.append(part(e))
    return ", ".join(parts) if parts else "no collectives"


def _sub(a: list[str], b: list[str]) -> bool:
    """a is b with some collectives left out (a proper subsequence)."""
    i = 0
    for x in b:
        if i < len(a) and a[i] == x:
            i += 1
    return i == len(a) and len(a) < len(b)


def _who_differs(values: Sequence[tuple[str, tuple[int, ...]]], step: int, seen: set[str],
                 late: set[int]) -> tuple[tuple[int, ...], str]:
    """Who issued extra collectives or skipped some, by their lists (a majority first; else
    the one list not `seen` at an earlier step)."""
    lists = [(v.split(", ") if v != "no collectives" else [], rs) for v, rs in values]
    every = tuple(sorted(r for _, rs in lists for r in rs))
    generic = f"ranks issued different collectives at step {step}"
    if len(lists[0][1]) > len(lists[1][1]):
        ref, common = lists[0]
        ranks = tuple(r for r in every if r not in common)
        if all(_sub(ref, x) for x, _ in lists[1:]):
            return ranks, (f"{format_ranks(ranks)} issued collectives at step {step} that "
                           f"{format_ranks(common)} did not")
        if all(_sub(x, ref) for x, _ in lists[1:]):
            return ranks, (f"{format_ranks(ranks)} skipped collectives at step {step} that "
                           f"{format_ranks(common)} issued")
        return ranks, generic
    if len(lists) == 2:
        a, b = lists
        if len(a[0]) > len(b[0]):
            a, b = b, a
        if _sub(a[0], b[0]):
            extra = list(b[0])
            for x in a[0]:
                extra.remove(x)
            if all(x.startswith("all-reduce") for x in extra) and ", ".join(a[0]) not in seen:
                return a[1], (f"{format_ranks(a[1])} skipped collectives at step {step} that "
                              f"{format_ranks(b[1])} issued")
            if all(x == "buffer broadcast" for x in extra) and (
                    ", ".join(b[0]) not in seen or set(b[1]) <= late):
                return b[1], (f"{format_ranks(b[1])} issued collectives at step {step} that "
                              f"{format_ranks(a[1])} did not")
    return every, generic


def _collectives(per_rank: Mapping[int, list[Event]], world_size: int) -> list[Finding]:
    if len(per_rank) < 2:
        return []
    forwards = {r: {e.step for e in lst if isinstance(e, ev.ForwardStarted)}
                for r, lst in per_rank.items()}
    last = {r: max((e.step for e in lst), default=-1) for r, lst in per_rank.items()}
    complete = min(last.values())  # steps below it are finished on every rank
    for step in range(complete):
        if not all(step in f for f in forwards.values()):
            continue
        sigs = {r: _signature(lst, step) for r, lst in per_rank.items()}
        if len(set(sigs.values())) > 1:
            values = group_ranks(sigs)
            seen = {_signature(lst, s) for r, lst in per_rank.items() for s in forwards[r]
                    if s < step}
            late = set()  # ranks that broadcast buffers after the step's backward began
            for r, lst in per_rank.items():
                mine = [e for e in lst if e.step == step]
                back = [i for i, e in enumerate(mine) if isinstance(
                    e, (ev.BackwardStarted, ev.BackwardComputed, ev.BackwardFinished))]
                if back and any(isinstance(e, ev.BuffersSynced) and i > back[0]
                                for i, e in enumerate(mine)):
                    late.add(r)
            odd, title = _who_differs(values, step, seen, late)
            return [Finding(
                kind="collective_mismatch", severity="error", title=title, ranks=odd,
                field="collectives", step=step, values=values,
                detail=("later collectives pair up with the wrong partners: gradients are "
                        "averaged across different iterations, and the last rank waits forever",),
                fix=fix_for("collective_mismatch"), world_size=world_size)]
    return []


# --- progress: missing, lagging and stuck ranks -----------------------------------------------


class _OpenCollective:
    """Which collective a rank is inside, event by event: one handler per event type that
    opens or closes one (`_OPEN_HANDLERS`), each typed with its event class."""

    def __init__(self) -> None:
        self.all_reduce: dict[int, ev.AllReduceLaunched] = {}
        self.broadcast: ev.BroadcastStarted | None = None
        self.verification: ev.VerificationStarted | None = None

    def all_reduce_launched(self, e: ev.AllReduceLaunched) -> None:
        self.all_reduce[e.bucket] = e

    def all_reduce_done(self, e: ev.AllReduceDone) -> None:
        self.all_reduce.pop(e.bucket, None)

    def broadcast_started(self, e: ev.BroadcastStarted) -> None:
        self.broadcast = e

    def broadcast_finished(self, e: ev.BroadcastFinished) -> None:
        self.broadcast = None

    def verification_started(self, e: ev.VerificationStarted) -> None:
        self.verification = e

    def verification_ended(self, e: ev.VerificationPassed | ev.VerificationFailed) -> None:
        self.verification = None

    def backward_finished(self, e: ev.BackwardFinished) -> None:
        self.all_reduce.clear()


_OPEN_HANDLERS: dict[type[Event], Callable[[_OpenCollective, Any], None]] = {
    ev.AllReduceLaunched: _OpenCollective.all_reduce_launched,
    ev.AllReduceDone: _OpenCollective.all_reduce_done,
    ev.BroadcastStarted: _OpenCollective.broadcast_started,
    ev.BroadcastFinished: _OpenCollective.broadcast_finished,
    ev.VerificationStarted: _OpenCollective.verification_started,
    ev.VerificationPassed: _OpenCollective.verification_ended,
    ev.VerificationFailed: _OpenCollective.verification_ended,
    ev.BackwardFinished: _OpenCollective.backward_finished,
}


def _open_collective(lst: Sequence[Event], names: Mapping[int, str]) -> str | None:
    """What a rank was inside when its events end, if a collective never finished."""
    state = _OpenCollective()
    for e in lst:
        handler = _OPEN_HANDLERS.get(type(e))
        if handler is not None:
            handler(state, e)
    if state.all_reduce:
        b = min(state.all_reduce)
        return f"inside the all-reduce of bucket {b} at step {state.all_reduce[b].step}"
    if state.broadcast is not None:
        return f"inside a broadcast at step {state.broadcast.step}"
    if state.verification is not None:
        return "inside model verification"
    return None


def _progress(per_rank: Mapping[int, list[Event]], names: Mapping[int, Mapping[int, str]],
              world_size: int, reported: Sequence[Finding]) -> list[Finding]:
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
    last_step = {r: max((e.step for e in lst), default=-1) for r, lst in per_rank.items()}
    top = max(last_step.values())
    behind = tuple(sorted(r for r, s in last_step.items() if s < top))
    if behind:
        states = {r: f"last step {s}" for r, s in last_step.items()}
        out.append(Finding(
            kind="uneven_iterations", severity="warning",
            title=f"{format_ranks(behind)} stopped at step "
                  f"{min(last_step[r] for r in behind)} while others reached step {top}",
            ranks=behind, field="iterations", step=top, values=group_ranks(states),
            fix=fix_for("uneven_iterations"), world_size=world_size))
    if any(f.kind in _STUCK_KINDS for f in reported):
        return out  # the ranks already said where they were, more precisely than events can
    stuck = {r: _open_collective(lst, names.get(r, {})) for r, lst in per_rank.items()}
    inside = {r: s for r, s in stuck.items() if s is not None}
    if inside:
        outside = tuple(sorted(r for r in per_rank if r not in inside))
        states = {r: inside.get(r) or f"not in a collective (last event: "
                  f"{type(per_rank[r][-1]).__name__} at step {per_rank[r][-1].step})"
                  for r in per_rank}
        waiting = format_ranks(tuple(inside))
        out.append(Finding(
            kind="rank_hang", severity="error",
            title=(f"{waiting} {'was' if len(inside) == 1 else 'were'} still waiting in a "
                   f"collective when the events end; {format_ranks(outside)} "
                   f"{'was' if len(outside) == 1 else 'were'} not in it")
            if outside else f"{waiting} were all inside collectives when the events end",
            ranks=outside, field="collective", values=group_ranks(states),
            fix=fix_for("collective_mismatch"), world_size=world_size))
    return out


def _dropped(per_rank: Mapping[int, list[Event]], world_size: int) -> list[Finding]:
    counts = {r: sum(e.count for e in lst if isinstance(e, ev.EventsDropped))
              for r, lst in per_rank.items()}
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
