"""Where every rank stopped, and why: the `Stop` that `Debugger.wait()` returns.

Built from each rank's `Parked` reply, in DDP's terms: the step, the safe point (before DDP's
forward, before bucket k's all-reduce, after the optimizer step) and, for a bucket, the
parameters it holds by name (from the run's ParamsBuilt and the BucketAssigned map in force).
Many ranks read as few: ranks at the same point are one group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ddpviz import markup
from ddpviz.findings import format_ranks
from ddpviz.model.rank_groups import value_groups

MAX_NAMES_SHOWN = 12  # a bucket's parameter names listed before "... and N more"


class RankStop(NamedTuple):
    """One rank's park."""

    rank: int
    step: int
    point: str  # "forward" | "bucket" | "after_backward" | "optimizer_step"
    bucket: int  # -1 unless point == "bucket"
    reason: str
    t_ns: int = 0  # the rank's monotonic clock when it parked (its Parked event)

    @property
    def where(self) -> tuple[int, str, int]:
        """The point as (step, point, bucket), equal across ranks stopped at one point."""
        return (self.step, self.point, self.bucket)

    @classmethod
    def of(cls, parked: Any) -> RankStop:
        """Read a rank's park from its event.

        Args:
            parked: a `Parked` event.

        Returns:
            The rank's RankStop.
        """
        return cls(parked.rank, parked.step, parked.point, parked.bucket, parked.reason,
                   parked.t_ns)


def describe_point(step: int, point: str, bucket: int) -> str:
    """A safe point in words: 'step 5, before bucket 1's all-reduce'."""
    if point == "bucket":
        return f"step {step}, before bucket {bucket}'s all-reduce"
    if point == "forward":
        return f"step {step}, before DDP's forward"
    if point == "after_backward":
        return f"step {step}, after the backward (every bucket all-reduced)"
    if point == "optimizer_step":
        return f"step {step}, after the optimizer step"
    return f"step {step}, at {point}"


class Stop:
    """Where every rank stopped (`ranks`: {rank: RankStop}) and the bucket's parameters.

    `agreed` is True when every rank is at the same point (what the debugger promises);
    `step`, `point`, `bucket` are then that point's, else those of the most ranks.
    `params`: the names of the parameters in the bucket the ranks stopped before (empty at
    other points, or when the run's bucket map is not known yet)."""

    def __init__(self, ranks: Mapping[int, RankStop], params: Sequence[str] = ()) -> None:
        if not ranks:
            raise ValueError("ddpviz: a Stop needs at least one parked rank")
        self.ranks = dict(sorted(ranks.items()))
        self.groups = value_groups({r: s.where for r, s in self.ranks.items()})
        self.step, self.point, self.bucket = self.groups[0].value
        self.params = tuple(params)

    @property
    def agreed(self) -> bool:
        """Whether every rank stopped at the same point."""
        return len(self.groups) == 1

    @property
    def reasons(self) -> list[tuple[str, tuple[int, ...]]]:
        """Why the ranks stopped, as (reason, ranks) pairs, the most common reason first."""
        return [(g.value, g.ranks) for g in
                value_groups({r: s.reason for r, s in self.ranks.items()})]

    @property
    def where(self) -> str:
        """The point in words, e.g. "step 5, before bucket 1's all-reduce"."""
        return describe_point(self.step, self.point, self.bucket)

    def _lines(self) -> list[str]:
        n = len(self.ranks)
        if self.agreed:
            head = f"paused at {self.where} on {'all ' if n > 1 else ''}{n} rank" \
                   f"{'s' if n != 1 else ''}"
        else:
            head = "ranks stopped at different points: " + "; ".join(
                f"{format_ranks(g.ranks)} at {describe_point(*g.value)}" for g in self.groups)
        lines = [head]
        lines.append("why: " + "; ".join(
            f"{why or 'unsaid'}" + ("" if len(self.reasons) == 1 else f" ({format_ranks(rs)})")
            for why, rs in self.reasons))
        if self.params:
            shown = ", ".join(self.params[:MAX_NAMES_SHOWN])
            more = (f" ... and {len(self.params) - MAX_NAMES_SHOWN} more"
                    if len(self.params) > MAX_NAMES_SHOWN else "")
            lines.append(f"bucket {self.bucket} holds {len(self.params)} parameter"
                         f"{'s' if len(self.params) != 1 else ''}: {shown}{more}")
        return lines

    def __repr__(self) -> str:
        return "\n".join(self._lines())

    def _repr_html_(self) -> str:
        lines = self._lines()
        color = "#1a7f37" if self.agreed else "#b42318"
        return markup.fmt("<div style='font-size:12px'><b style='color:{}'>{}</b>{}</div>",
                          color, lines[0],
                          markup.join(markup.fmt("<br>{}", line) for line in lines[1:]))


def bucket_params(params: Any, maps: Sequence[Any], step: int, bucket: int) -> tuple[str, ...]:
    """The names of bucket `bucket`'s parameters at `step`, from a rank's `ParamsBuilt` and its
    `BucketAssigned` events (in arrival order; the last one assigned at or before `step` is in
    force); () when either is unknown or the bucket is not in the map."""
    if params is None or bucket < 0:
        return ()
    in_force = None
    for m in maps:
        if m.step <= step or in_force is None:
            in_force = m
    if in_force is None or bucket >= len(in_force.buckets):
        return ()
    names = {p.index: p.name for p in params.params}
    return tuple(names.get(i, f"#{i}") for i in in_force.buckets[bucket])
