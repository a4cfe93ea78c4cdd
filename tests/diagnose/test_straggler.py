"""Who is slow, on simulated runs (benchmarks/bench_straggler.py's simulator): a slowed rank
is named with its phase within 10 steps at 64 ranks; healthy runs, with a loaded machine's
jitter and stalls or with clock offsets off by a millisecond, name nobody; the rank x bucket
table attributes each wait to the rank that caused it. Real jobs: tests/record/test_straggler.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import ddpviz
from benchmarks.bench_straggler import MS, prefix, simulate, steps_until_named
from ddpviz._diagnose import straggler as st
from ddpviz._diagnose.diagnosis import diagnose_tables
from ddpviz.traces import columns as col


@pytest.mark.parametrize(("every", "jitter"), [(1, 0.05), (1, 0.1), (10, 0.05)])
def test_a_rank_slowed_20_percent_in_backward_is_named_within_10_recorded_steps(
        every: int, jitter: float) -> None:
    sim = simulate(64, 120 if every > 1 else 30, slow_rank=37, slow=1.2, every=every,
                   jitter=jitter, buckets=12, seed=every)
    recorded = sorted({int(s) for s in sim.tables[0].step[sim.tables[0].kind == col.LAUNCHED]})
    after = steps_until_named(sim.tables, 120 if every > 1 else 30, 37)
    assert after is not None
    # within 10 steps with bucket events (the sampled ones at every=10)
    assert sum(s < after for s in recorded) <= 10
    found = [f for f in diagnose_tables(sim.tables) if f.kind == "straggler"]
    assert [(f.ranks, f.field) for f in found] == [((37,), "backward")]
    assert found[0].severity == "warning" and "rank 37" in found[0].title


def test_a_rank_slow_in_data_loading_is_named_from_forwards_at_the_default_level() -> None:
    # every=100: per-bucket events only on steps 0-2; the forwards of every step say it.
    sim = simulate(64, 30, slow_rank=5, phase="data", slow=2.0, every=100, seed=3)
    assert steps_until_named(sim.tables, 30, 5) is not None
    (f,) = [f for f in diagnose_tables(sim.tables) if f.kind == "straggler"]
    assert f.ranks == (5,) and f.field == "data"
    assert "data loading" in f.text()


@pytest.mark.parametrize(("ranks", "within"), [(2, 30), (64, 10)])
def test_at_the_default_level_a_rank_slow_in_its_backward_is_named_from_the_marks(
        ranks: int, within: int) -> None:
    # every=100: per-bucket events on steps 0-2 only; every step's BackwardComputed (the end
    # of each rank's own backward and its first gradient) names the rank and the phase.
    slow = ranks // 3
    sim = simulate(ranks, 40, slow_rank=slow, slow=1.2, every=100, buckets=8, seed=ranks,
                   marks=True)
    after = steps_until_named(sim.tables, 40, slow)
    assert after is not None and after <= within
    (f,) = [f for f in diagnose_tables(sim.tables) if f.kind == "straggler"]
    assert f.ranks == (slow,) and f.field == "backward"
    # the simulated slowdown is spread over every bucket, as the 3 sampled steps show
    assert ("in the backward, between its first gradient (#0) and its end, spread over its "
            "buckets (the 3 sampled steps with per-bucket events)") in f.text()
    assert "per-step backward (BackwardComputed)" in f.text()
    # the same run without the marks (a trace from before them): nobody in 40 steps
    old = {r: col.Table(t.rank, *(c[keep] for c in t[1:8]), {}, t.strings)
           for r, t in sim.tables.items() for keep in [t.kind != col.COMPUTED]}
    assert st.find_straggler(st.timeline(old)) is None


@pytest.mark.parametrize(("phase", "slow", "field"), [("forward", 1.3, "to_first_grad"),
                                                       ("data", 2.0, "data")])
def test_the_marks_tell_the_forward_and_data_loading_from_the_backward(
        phase: str, slow: float, field: str) -> None:
    sim = simulate(8, 30, slow_rank=3, phase=phase, slow=slow, every=100, seed=6, marks=True)
    (f,) = [f for f in diagnose_tables(sim.tables) if f.kind == "straggler"]
    assert f.ranks == (3,) and f.field == field and f.bucket == -1
    if field == "to_first_grad":
        assert "in the forward or its backward before the first gradient (#0)" in f.text()


@pytest.mark.parametrize("ranks", [2, 3, 64])
@pytest.mark.parametrize("seed", range(4))
def test_healthy_runs_with_marks_at_the_default_level_name_nobody(ranks: int, seed: int) -> None:
    for kw in ({"jitter": 0.1, "spikes": 0.05}, {"jitter": 0.1, "spikes": 0.2},
               {"jitter": 0.02, "clock_skew_ns": 3 * MS}):
        sim = simulate(ranks, 60, every=100, seed=seed, marks=True, **kw)  # type: ignore[arg-type]
        for n in (8, 16, 32, 60):
            assert st.find_straggler(st.timeline(prefix(sim.tables, n))) is None


@pytest.mark.parametrize("every", [1, 100])
@pytest.mark.parametrize(("phase", "slow", "where"), [
    ("optimizer", 4.0, "it loses the time in the optimizer step"),
    ("data", 3.0, "it loses the time in data loading (before the forward, after the "
                  "optimizer step)"),
])
def test_the_optimizer_step_is_told_from_data_loading(phase: str, slow: float, where: str,
                                                      every: int) -> None:
    # The gap before a forward: after the backward (10%), the optimizer step (40%), data
    # loading (50%); the sampled steps record the optimizer step (every=100: steps 0-2 only,
    # and the verdict comes from the forwards).
    sim = simulate(16, 30, slow_rank=3, phase=phase, slow=slow, every=every, seed=7,
                   optimizer=True)
    (f,) = [f for f in diagnose_tables(sim.tables) if f.kind == "straggler"]
    assert f.ranks == (3,) and f.field == phase and f.bucket == -1
    assert where in f.text()
    assert f"told from data loading on the {29 if every == 1 else 3} steps" in f.text()
    lateness = next(line for line in f.detail if line.startswith("median lateness"))
    assert "in the optimizer step " in lateness and "in data loading " in lateness
    assert f.fix == ddpviz.findings.fix_for("straggler", "optimizer" if phase == "optimizer"
                                            else "data_loading")
    # Without the optimizer-step events (a trace from before them) the gap stays one phase.
    old = {r: col.Table(t.rank, *(c[keep] for c in t[1:8]), {}, t.strings)
           for r, t in sim.tables.items()
           for keep in [~np.isin(t.kind, [col.OPTIMIZER, col.OPTIMIZER_END])]}
    (f,) = [f for f in diagnose_tables(old) if f.kind == "straggler"]
    assert f.ranks == (3,) and f.field == "data"
    assert ("before the forward (data loading, or the optimizer step after the previous "
            "backward)") in f.text() and "told from data loading" not in f.text()


def test_the_gap_split_needs_the_optimizer_step_of_three_steps_on_every_rank() -> None:
    sim = simulate(4, 30, slow_rank=1, phase="optimizer", slow=4.0, every=100, seed=2,
                   optimizer=True)
    tl = st.timeline(sim.tables)
    k = int(np.flatnonzero(tl.ranks == 1)[0])
    parts, n = st._gap_split(tl, k)
    assert n == 3 and [p for p, _ in parts] == ["after_backward", "optimizer", "data"]
    assert max(parts, key=lambda pv: pv[1])[0] == "optimizer"
    # one rank without them (an old ddpviz on it): no split
    t = sim.tables[0]
    keep = t.kind != col.OPTIMIZER
    tables = {**sim.tables, 0: col.Table(0, *(c[keep] for c in t[1:8]), {}, t.strings)}
    assert st._gap_split(st.timeline(tables), k) == ((), 0)


@pytest.mark.parametrize("seed", range(3))
def test_healthy_runs_with_the_optimizer_step_recorded_name_nobody(seed: int) -> None:
    sim = simulate(8, 60, jitter=0.1, spikes=0.05, every=1, seed=seed, optimizer=True)
    assert st.find_straggler(st.timeline(sim.tables)) is None


def test_a_rank_slow_in_forward_is_named_with_its_phase() -> None:
    sim = simulate(16, 20, slow_rank=2, phase="forward", slow=1.3, every=1, seed=4)
    (f,) = [f for f in diagnose_tables(sim.tables) if f.kind == "straggler"]
    assert f.ranks == (2,) and f.field == "forward" and f.bucket == -1


@pytest.mark.parametrize("ranks", [2, 3, 64])
@pytest.mark.parametrize("seed", range(4))
def test_healthy_runs_under_load_name_nobody(ranks: int, seed: int) -> None:
    sim = simulate(ranks, 60, jitter=0.1, spikes=0.05, every=1, seed=seed)
    assert st.find_straggler(st.timeline(sim.tables)) is None
    # ... after any number of steps
    for n in (4, 8, 16, 32):
        assert st.find_straggler(st.timeline(prefix(sim.tables, n))) is None


def test_clock_offsets_off_by_a_millisecond_name_nobody() -> None:
    # A rank whose clock is off looks persistently late; its end of backward (which every
    # rank leaves together) is off by as much, which widens the uncertainty past it.
    sim = simulate(8, 40, every=1, jitter=0.02, clock_skew_ns=3 * MS, seed=1)
    tl = st.timeline(sim.tables)
    assert st.find_straggler(tl) is None
    assert tl.error_ns.max() > MS


def test_the_stated_clock_uncertainty_keeps_a_small_lateness_unnamed() -> None:
    sim = simulate(4, 40, slow_rank=1, slow=1.2, every=1, jitter=0.02, seed=2)
    assert st.find_straggler(st.timeline(sim.tables)) is not None
    # the same run, its offsets known only from wall clocks (error unknown: 10 ms assumed)
    assert st.find_straggler(st.timeline(sim.tables, {r: (0, -1) for r in range(4)})) is None
    # measured offsets of +-100 us do not hide it
    assert st.find_straggler(st.timeline(sim.tables, {r: (0, 100_000) for r in range(4)}))


def test_the_rank_by_bucket_table_names_who_made_each_bucket_wait() -> None:
    sim = simulate(8, 20, slow_rank=6, slow=1.3, every=1, jitter=0.02, buckets=5, seed=5)
    table = st.who_waited(sim.tables)
    assert table.ranks == tuple(range(8)) and table.buckets == tuple(range(5))
    assert table.steps == 20
    # rank 6 made (nearly) every bucket wait, in (nearly) every step; the waits are positive
    assert table.n_last[6].sum() >= 0.8 * 20 * 5
    assert table.n_last.sum() + table.unsure <= 20 * 5
    assert (table.wait_ns[table.n_last == 0] == 0).all() and (table.wait_ns[6] > 0).all()
    # against the launch times: the wait is the last launch minus the one before it
    tl = st.timeline(sim.tables)
    w = st.bucket_waits(tl)
    launches = tl.launch[:, 3, 2]
    top2 = np.sort(launches)[-2:]
    assert w.last[3, 2] in (-1, int(np.argmax(launches)))
    if w.last[3, 2] >= 0:
        assert w.wait_ns[3, 2] == pytest.approx(top2[1] - top2[0])


def test_diagnose_reads_the_clock_of_a_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sim = simulate(4, 30, slow_rank=3, slow=1.2, every=1, jitter=0.02, seed=6)
    trace = ddpviz.Trace([e for t in sim.tables.values() for e in t.events()])
    assert [f.ranks for f in ddpviz.diagnose(trace) if f.kind == "straggler"] == [(3,)]
    for r in range(4):
        trace.set_clock(r, 0, -1)  # wall clocks only: 10 ms assumed, more than it is late
    path = trace.save(tmp_path / "t.ddpviz")
    assert [f for f in ddpviz.diagnose(path) if f.kind == "straggler"] == []


def test_ddpviz_diagnose_and_the_report_print_the_finding(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from ddpviz.cli import main
    from ddpviz.report.html import render

    sim = simulate(4, 30, slow_rank=2, slow=1.2, every=1, jitter=0.02, seed=7)
    trace = ddpviz.Trace([e for t in sim.tables.values() for e in t.events()])
    path = trace.save(tmp_path / "slow.ddpviz")
    main(["diagnose", str(path)])
    out = capsys.readouterr().out
    assert "rank 2 is the straggler" in out and "clock offsets exact" in out
    assert "rank 2 is the straggler" in render(trace)


def _accumulating(drift_ms: float, late_ms: float, steps: int = 120, accum: int = 4
                  ) -> st.Timeline:
    """2 ranks accumulating over `accum` micro-steps (no_sync on all but the last, whose
    backward all-reduces and is marked): rank 1 drifts `drift_ms` behind per micro-step and
    arrives `late_ms` late at the forward after each synced step."""
    nan = np.full((2, steps), np.nan)
    s = np.arange(steps)
    t = s * 10 * MS
    micro = s % accum
    forward = np.stack([t, t + drift_ms * MS * micro + late_ms * MS * (micro == 0)])
    computed = np.where((micro == accum - 1)[None], forward + 8 * MS, np.nan)
    return st.Timeline(np.array([0, 1]), s, forward, nan, nan, nan, nan, np.array([], int),
                       np.array([], int), np.full((2, 0, 0), np.nan), np.zeros(2), np.zeros(2),
                       0, computed, computed - 6 * MS, 0)


def test_only_forwards_after_a_synced_step_count_as_meeting_points() -> None:
    # a rank late at the forwards after synced steps (where the ranks met) is named from them
    tl = _accumulating(drift_ms=0.0, late_ms=3.0)
    got = st.find_straggler(tl)
    assert got is not None and got.rank == 1 and got.evidence == "forward"
    assert got.steps == 29  # the forward after each synced step (steps 4, 8 ... 116), not 120
    aligned = st._aligned_forwards(tl)
    assert np.isnan(aligned[:, tl.steps % 4 != 0]).all()
    assert not np.isnan(aligned[:, 4::4]).any()


def test_a_rank_that_only_leaves_the_all_reduce_later_is_not_named() -> None:
    # See [Note: lateness it did not add]: rank 1 leaves every all-reduce 10 ms after rank 0
    # (a busy host) and stays that much later at every forward and end of backward, with
    # every phase of its own as long as rank 0's; at steps 1 and 2 rank 0 leaves later (as
    # measured, which keeps the ends' skew over the sampled steps 0-2 and 100 near 0). The
    # sampled steps' optimizer step and all-reduce ends show that the lateness is there when
    # the all-reduce ends.
    every = 100
    sim = simulate(2, 120, every=every, seed=3, optimizer=True, marks=True, exit_lag_rank=1,
                   exit_lag_ms=10.0, exit_lag_swapped=(1, 2))
    tl = st.timeline(sim.tables)
    late = st._last_rank(tl)  # persistently last: the verdict's first tests pass
    assert late is not None and late.rank == 1 and late.split_steps >= 3
    assert st._own_ns(late) < late.threshold_ns
    assert st.find_straggler(tl) is None
    assert [f for f in diagnose_tables(sim.tables) if f.kind == "straggler"] == []
    # the same 10 ms added in rank 1's own data loading is named, as data loading
    slow = simulate(2, 120, every=every, seed=3, optimizer=True, marks=True, slow_rank=1,
                    phase="data", slow=1 + 10.0 / 7.5)
    (f,) = [f for f in diagnose_tables(slow.tables) if f.kind == "straggler"]
    assert f.ranks == (1,) and f.field == "data"


def test_every_steps_exit_from_the_all_reduce_keeps_a_lagging_rank_unnamed() -> None:
    # the same lag at the default (every=100) with no optimizer events (a custom loop, or
    # too few sampled steps to split the gap): only the marks' exit from the last all-reduce,
    # on every step, show that rank 1 was already late there. Without it (older traces) the
    # lag reads as slow data loading, the false warning a loaded CI host once produced.
    kw = dict(every=100, seed=3, marks=True, exit_lag_rank=1, exit_lag_ms=10.0,
              exit_lag_swapped=(1, 2))
    old = st.find_straggler(st.timeline(simulate(2, 120, **kw).tables))  # type: ignore[arg-type]
    assert old is not None and old.rank == 1 and old.phase == "data" and not old.left_steps
    tl = st.timeline(simulate(2, 120, left=True, **kw).tables)  # type: ignore[arg-type]
    # (the steady skew at the exits widens the clock uncertainty: it is not even last by more)
    assert tl.error_ns[1] > 4 * MS and st._last_rank(tl) is None
    assert st.find_straggler(tl) is None
    # a rank slow for real in its data loading, forward or backward is still named, and where
    for phase, field in (("data", "data"), ("forward", "to_first_grad"),
                         ("backward", "backward")):
        slow = simulate(2, 120, every=100, seed=3, marks=True, left=True, slow_rank=1,
                        phase=phase, slow=1.5)
        got = st.find_straggler(st.timeline(slow.tables))
        assert got is not None and got.rank == 1 and got.phase == field, (phase, got)
        assert got.left_steps >= 100


def test_steps_after_the_first_nonfinite_value_are_not_read() -> None:
    # rank 1 slow in its backward from step 5 on (as ddpviz's precise checks after a NaN
    # there would make it): named from the run, not from the steps before the NaN
    sim = simulate(2, 60, every=1, seed=5, marks=True)
    slow = simulate(2, 60, every=1, seed=5, marks=True, slow_rank=1, slow=1.5)
    tables = {r: _joined(sim.tables[r], slow.tables[r], 5) for r in sim.tables}
    assert [f.ranks for f in st.straggler_findings(tables)] == [(1,)]
    assert st.straggler_findings(tables, nonfinite_step=5) == []
    (f,) = st.straggler_findings(tables, nonfinite_step=50)  # 45 slow steps still read
    assert "steps from 50 on, after the first non-finite value, not counted" in f.text()
    assert "of 50 recorded steps" in f.title


def _joined(a: col.Table, b: col.Table, step: int) -> col.Table:
    """a's rows before `step`, then b's from `step` on, b's times shifted to follow a's."""
    keep_a, keep_b = a.step < step, b.step >= step
    shift = int(a.t[keep_a].max()) - int(b.t[b.step < step].max())
    cols = [np.concatenate([ca[keep_a], cb[keep_b] + (shift if name == "t" else 0)])
            for name, ca, cb in zip(("kind", "step", "t", "seq", "a", "b", "s"), a[1:8], b[1:8],
                                    strict=True)]
    return col.Table(a.rank, *cols, {}, a.strings)


@pytest.mark.parametrize(("cpu_share", "severity", "field"), [(0.9, "info", "cpu_wait"),
                                                             (0.1, "warning", "backward"),
                                                             (None, "warning", "backward")])
def test_a_straggler_that_waits_for_a_cpu_is_said_to_be_the_hosts_load(
        cpu_share: float | None, severity: str, field: str) -> None:
    # A rank 20% slower in its backward (marks on every step); its main thread's run-queue
    # delay grows by `cpu_share` of its lateness a step (the other ranks' by a little noise),
    # or is not recorded (None: the guard, old traces)
    sim = simulate(2, 40, slow_rank=1, slow=1.2, every=100, buckets=8, seed=3, marks=True)
    tl = st.timeline(sim.tables)
    if cpu_share is not None:
        rng = np.random.default_rng(0)
        late = 0.2 * 0.45 * 100 * MS  # the simulated step's backward share, 20% of it
        per_step = np.stack([rng.uniform(0, 0.05 * MS, tl.steps.size),
                             cpu_share * late + rng.uniform(0, 0.05 * MS, tl.steps.size)])
        tl = tl._replace(cpu_wait=np.cumsum(per_step, axis=1))
    (f,) = st.straggler_findings(sim.tables, timeline_=tl)
    assert f.ranks == (1,) and f.severity == severity and f.field == field, f.text()
    if cpu_share is None:
        assert "CPU" not in f.title and "run-queue" not in f.text()
    elif severity == "info":
        assert f.title.startswith("rank 1 is slower because it waits for a CPU")
        assert "at least half of its lateness" in f.text() and "OMP_NUM_THREADS" in f.text()
    else:
        assert "less than half of its lateness" in f.text()
        assert f.title.startswith("rank 1 is the straggler")


def test_no_wait_for_a_cpu_never_explains_a_straggler() -> None:
    # a straggler named with a median cost of 0 (last in fewer than half of its steps, as at
    # many ranks) and no CPU wait beyond the others': not "waits for a CPU"
    base = st.Straggler(1, 40, 12, 0.0, 3e6, 1e6, 1e4, "backward", -1, (), 39, "marks")
    assert not st.cpu_explained(base._replace(cpu_wait_ns=0.0, cpu_wait_steps=39))
    assert not st.cpu_explained(base._replace(cpu_wait_ns=-2e6, cpu_wait_steps=39))
    assert not st.cpu_explained(base)  # not known
    assert not st.cpu_explained(base._replace(cpu_wait_ns=0.4e6, cpu_wait_steps=39))
    assert st.cpu_explained(base._replace(cpu_wait_ns=0.6e6, cpu_wait_steps=39))
