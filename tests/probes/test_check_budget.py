"""The every-step NaN check's budget (probes/check_budget.py): with a clock the test drives,
every step is checked until WARMUP, then the multiples of the least power of two that keeps
the check within SHARE of the step's median time, at most MAX_EVERY, set again every WINDOW
steps; ranks with different periods check the longest period's steps alike."""

from __future__ import annotations

from ddpviz.probes.check_budget import MAX_EVERY, SHARE, WARMUP, WINDOW, CheckBudget


class _Clock:
    def __init__(self) -> None:
        self.ns = 1

    def __call__(self) -> int:
        return self.ns


def _run(budget: CheckBudget, clock: _Clock, steps: range, step_ns: int, cost_ns: int,
         pause: dict[int, int] | None = None) -> list[int]:
    """Drive `steps`: each checked step spends cost_ns (as the output's sum and the hooks
    would); return the checked steps."""
    checked = []
    for step in steps:
        clock.ns += step_ns + (pause or {}).get(step, 0)
        if budget.due(step):
            assert budget.due(step)  # (asked again in the same step: the same answer)
            budget.spend(cost_ns // 2)
            budget.spend(cost_ns - cost_ns // 2)
            checked.append(step)
        else:
            assert not budget.due(step)
    return checked


def test_a_check_that_fits_its_share_runs_on_every_step() -> None:
    clock = _Clock()
    budget = CheckBudget(clock)
    step_ns = 50_000_000  # 50 ms steps, a 90 us check: 0.18%
    assert _run(budget, clock, range(500), step_ns, 90_000) == list(range(500))
    assert (budget.every, budget.cost_ns, budget.step_ns) == (1, 90_000, step_ns)


def test_a_check_too_costly_for_short_steps_runs_every_few_steps_after_the_warmup() -> None:
    clock = _Clock()
    budget = CheckBudget(clock)
    step_ns, cost_ns = 1_000_000, 90_000  # 1 ms steps, 90 us: 9% -> every 9th step for 1% ...
    checked = _run(budget, clock, range(WARMUP + 4 * WINDOW), step_ns, cost_ns)
    need = -(-cost_ns // int(SHARE * step_ns))
    assert need == 9 and budget.every == 16  # ... as a power of two: every 16th
    assert checked[:WARMUP] == list(range(WARMUP))  # the warmup: every step
    after = [s for s in checked if s >= WARMUP]
    assert after == list(range(WARMUP, WARMUP + 4 * WINDOW, 16))  # the multiples of 16
    # within the share, measured on what the test's clock saw
    assert len(after) * cost_ns <= SHARE * step_ns * (WARMUP + 4 * WINDOW - WARMUP) + cost_ns


def test_ranks_that_measured_different_costs_check_the_longest_periods_steps_alike() -> None:
    checked = {}
    for cost_ns in (30_000, 90_000, 500_000):  # 3%, 9%, 50% of 1 ms steps: every 4th, 16th, 32nd
        clock = _Clock()
        budget = CheckBudget(clock)
        steps = range(WARMUP + 3 * WINDOW)
        checked[budget] = {s for s in _run(budget, clock, steps, 1_000_000, cost_ns)
                           if s >= WARMUP + WINDOW}
    assert [b.every for b in checked] == [4, 16, MAX_EVERY]
    longest = checked[max(checked, key=lambda b: b.every)]
    assert longest and all(longest <= steps for steps in checked.values())


def test_the_period_is_capped_and_comes_back_when_steps_grow_long() -> None:
    clock = _Clock()
    budget = CheckBudget(clock)
    _run(budget, clock, range(WARMUP + WINDOW), 10_000, 500_000)  # 10 us steps: capped
    assert budget.every == MAX_EVERY
    start = WARMUP + WINDOW
    checked = _run(budget, clock, range(start, start + 2 * WINDOW + 1), 100_000_000, 500_000)
    assert budget.every == 1  # 100 ms steps: every step again, from the next setting on
    assert checked[-WINDOW:] == list(range(start + WINDOW + 1, start + 2 * WINDOW + 1))


def test_a_pause_between_steps_does_not_count_as_a_long_step() -> None:
    clock = _Clock()
    budget = CheckBudget(clock)
    # one checkpoint or evaluation of 10 s in the window: the median step is still 1 ms
    _run(budget, clock, range(WARMUP + 1), 1_000_000, 90_000, pause={40: 10_000_000_000})
    assert budget.every == 16 and budget.step_ns == 1_000_000


def test_steps_not_asked_in_a_row_are_not_measured_as_one() -> None:
    clock = _Clock()
    budget = CheckBudget(clock)
    # only every other step reaches the check (e.g. a second DDP's steps in between): the gaps
    # between non-consecutive steps are not steps; with too few measured, the period stays
    for step in range(0, 2 * WARMUP + 2, 2):
        clock.ns += 1_000_000
        budget.due(step)
        budget.spend(900_000)
    assert budget.every == 1 and budget.step_ns == 0
