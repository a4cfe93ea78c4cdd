"""Many ranks read as few: value groups, rank-range labels, percentiles, the slowest ranks.

At 256 ranks a column or lane per rank is unreadable; the widgets collapse ranks that share a
value into one group labelled with its rank ranges ("0-127, 129-255"), summarise numbers as
min/p10/p50/p90/max, and name the ranks furthest from the median. Pure functions, no widgets
(the viewer has the same in extension/src/rankGroups.ts).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Generic, NamedTuple, TypeVar

from ddpviz.findings import format_ranges

V = TypeVar("V", bound=Hashable)

# Above this many ranks the views show groups and distributions instead of one lane per rank.
MANY_RANKS = 16


def rank_label(ranks: Iterable[int]) -> str:
    """Sorted ranks as ranges: (0, 1, 2, 3, 5, 7, 8) -> '0-3, 5, 7, 8'; runs of 3 or more
    become 'a-b'; '' for no rank."""
    return format_ranges(set(ranks))


class ValueGroup(NamedTuple, Generic[V]):
    """Ranks that share one value."""

    value: V
    ranks: tuple[int, ...]  # sorted

    @property
    def label(self) -> str:
        return rank_label(self.ranks)


def value_groups(values: Mapping[int, V]) -> list[ValueGroup[V]]:
    """{rank: value} -> groups of ranks with equal values, the largest group first (ties: the
    group holding the lowest rank first)."""
    by_value: dict[V, list[int]] = {}
    for r in sorted(values):
        by_value.setdefault(values[r], []).append(r)
    groups = [ValueGroup(v, tuple(rs)) for v, rs in by_value.items()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks[0]))


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of already sorted values, interpolating linearly between
    closest ranks (numpy's default). `ordered` must not be empty."""
    if not ordered:
        raise ValueError("ddpviz: percentile of no values; pass at least one value")
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Spread(NamedTuple):
    """A number across ranks."""

    n: int  # ranks with a value
    min: float
    p10: float
    p50: float
    p90: float
    max: float


def spread(values: Iterable[float]) -> Spread | None:
    """min, p10, median, p90, max of `values`; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return Spread(len(ordered), ordered[0], percentile(ordered, 10), percentile(ordered, 50),
                  percentile(ordered, 90), ordered[-1])


def slowest(values: Mapping[int, float], k: int = 5) -> list[tuple[int, float]]:
    """The k ranks with the largest values, largest first (ties: lowest rank first), with
    their values."""
    return sorted(values.items(), key=lambda rv: (-rv[1], rv[0]))[:k]
