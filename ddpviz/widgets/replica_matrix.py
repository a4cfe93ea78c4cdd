"""Replica agreement as plain data: one row per tensor a `replicas_diverged` finding named,
one cell per rank (the letter of the group of ranks holding the same bytes: A, the most common,
agrees with the majority), columns grouped when there are more than MANY_RANKS ranks.

Read from the findings only (ddpviz/probes/replica_verdict.py fills `Finding.tensors`;
findings.py's `replica_groups` reads it, or the per-tensor lines of older traces), so a live
run and a trace show the same. Ranks are kept as (lo, hi) spans throughout: a group of
131,072 ranks costs one span, whatever a trace claims. Pure functions: no widgets here.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from itertools import pairwise
from typing import NamedTuple

from ddpviz.findings import Finding, Spans, format_spans, merge_spans, replica_groups
from ddpviz.model.rank_groups import MANY_RANKS

# Cell updates spent on grouping ranks into columns (rows x the rank spans each row covers);
# rows past it still show, but no longer split columns, so a trace of many rows over many
# small spans cannot make the grouping quadratic.
MAX_CELL_WORK = 1 << 20


class RankLetters(Mapping[int, str]):
    """rank -> group letter, stored as sorted disjoint (lo, hi, letter) spans: a mapping of
    131,072 ranks in one group is one span. Built from (lo, hi, letter) for ranks lo..hi;
    where those overlap, a later one wins (as when a dict is updated in order)."""

    def __init__(self, assigned: Sequence[tuple[int, int, str]] = ()) -> None:
        self.spans = _resolve(assigned)
        self._starts = [lo for lo, _, _ in self.spans]

    def __getitem__(self, rank: int) -> str:
        i = bisect_right(self._starts, rank) - 1
        if i >= 0 and rank <= self.spans[i][1]:
            return self.spans[i][2]
        raise KeyError(rank)

    def __iter__(self) -> Iterator[int]:
        for lo, hi, _ in self.spans:
            yield from range(lo, hi + 1)

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi, _ in self.spans)

    def __repr__(self) -> str:
        return f"RankLetters({self.spans!r})"


class ReplicaRow(NamedTuple):
    """One differing tensor at one checked step."""

    step: int
    name: str
    severity: str
    cells: RankLetters  # rank -> group letter ("A": the most common bytes)
    sizes: dict[str, str]  # group letter -> what those ranks hold (norms)


class ReplicaMatrix(NamedTuple):
    rows: list[ReplicaRow]
    columns: list[tuple[str, Spans]]  # (label, its ranks as (lo, hi) spans): a rank or a group
    world_size: int


def replica_matrix(findings: Sequence[object], world_size: int = 0,
                   many: int = MANY_RANKS) -> ReplicaMatrix:
    """The rows of every replicas_diverged finding in `findings`, and the columns: each rank
    up to `many` ranks, else the groups of ranks whose cells are alike in every row."""
    rows: list[ReplicaRow] = []
    for f in findings:
        if not isinstance(f, Finding) or f.kind != "replicas_diverged":
            continue
        world_size = max(world_size, f.world_size)
        for name, groups in replica_groups(f):
            assigned: list[tuple[int, int, str]] = []
            sizes: dict[str, str] = {}
            for k, (spans, held) in enumerate(groups):
                letter = chr(ord("A") + k) if k < 26 else str(k)
                sizes[letter] = held
                assigned += [(lo, hi, letter) for lo, hi in spans]
            rows.append(ReplicaRow(f.step, name, f.severity, RankLetters(assigned), sizes))
    everyone = merge_spans([(lo, hi) for row in rows for lo, hi, _ in row.cells.spans]
                           + ([(0, world_size - 1)] if world_size > 0 else []))
    count = sum(hi - lo + 1 for lo, hi in everyone)
    columns: list[tuple[str, Spans]]
    if count <= many:
        columns = [(str(r), ((r, r),)) for lo, hi in everyone for r in range(lo, hi + 1)]
    else:  # ranks alike in every row share a column, labelled by rank ranges
        columns = [(format_spans(spans), spans) for spans in _alike(rows, everyone)]
    return ReplicaMatrix(rows, columns, world_size or count)


def _resolve(assigned: Sequence[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Overlapping (lo, hi, letter) spans as disjoint sorted ones, the later span winning
    where they overlap: a sweep over their ends with a heap of the open ones (n log n)."""
    ordered = sorted(x for x in assigned if x[0] <= x[1])
    if all(a[1] < b[0] for a, b in pairwise(ordered)):
        return ordered  # disjoint already (what the replica check writes)
    cuts = sorted({x for lo, hi, _ in assigned if lo <= hi for x in (lo, hi + 1)})
    order = sorted((lo, k) for k, (lo, hi, _) in enumerate(assigned) if lo <= hi)
    open_: list[tuple[int, int]] = []  # (-k, hi): the latest open span on top
    out: list[tuple[int, int, str]] = []
    j = 0
    for a, b in pairwise(cuts):
        while j < len(order) and order[j][0] <= a:
            k = order[j][1]
            heapq.heappush(open_, (-k, assigned[k][1]))
            j += 1
        while open_ and open_[0][1] < a:
            heapq.heappop(open_)
        if not open_:
            continue
        letter = assigned[-open_[0][0]][2]
        if out and out[-1][1] == a - 1 and out[-1][2] == letter:
            out[-1] = (out[-1][0], b - 1, letter)
        else:
            out.append((a, b - 1, letter))
    return out


def _alike(rows: Sequence[ReplicaRow], everyone: Sequence[tuple[int, int]]) -> list[Spans]:
    """The ranks of `everyone` grouped by their letters in every row, as spans: the largest
    group first, ties by lowest rank (as rank_groups.value_groups orders ranks). Pieces between
    any two span ends are refined row by row, touching only the pieces a row covers (a piece
    a row leaves blank keeps its class), within MAX_CELL_WORK."""
    cuts = sorted({x for row in rows for lo, hi, _ in row.cells.spans for x in (lo, hi + 1)}
                  | {x for lo, hi in everyone for x in (lo, hi + 1)})
    inside = RankLetters([(lo, hi, "") for lo, hi in everyone])
    pieces = [(a, b - 1) for a, b in pairwise(cuts) if a in inside]
    starts = [a for a, _ in pieces]
    classes = [0] * len(pieces)
    fresh = 1
    work = 0
    for row in rows:
        renamed: dict[tuple[int, str], int] = {}
        for lo, hi, letter in row.cells.spans:
            first, last = bisect_right(starts, lo) - 1, bisect_right(starts, hi)
            work += last - first
            if work > MAX_CELL_WORK:
                break
            for i in range(max(first, 0), last):
                key = (classes[i], letter)
                if key not in renamed:
                    renamed[key] = fresh
                    fresh += 1
                classes[i] = renamed[key]
        if work > MAX_CELL_WORK:
            break
    by_class: dict[int, list[tuple[int, int]]] = {}
    for (a, b), c in zip(pieces, classes, strict=True):
        by_class.setdefault(c, []).append((a, b))
    groups = [merge_spans(spans) for spans in by_class.values()]
    return sorted(groups, key=lambda g: (-sum(hi - lo + 1 for lo, hi in g), g[0][0]))
