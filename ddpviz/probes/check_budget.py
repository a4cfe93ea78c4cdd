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
# and checks the steps that are multiples of `every`: the least power of two that keeps the
# check within SHARE of the step (every step when it fits, as on any step of tens of
# milliseconds), at most MAX_EVERY. Powers of two on the step number, so that ranks which
# measured different costs still check common steps: the steps of the longest period are
# checked by every rank (periods 8 and 16: every 16th step on both), and a NaN on such a step
# is judged with every rank's local gradients.
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
MAX_EVERY = 32  # the longest period (a power of two): a NaN's origin seen at 1 in 32 steps
# at the worst. WARMUP and WINDOW are multiples of it: every period checks the step a new
# period starts at.


class CheckBudget:
    """The every-step check's period on this rank, from its measured cost and the step's time.

    `due(step)` (once or more a step, first on the training thread's forward): whether `step`
    is checked (a multiple of `every`); `spend(ns)`: what a check just took. `every`,
    `cost_ns` and `step_ns` are the last setting's period and measurements (0: not measured
    yet)."""

    __slots__ = ("_checked", "_clock", "_gaps", "_on_set", "_set_at", "_spent", "_t", "answer",
                 "asked", "cost_ns", "every", "step_ns")

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns,
                 on_set: Callable[[CheckBudget], None] | None = None) -> None:
        """`on_set(budget)`: called when the period was set from a window's measurements (so
        the period is told before the first step it skips, not only with a checked step)."""
        self._clock = clock
        self._on_set = on_set
        self.every = 1  # checked: the steps that are multiples of it
        self.cost_ns = 0
        self.step_ns = 0
        self.asked = -1  # the last step `due` was asked about, and its `answer` (a hook on the
        self.answer = True  # hot path reads them instead of calling `due` again)
        self._t = 0  # when `asked` was first asked about
        self._gaps: list[int] = []  # ns between consecutive steps, this window
        self._spent = 0  # ns the checks took, this window
        self._checked = 0  # steps checked, this window
        self._set_at = WARMUP

    def due(self, step: int) -> bool:
        asked = self.asked
        if step == asked:
            return self.answer
        now = self._clock()
        if step == asked + 1 and self._t:
            self._gaps.append(now - self._t)
        self.asked, self._t = step, now
        if step >= self._set_at:
            self._set(step)
        if step % self.every:  # (the usual step: fewest operations, See [Note: the plain
            self.answer = False  # wrapper's calls] in _watch/base.py)
            return False
        self.answer = True
        self._checked += 1
        return True

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
        need = math.ceil(cost / (SHARE * step_ns)) if step_ns > 0 else MAX_EVERY
        self.every = min(MAX_EVERY, 1 << max(0, need - 1).bit_length())  # (a power of two)
        if self._on_set is not None:
            self._on_set(self)
