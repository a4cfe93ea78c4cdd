"""Who made the all-reduce wait (ddpviz/_diagnose/straggler.py, the data of the dashboard's
rank x bucket table and its straggler verdict): one row per rank up to 16 ranks, above them the
ranks that caused most wait and one row for the others, live as the steps arrive. (Moved from
tests/widgets/test_wait_table.py when the kernel-drawn WaitTable gave way to the TS front end,
extension/src/straggler.ts: issue #40.)"""

from __future__ import annotations

import ddpviz
from benchmarks.bench_straggler import simulate
from ddpviz._diagnose.straggler import (
    WaitFold,
    bucket_waits,
    fold,
    straggler_findings,
    timeline,
    wait_rows,
    who_waited,
)
from ddpviz.findings import Finding


def _trace(ranks: int, slow_rank: int) -> ddpviz.Trace:
    sim = simulate(ranks, 12, slow_rank=slow_rank, slow=1.3, every=1, jitter=0.02,
                   buckets=4, seed=9)
    return ddpviz.Trace([e for t in sim.tables.values() for e in t.events()])


def waits(trace: ddpviz.Trace) -> tuple[WaitFold, list[Finding]]:
    """The table and the straggler verdict over it, from one timeline of the trace."""
    tables, clock = trace.columns(), dict(trace.clock)
    tl = timeline(tables, clock)
    return fold(bucket_waits(tl)), straggler_findings(tables, clock, timeline_=tl)


def test_the_table_shows_who_made_each_bucket_wait() -> None:
    trace = _trace(4, 2)
    table, straggler = waits(trace)
    assert table.ranks == (0, 1, 2, 3) and table.steps == 12
    assert table.buckets == (0, 1, 2, 3)
    assert int(table.n_last[2].sum()) == int(table.n_last.sum()) > 0  # only rank 2 was last
    rows = wait_rows(table)
    assert [r.ranks for r in rows] == [(0,), (1,), (2,), (3,)]  # a row per rank
    # the verdict above it: the straggler finding diagnose() gives
    assert [f.ranks for f in straggler] == [(2,)]
    assert "rank 2 is the straggler" in straggler[0].title
    assert [f.title for f in straggler] == [
        f.title for f in ddpviz.diagnose(trace) if f.kind == "straggler"]


def test_a_healthy_run_has_no_straggler() -> None:
    sim = simulate(4, 12, every=1, jitter=0.1, spikes=0.05, buckets=3, seed=2)
    _, straggler = waits(ddpviz.Trace([e for t in sim.tables.values() for e in t.events()]))
    assert straggler == []


def test_above_16_ranks_the_top_ranks_get_a_row_and_the_rest_share_one() -> None:
    trace = _trace(64, 40)
    rows = wait_rows(who_waited(trace.columns(), trace.clock))
    assert rows[-1].label.startswith("other ranks") and len(rows[-1].ranks) >= 64 - 8
    assert any(r.ranks == (40,) for r in rows[:-1]) and len(rows) <= 9
    assert sum(len(r.ranks) for r in rows) == 64
    by_rank = {r.ranks: sum(r.wait_ns) for r in rows}
    assert by_rank[(40,)] == max(by_rank.values())


def test_live_from_a_session_the_verdict_comes_as_the_steps_arrive() -> None:
    from ddpviz.transport import Sender
    from tests.polling import eventually

    sim = simulate(3, 16, slow_rank=1, slow=1.3, every=1, jitter=0.02, buckets=3, seed=11)
    per_rank = {r: t.events() for r, t in sim.tables.items()}
    with ddpviz.listen(show=False) as session:
        senders = {r: Sender(session.connect_string, r, batch=16) for r in per_rank}
        half = {r: [e for e in evs if e.step < 4] for r, evs in per_rank.items()}
        for r, s in senders.items():
            for e in half[r]:
                s(e)
            s.flush()
        assert eventually(lambda: len(session.trace) >= sum(map(len, half.values())))
        table, straggler = waits(session.trace)
        assert straggler == []  # 4 steps: too few to name anybody
        assert table.steps == 4
        for r, s in senders.items():
            for e in per_rank[r][len(half[r]):]:
                s(e)
            s.close()
        assert session.wait(ranks=3, timeout=30)
        assert eventually(lambda: len(session.trace) >= sim.events)
        table, straggler = waits(session.trace)
        assert [f.ranks for f in straggler] == [(1,)]
        assert "rank 1 is the straggler" in straggler[0].title
