"""Aligning ranks' Flight Recorder entries by process group and sequence id: which collective
each rank completed last and waits in first, who never launched a collective others wait in,
and where ranks launched different collectives under one sequence id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddpviz._postmortem.dumps import FrDump, FrEntry


@dataclass(frozen=True)
class RankState:
    """Where one rank stood in one process group when it dumped."""

    rank: int
    first_seq: int  # oldest sequence id still in its ring buffer (0: no entry)
    last_launched: FrEntry | None
    last_completed: FrEntry | None
    first_pending: FrEntry | None


@dataclass(frozen=True)
class Mismatch:
    """Ranks launched different collectives under one sequence id."""

    seq: int
    by_rank: dict[int, FrEntry]


@dataclass(frozen=True)
class Stall:
    """The oldest collective some rank waits in, and who never launched it."""

    seq: int
    waiting: dict[int, FrEntry]  # ranks that launched it and wait
    never_launched: tuple[int, ...]  # ranks whose dumps stop before it
    ahead: tuple[int, ...]  # ranks that completed it (a mismatch, or it paired elsewhere)
    also: tuple[int, ...] = ()  # later collectives others launched and the laggards never did


@dataclass(frozen=True)
class GroupAlignment:
    """One process group across the ranks that dumped."""

    pg: str
    desc: str
    members: tuple[int, ...]  # global ranks of the group (from pg_config)
    missing_dumps: tuple[int, ...]  # members without a dump
    states: dict[int, RankState]
    entries: dict[int, dict[int, FrEntry]]  # rank -> seq -> entry (collectives; last of a
    # coalesced group)
    mismatches: tuple[Mismatch, ...]
    stall: Stall | None


def signature(e: FrEntry) -> tuple[str, tuple[tuple[int, ...], ...], tuple[str, ...]]:
    return (e.op, e.input_sizes, e.dtypes)


def align(dumps: Sequence[FrDump]) -> list[GroupAlignment]:
    """One GroupAlignment per process group seen in any dump (collectives only; p2p ops are
    aligned by their own p2p sequence id under the name 'PG:p2p')."""
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    per: dict[str, dict[int, dict[int, FrEntry]]] = {}
    for d in dumps:
        for name, cfg in d.groups.items():
            groups.setdefault(name, cfg)
        for e in d.entries:
            key = f"{e.pg}:p2p" if e.is_p2p else e.pg
            per.setdefault(key, {}).setdefault(d.rank, {})[e.seq] = e
        for name in d.groups:
            per.setdefault(name, {}).setdefault(d.rank, {})
    ranks = [d.rank for d in dumps]
    out = []
    for key in sorted(per, key=lambda k: (k.endswith(":p2p"), k)):
        base = key.removesuffix(":p2p")
        by_rank = per[key]
        desc, members = groups.get(base, ("", ()))
        if not members:
            members = tuple(sorted(by_rank))
        if not any(by_rank.values()):
            continue
        dumped = [r for r in members if r in ranks]
        for r in dumped:
            by_rank.setdefault(r, {})
        states = {r: _state(r, by_rank[r]) for r in dumped}
        out.append(GroupAlignment(
            pg=key, desc=desc, members=tuple(members),
            missing_dumps=tuple(r for r in members if r not in ranks), states=states,
            entries={r: by_rank[r] for r in dumped}, mismatches=_mismatches(by_rank),
            stall=_stall(states, by_rank)))
    return out


def _state(rank: int, entries: dict[int, FrEntry]) -> RankState:
    if not entries:
        return RankState(rank, 0, None, None, None)
    seqs = sorted(entries)
    done = [s for s in seqs if entries[s].completed]
    pending = [s for s in seqs if not entries[s].completed]
    return RankState(rank, seqs[0], entries[seqs[-1]],
                     entries[done[-1]] if done else None,
                     entries[pending[0]] if pending else None)


def _mismatches(by_rank: dict[int, dict[int, FrEntry]]) -> tuple[Mismatch, ...]:
    seqs = sorted({s for es in by_rank.values() for s in es})
    out = []
    for s in seqs:
        here = {r: es[s] for r, es in by_rank.items() if s in es}
        if len({signature(e) for e in here.values()}) > 1:
            out.append(Mismatch(s, here))
    return tuple(out)


# [Note: the first collective never launched]
# Sequence ids are consecutive per group on every rank, so a rank whose last launched
# collective is #N never launched #N+1, whatever the other ranks' entries say when they are
# dumped. Their "first pending" entry is not that stable: gloo retires an entry whose wait timed
# out, so after the group's timeout the waiting ranks' oldest pending entry moves to a later
# collective, and a post-mortem based on it named bucket 0 or bucket 2 of the same step
# depending on when the dumps were taken. So when ranks launched different numbers of
# collectives, the stall is the first one the laggards never launched (the later ones are
# "also never launched"); only when every rank launched the same number is it the oldest
# collective some rank waits in.


def _stall(states: dict[int, RankState], by_rank: dict[int, dict[int, FrEntry]]
           ) -> Stall | None:
    """The collective the group is stuck at. See [Note: the first collective never launched]."""
    last = {r: st.last_launched.seq if st.last_launched is not None else 0
            for r, st in states.items()}
    if len(set(last.values())) > 1:
        low, high = min(last.values()), max(last.values())
        seq = low + 1
        launched = {r: by_rank[r][seq] for r in states if seq in by_rank[r]}
        if launched:
            never = tuple(sorted(r for r, n in last.items() if n == low))
            return Stall(seq, launched, never, (), tuple(range(seq + 1, high + 1)))
    pending = [st.first_pending.seq for st in states.values() if st.first_pending is not None]
    if not pending:  # nobody waits (ranks that stopped early show in the per-rank rows)
        return None
    seq = min(pending)
    waiting = {r: by_rank[r][seq] for r, st in states.items()
               if seq in by_rank[r] and not by_rank[r][seq].completed}
    never = tuple(sorted(r for r, st in states.items()
                         if st.last_launched is None or st.last_launched.seq < seq))
    ahead = tuple(sorted(r for r in states if seq in by_rank[r] and by_rank[r][seq].completed))
    return Stall(seq, waiting, never, ahead)
