"""Traces with more buckets than a widget can show: the planner's bucket figure draws a bounded
part, says what it left out, and stays linear (tests/security/bombs.py's bucket bomb,
scaled down; benchmarks/bench_hostile.py measures the full one)."""

from __future__ import annotations

from ddpviz.widgets import bucket_figure
from ddpviz.widgets.bucket_figure import MAX_DRAWN_BUCKETS, MAX_DRAWN_SEGMENTS, new_figure
from ddpviz.widgets.bucket_segments import LimitMarker, Segment


def _segments(per_bucket: list[int]) -> list[Segment]:
    out, k = [], 0
    for b, n in enumerate(per_bucket):
        for j in range(n):
            out.append(Segment(b, f"b{b}", k, f"p{k}", (1,), "float32", "cpu", 1, 4, j, 4 * j))
            k += 1
    return out


def _drawn(fig: object) -> int:
    return sum(len(t.x) for t in bucket_figure.bar_traces(fig))  # type: ignore[arg-type]


def test_the_figure_draws_the_first_buckets_and_says_how_many_it_left_out() -> None:
    n = MAX_DRAWN_BUCKETS * 3
    rows = [f"b{b}" for b in range(n)]
    markers = [LimitMarker(b, f"b{b}", 8, 4) for b in range(n)]
    fig = new_figure(_segments([1] * n), markers, rows, "map")
    assert _drawn(fig) == MAX_DRAWN_BUCKETS
    assert list(fig.layout.yaxis.categoryarray) == rows[:MAX_DRAWN_BUCKETS]
    assert len(bucket_figure.limit_trace(fig).x) == MAX_DRAWN_BUCKETS
    assert f"first {MAX_DRAWN_BUCKETS:,} of {n:,} buckets drawn" in fig.layout.title.text


def test_the_figure_bounds_bars_by_whole_buckets_but_always_draws_one() -> None:
    half = MAX_DRAWN_SEGMENTS // 2
    fig = new_figure(_segments([half, half, half]), [], ["b0", "b1", "b2"], "map")
    assert _drawn(fig) == 2 * half and "first 2 of 3 buckets" in fig.layout.title.text
    fig = new_figure(_segments([MAX_DRAWN_SEGMENTS + 5]), [], ["b0"], "map")
    assert _drawn(fig) == MAX_DRAWN_SEGMENTS + 5  # one bucket is never cut in parts
    fig = new_figure(_segments([3, 4]), [], ["b0", "b1"], "map")
    assert _drawn(fig) == 7 and fig.layout.title.text == "map"
