"""The viewer's "who made the all-reduce wait" (extension/src/straggler.ts) gives the same rank
x bucket table and rows as Python's (ddpviz/_diagnose/straggler.py `who_waited`, `wait_rows`) on
the same simulated traces, clock offsets with known, unknown and skewed errors included; run in
node (the TypeScript transpiled with the extension's own compiler)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.bench_straggler import MS, simulate
from ddpviz._diagnose.straggler import wait_rows, who_waited
from ddpviz.traces import columns as col
from ddpviz.traces.columns import Table
from tests.extension.mirror import run_typescript

# per case: the fold and its rows, as straggler.ts computes them
OUT = "cases.map(c => { const fold = g.whoWaited(c); return { fold, rows: g.waitRows(fold) }; })"


def rank_times(tables: dict[int, Table], clock: dict[int, tuple[int, int]]
               ) -> list[dict[str, Any]]:
    out = []
    for r, t in tables.items():
        off, err = clock.get(r, (0, 0))
        rows = np.flatnonzero(t.kind == col.LAUNCHED)
        if not len(rows):
            rows = np.flatnonzero(t.kind == col.BUCKET_READY)
        ends = np.flatnonzero(t.kind == col.BACKWARD_END)
        out.append({
            "rank": r,
            "forwardSteps": t.step[t.kind == col.FORWARD].tolist(),
            "launches": [[int(s), int(b), int(x) + off] for s, b, x in
                         zip(t.step[rows], t.a[rows], t.t[rows], strict=True)],
            "ends": [[int(s), int(x) + off] for s, x in zip(t.step[ends], t.t[ends],
                                                            strict=True)],
            "error": err})
    return out


def cases() -> list[tuple[dict[int, Table], dict[int, tuple[int, int]]]]:
    out = []
    for ranks, kw, clock in [
        (2, dict(slow_rank=1, every=1), {}),
        (3, dict(every=1, jitter=0.1, spikes=0.05), {1: (5 * MS, 50_000)}),
        (20, dict(slow_rank=7, every=3, jitter=0.05), {r: (r * MS, -1) for r in range(20)}),
        (20, dict(slow_rank=7, every=1, jitter=0.1, spikes=0.05), {}),
        (8, dict(every=1, clock_skew_ns=MS), {}),
        (1, dict(every=1), {}),
    ]:
        sim = simulate(ranks, 12, buckets=5, seed=ranks, **kw)  # type: ignore[arg-type]
        # the recorded times shifted back by the offsets the clock then adds
        tables = {r: Table(t.rank, t.kind, t.step, t.t - clock.get(r, (0, 0))[0], t.seq, t.a,
                           t.b, t.s, t.objects, t.strings) for r, t in sim.tables.items()}
        out.append((tables, clock))
    return out


def test_typescript_who_waited_equals_pythons() -> None:
    data = cases()
    got = run_typescript("straggler.ts", OUT, [rank_times(t, c) for t, c in data])
    for (tables, clock), ts in zip(data, got, strict=True):
        py = who_waited(tables, clock)
        fold = ts["fold"]
        assert fold["ranks"] == list(py.ranks) and fold["buckets"] == list(py.buckets)
        assert fold["nLast"] == py.n_last.tolist()
        assert np.allclose(fold["waitNs"], py.wait_ns) if py.wait_ns.size else True
        assert (fold["steps"], fold["unsure"]) == (py.steps, py.unsure)
        assert fold["maxError"] == pytest.approx(py.max_error_ns, abs=1)
        rows = wait_rows(py)
        assert [(r["ranks"], r["nLast"]) for r in ts["rows"]] == \
            [(list(r.ranks), list(r.n_last)) for r in rows]
        assert [r["others"] for r in ts["rows"]] == [r.label.startswith("other") for r in rows]
    assert any(sum(map(sum, t["fold"]["nLast"])) for t in got)  # somebody was blamed
    assert any(len(t["rows"]) > 2 and t["rows"][-1]["others"] for t in got)  # top + others
