"""What the hook-less default's every-step NaN check may cost: a share of the job's own step,
measured on the rank. See [Note: the check's budget].
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

# [Note: the check's budget]
# The every-step NaN check (nonfinite_buckets.py) is a few torch ops a step: 10-20 us each of
# CPU on a ~1 ms CPU step (cold caches), tens of us in all. On steps of tens of milliseconds,
# or a GPU step that is not launch-bound, that is nothing; on a ~1 ms step it is 8-9% of the
# step (docs/nonfinite.md), over the default's 1.03 budget. So the rank measures both:
#   - the step: the time between consecutive forwards (one clock read a step), its median over
#     the window (a pause for evaluation or a checkpoint does not count);
#   - the check: the clock around its own work (the output's sum, the bucket hooks' sums), its
#     mean per checked step over the window;
# and checks every `every`-th step, the least period that keeps the check within SHARE of the
# step (every step when it fits, as on any step of tens of milliseconds), at most MAX_EVERY.
# Every step is checked up to WARMUP (the first steps' NaNs: a bad initialisation, learning
# rate or batch; and their times are not the job's usual ones: the bucket rebuild, the
# allocator's first calls); then the period is set again every WINDOW steps from that window's
# measurements. A step the period skips is not claimed as checked: a NaN that begins there is
# seen at the next checked step, when the all-reduce has spread it, and the finding says which
# steps were not checked, why, and on which rank (nonfinite.py's texts). Precise mode (every
# step, every gradient, after something went non-finite) is not thinned.

SHARE = 0.01  # of the step's time, at most, for the every-step check
WARMUP = 64  # steps checked on every step before the period is first set
WINDOW = 64  # steps between settings of the period
MAX_EVERY = 25  # the longest period: a NaN's origin seen at 1 in 25 steps at the worst


class CheckBudget:
    """The every-step check's period on this rank, from its measured cost and the step's time.

    `due(step)` (once or more a step, first on the training thread's forward): whether `step`
    is checked; `spend(ns)`: what a check just took. `every`, `cost_ns` and `step_ns` are the
    last setting's period and measurements (0: not measured yet)."""

    __slots__ = ("_checked", "_clock", "_due", "_gaps", "_next", "_set_at", "_spent", "_step",
                 "_t", "cost_ns", "every", "step_ns")

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock
        self.every = 1  # (also the period `_next` was set with: it changes only in _set)
        self.cost_ns = 0
        self.step_ns = 0
        self._next = 0  # the next step checked
        self._step = -1
        self._due = True
        self._t = 0  # when `_step` was first asked about
        self._gaps: list[int] = []  # ns between consecutive steps, this window
        self._spent = 0  # ns the checks took, this window
        self._checked = 0  # steps checked, this window
        self._set_at = WARMUP

    def due(self, step: int) -> bool:
        if step == self._step:
            return self._due
        now = self._clock()
        if step == self._step + 1 and self._t:
            self._gaps.append(now - self._t)
        self._step, self._t = step, now
        if step >= self._set_at:
            self._set(step)
        due = self._due = step >= self._next
        if due:
            self._next = step + self.every
            self._checked += 1
        return due

    def spend(self, ns: int) -> None:
        self._spent += ns

    def _set(self, step: int) -> None:
        self._set_at = step + WINDOW
        gaps, checked, spent = self._gaps, self._checked, self._spent
        self._gaps, self._checked, self._spent = [], 0, 0
        if len(gaps) < 8 or not checked:  # (too few to say: keep the period)
            return
        gaps.sort()
        self.step_ns = step_ns = gaps[len(gaps) // 2]
        self.cost_ns = cost = spent // checked
        every = math.ceil(cost / (SHARE * step_ns)) if step_ns > 0 else MAX_EVERY
        every = min(MAX_EVERY, max(1, every))
        # the next check as if the last one had been set with the new period (never later)
        self._next = min(self._next, max(step, self._next - self.every + every))
        self.every = every
