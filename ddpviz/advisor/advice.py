"""`Advice`: the advisor's answer, as a table, records, a sentence and a figure."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpviz.advisor.candidates import Candidate
from ddpviz.advisor.costmodel import CostModel
from ddpviz.advisor.replay import Prediction
from ddpviz.plan import BucketPlan, PlannedBucket

if TYPE_CHECKING:
    from ddpviz.widgets.advice_view import AdviceView

# A candidate must beat the current setting by this much to be recommended over it.
MIN_GAIN = 0.01


@dataclass(frozen=True)
class Row:
    """One candidate's prediction."""

    candidate: Candidate
    plan: BucketPlan  # the planner's plan for the candidate
    buckets: tuple[PlannedBucket, ...]  # the map in force after the rebuild
    prediction: Prediction
    current: bool  # the recorded run's own setting

    @property
    def label(self) -> str:
        return ("current: " if self.current else "") + self.candidate.label


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


@dataclass(frozen=True)
class Advice:
    """The advisor's answer for one recorded run.

    Print it for the table and the recommendation; `to_records()` for plain rows; `show()`
    for the predicted step time against the cap and the recommended bucket map.
    """

    rows: tuple[Row, ...]  # every candidate, the current setting first
    recommended: Row
    cost_model: CostModel
    world_size: int
    steps: tuple[int, ...]  # the recorded steps replayed
    measured_step_s: float  # median recorded step time (mean over ranks)
    reason: str  # the recommendation, in words
    notes: tuple[str, ...] = ()
    contention: float = 0.0  # see advise()

    @property
    def current(self) -> Row:
        """The prediction for the recorded run's own setting (the first row), what the other
        rows are compared with."""
        return self.rows[0]

    def delta_s(self, row: Row) -> float:
        """How much a candidate would change the step time against the current setting.

        Args:
            row: one of `rows`.

        Returns:
            Its predicted step time minus the current setting's, in seconds (negative when
            it would be faster).
        """
        return row.prediction.step_s - self.current.prediction.step_s

    def to_records(self) -> list[dict[str, Any]]:
        """The table as plain rows, e.g. for a DataFrame.

        Returns:
            One JSON-ready dict per candidate, the current setting first, with "candidate" (its
            label), "family", "bucket_cap_mb", "bucket_cap_mb_list", "set_last_bucket_cap",
            "setting" (how to write it in code), "buckets" and "bucket_bytes" (the map after
            the rebuild), "predicted_exposed_comm_ms", "predicted_step_ms",
            "delta_vs_current_ms", "current" and "recommended" (booleans).
        """
        out = []
        for r in self.rows:
            c = r.candidate
            out.append({
                "candidate": r.label, "family": "current" if r.current else c.family,
                "bucket_cap_mb": c.bucket_cap_mb,
                "bucket_cap_mb_list": list(c.bucket_cap_mb_list) if c.bucket_cap_mb_list
                else None,
                "set_last_bucket_cap": c.set_last_bucket_cap, "setting": c.setting(),
                "buckets": len(r.buckets),
                "bucket_bytes": [b.nbytes for b in r.buckets],
                "predicted_exposed_comm_ms": r.prediction.exposed_s * 1e3,
                "predicted_step_ms": r.prediction.step_s * 1e3,
                "delta_vs_current_ms": self.delta_s(r) * 1e3,
                "current": r.current, "recommended": r is self.recommended,
            })
        return out

    def to_json(self) -> str:
        """The advice as one JSON document.

        Returns:
            JSON text of an object with "world_size", "steps", "measured_step_ms",
            "contention", "recommendation" (the sentence), "recommended" (its label),
            "cost_model" (latency and bandwidth per dtype), "cost_model_source", "notes" and
            "candidates" (the rows of `to_records()`).
        """
        return json.dumps({
            "world_size": self.world_size, "steps": list(self.steps),
            "measured_step_ms": self.measured_step_s * 1e3, "contention": self.contention,
            "recommendation": self.reason,
            "recommended": self.recommended.label,
            "cost_model": {d: {"latency_us": ln.latency_s * 1e6,
                               "bandwidth_bytes_per_s": ln.bandwidth
                               if ln.seconds_per_byte > 0 else None}
                           for d, ln in self.cost_model.lines.items()},
            "cost_model_source": self.cost_model.source,
            "notes": list(self.notes) + list(self.cost_model.notes),
            "candidates": self.to_records(),
        }, indent=1)

    def __str__(self) -> str:
        w = max(len(r.label) for r in self.rows) + 2
        head = (f"{'candidate':{w}}{'buckets':>8}{'exposed comm ms':>17}{'step ms':>10}"
                f"{'delta ms':>10}{'delta':>8}")
        lines = [f"bucket advice: {self.world_size} ranks, steps {_steps(self.steps)}, measured "
                 f"step {_ms(self.measured_step_s)} ms, contention "
                 f"{self.contention:g}", head, "-" * len(head)]
        base = self.current.prediction.step_s
        for r in self.rows:
            d = self.delta_s(r)
            mark = "  <- recommended" if r is self.recommended else ""
            lines.append(f"{r.label:{w}}{len(r.buckets):>8}{_ms(r.prediction.exposed_s):>17}"
                         f"{_ms(r.prediction.step_s):>10}{d * 1e3:>+10.2f}"
                         f"{(d / base if base else 0):>+8.1%}{mark}")
        lines += ["", self.reason, "", str(self.cost_model)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def show(self) -> AdviceView:
        """The predicted step time against the cap (current marked) and the recommended
        bucket map below (needs ipywidgets and plotly).

        Returns:
            The widget (display it as a notebook cell's last value).
        """
        from ddpviz.widgets.advice_view import AdviceView

        return AdviceView(self)


def _steps(steps: tuple[int, ...]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def explain(rows: tuple[Row, ...], model: CostModel) -> tuple[Row, str]:
    """The recommended row and why, in one or two sentences."""
    current = rows[0]
    fastest = min(r.prediction.step_s for r in rows)
    # among candidates as fast (within 0.1%; often settings that build the same map): the
    # current one, else the fewest buckets, a plain cap before a list, the cap nearest torch's
    near = [r for r in rows if r.prediction.step_s <= fastest * 1.001]
    best = current if current in near else min(near, key=lambda r: (
        len(r.buckets), r.candidate.bucket_cap_mb_list is not None,
        abs(math.log(max(r.candidate.cap_mb, 1e-9) / 25.0))))
    cur_p = current.prediction
    gain = cur_p.step_s - best.prediction.step_s
    last = current.buckets[-1] if current.buckets else None
    exposed_now = (f"Now the last bucket's all-reduce (bucket {len(current.buckets) - 1}, "
                   f"{_mib(last.nbytes)}) is exposed for {_ms(cur_p.exposed_s)} ms after the "
                   "last gradient is ready" if last is not None else "")
    if best is current or gain < MIN_GAIN * cur_p.step_s:
        other = min(rows[1:], key=lambda r: r.prediction.step_s, default=current)
        text = (f"Keep the current setting ({current.candidate.setting()}): no candidate is "
                f"predicted more than {MIN_GAIN:.0%} faster (best other: {other.label}, "
                f"{_ms(other.prediction.step_s)} ms vs {_ms(cur_p.step_s)} ms).")
        if exposed_now:
            text += f" {exposed_now}."
        return current, text
    b = best.prediction
    text = (f"Use {best.candidate.setting()}: predicted step {_ms(b.step_s)} ms vs "
            f"{_ms(cur_p.step_s)} ms now ({-gain / cur_p.step_s:+.1%}), {len(best.buckets)} "
            f"buckets instead of {len(current.buckets)}.")
    earlier = cur_p.last_start_after_ready_s - b.last_start_after_ready_s
    if cur_p.exposed_s > b.exposed_s and exposed_now:
        if abs(earlier) >= 5e-5:
            text += (f" {exposed_now}; with {best.candidate.label} the last all-reduce starts "
                     f"{_ms(abs(earlier))} ms {'earlier' if earlier >= 0 else 'later'} and "
                     f"{_ms(b.exposed_s)} ms stay exposed.")
        else:
            text += (f" {exposed_now}; with {best.candidate.label} the earlier buckets are "
                     "reduced while the backward still runs and only the last bucket's "
                     f"{_ms(b.exposed_s)} ms stay exposed.")
    elif len(best.buckets) < len(current.buckets):
        lat = min((ln.latency_s for ln in model.lines.values()), default=0.0)
        text += (f" Fewer all-reduces: each costs about {lat * 1e6:.0f} us of latency "
                 "before any byte moves.")
    return best, text
