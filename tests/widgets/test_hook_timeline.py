"""HookTimeline: hook firing order per rank with departures highlighted, all-reduce spans with
their exposed part, unused parameters, decimation at scale and the live bytes budget, all
checked against the events that produced them."""

from __future__ import annotations

import html
import re

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import analyse, order_diff
from ddpviz.widgets import HookTimeline, timeline_svg
from ddpviz.widgets.replay_controls import Cursor
from tests.widgets.streams import Plant, synthetic_run


def test_a_swapped_hook_order_on_one_rank_is_highlighted_at_those_positions() -> None:
    events = synthetic_run(3, 8, 3, plant=Plant(swap={2: (1, 2, 5)}))
    t = HookTimeline(events)
    assert t.controls is not None
    t.controls.show_step(1)
    assert t.step == 1 and t.view is not None
    order = t.view.order
    assert order.reference_ranks == (0, 1)
    assert order.positions == {0: (), 1: (), 2: (2, 5)}
    fired = [e.param for e in events if isinstance(e, ev.GradReady) and e.rank == 2
             and e.step == 1]
    assert t.view.lanes[2].order == tuple(fired)
    assert t.order_html.value.count("<td class=d") == 2  # exactly the two swapped positions
    assert "✘ rank 2 departs from the order of ranks 0,1 at 2 position(s); first at #2" \
        in t.order_html.value
    assert "hook(s) out of the reference order" in t.svg_html.value  # red ticks in the lane
    t.controls.show_step(2)  # the swap was planted in iteration 1 only
    assert t.view is not None and not t.view.order.differs
    assert "<td class=d" not in t.order_html.value
    assert "✔ the same hook firing order on ranks 0,1,2 (8 hooks)" in t.order_html.value


def test_exposed_communication_is_what_runs_after_the_last_hook() -> None:
    events = synthetic_run(2, 8, 2, allreduce_us=2000)
    t = HookTimeline(events)
    assert t.view is not None and t.step == 1
    for rank, lane in t.view.lanes.items():
        mine = [e for e in events if e.rank == rank and e.step == 1]
        last_hook = max(e.t_ns for e in mine if isinstance(e, ev.GradReady))
        launched = {e.bucket: e.t_ns for e in mine if isinstance(e, ev.AllReduceLaunched)}
        done = {e.bucket: e.t_ns for e in mine if isinstance(e, ev.AllReduceDone)}
        for span in lane.allreduce:
            expected = max(0, done[span.bucket] - max(launched[span.bucket], last_hook))
            assert (span.start, span.end, span.exposed_ns) == (
                launched[span.bucket], done[span.bucket], expected)
        assert lane.exposed_ns == max(done.values()) - last_hook > 0
    worst = {b.bucket: b.exposed_ms for b in t.view.buckets}
    for b in t.view.buckets:
        per_rank = [s.exposed_ns / 1e6 for lane in t.view.lanes.values()
                    for s in lane.allreduce if s.bucket == b.bucket]
        assert worst[b.bucket] == max(per_rank)
    assert t.buckets_html.value.count("<tr>") == 1 + len(t.view.buckets)


def test_unused_parameters_are_listed_by_rank() -> None:
    events = synthetic_run(2, 6, 2, plant=Plant(unused={0: (0, 1)}))
    t = HookTimeline(events)
    assert t.view is not None
    assert t.view.unused == {0: (0, 1)}
    assert "rank 0: p0 &#x27;0.weight&#x27;, p1 &#x27;0.bias&#x27;" in t.unused_html.value
    assert "✕ 2 unused" in t.svg_html.value


def test_order_columns_keep_every_departure_when_the_model_is_large() -> None:
    events = synthetic_run(2, 300, 1, plant=Plant(swap={1: (0, 150, 151)}))
    t = HookTimeline(events, max_order_columns=40)
    assert t.view is not None
    columns = t.order_columns(t.view.order)
    assert {149, 150, 151, 152} <= set(columns) and len(columns) == 40
    assert t.order_html.value.count("<td class=d") == 2


def test_a_large_timeline_is_decimated_to_pixel_columns() -> None:
    events = synthetic_run(8, 1000, 1, hook_us=5)
    t = HookTimeline(events)
    assert t.view is not None and len(t.view.lanes) == 8
    svg = t.svg_html.value
    runs = re.findall(r"M(\d+) \d+h(\d+)v10h-\d+z", svg)  # hook tick runs
    assert 0 < len(runs) <= 8 * 860  # never more than one run per pixel column and lane
    assert len(svg) < 60_000  # 8,000 hooks, a few tens of KB


def test_following_live_holds_redraws_back_to_the_bytes_budget() -> None:
    events = synthetic_run(2, 40, 3)
    model = EventModel()
    t = HookTimeline.embedded_in(model, live_bytes_per_s=1000)
    model.feed(events[: len(events) // 2])
    assert t.render(Cursor(None, None)) is False
    drawn = t.bytes_drawn
    assert drawn > 1000  # so the next live redraw must wait over a second
    model.feed(events[len(events) // 2:])
    assert t.render(Cursor(None, None)) is True  # deferred: the throttle comes back later
    t._next_live = 0.0  # the budget's time has passed
    assert t.render(Cursor(None, None)) is False and t.step == 2
    # a cursor the user chose is drawn at once, whatever the budget
    t._next_live = float("inf")
    assert t.render(Cursor(0, None)) is False and t.step == 0


def test_ranks_still_in_backward_are_compared_on_what_they_fired() -> None:
    assert order_diff({0: (5, 4, 3, 2), 1: (5, 4), 2: (5, 4, 3, 2)}).positions == {
        0: (), 1: (2, 3), 2: ()}
    events = synthetic_run(2, 6, 1)
    m = EventModel()
    m.feed(events)
    third = [e for e in events if isinstance(e, ev.GradReady) and e.rank == 1][2]
    view = analyse(0, m.step_records(0, as_of=third.t_ns), 6)
    assert view.lanes[1].order == (5, 4, 3) and view.lanes[1].unused == ()


def test_at_256_ranks_the_timeline_draws_distributions_and_names_the_slowest_ranks() -> None:
    """Ranks 37 and 200 take longer per hook; ranks start 7 us apart (the stream's clock
    offsets), so without the planted slowness the highest ranks finish last."""
    from ddpviz.model.rank_groups import percentile

    events = synthetic_run(256, 12, 2, plant=Plant(slow={37: 300, 200: 200},
                                                   swap={9: (1, 2, 5), 10: (1, 2, 5)}))
    t = HookTimeline(events)
    assert t.controls is not None
    t.controls.show_step(1)
    assert t.view is not None and t.spread is not None
    assert len(t.view.lanes) == 256 and t.spread.n_ranks == 256
    # the slowest ranks are the ones whose last hook was latest, computed from the events
    last = {r: max(e.t_ns for e in events if isinstance(e, ev.GradReady) and e.rank == r
                   and e.step == 1) for r in range(256)}
    expected = sorted(last, key=lambda r: (-last[r], r))[:5]
    assert [s.rank for s in t.spread.slowest] == expected
    assert expected[:2] == [37, 200]
    assert "slowest: rank 37 (+" in t.header_html.value
    # per bucket: the spread of ready times over ranks, from BucketReady
    t0 = t.view.t0
    for b in t.spread.buckets:
        ready = sorted(e.t_ns - t0 for e in events if isinstance(e, ev.BucketReady)
                       and e.step == 1 and e.bucket == b.bucket)
        assert b.ready is not None and b.ready.n == 256
        assert b.ready.p50 == percentile(ready, 50)
        assert (b.ready.min, b.ready.max) == (ready[0], ready[-1])
    # one lane, the slowest rank's, below the distribution; pick another and it is drawn
    assert t.shown_ranks() == [37]
    assert t.svg_html.value.count("font-weight='bold'>rank ") == 1
    assert "font-weight='bold'>rank 37</text>" in t.svg_html.value
    assert t.rank_select.options[1] == (
        f"rank 37: last hook +{t.spread.slowest[0].behind_ms:,.3f} ms after the median", 37)
    t.select_rank(128)
    assert t.shown_ranks() == [128]
    assert "font-weight='bold'>rank 128</text>" in t.svg_html.value
    t.select_rank(None)
    assert t.shown_ranks() == [37]
    # firing orders grouped: the 254 agreeing ranks in one row, ranks 9 and 10 in another
    assert "<th>0-8, 11-255</th>" in t.order_html.value
    assert "<th>9, 10</th>" in t.order_html.value
    assert t.order_html.value.count("<tr><th>") == 3  # the position header + 2 groups
    assert "over 256 ranks" in t.buckets_html.value


def test_up_to_16_ranks_keep_one_lane_per_rank() -> None:
    t = HookTimeline(synthetic_run(16, 6, 2))
    assert t.controls is not None
    t.controls.show_step(1)
    assert t.spread is None and t.view is not None
    assert t.svg_html.value.count("font-weight='bold'>rank ") == 16
    assert t.rank_select.layout.display == "none"


def test_a_nan_origin_is_shown_and_its_rank_and_parameter_marked_in_the_firing_order() -> None:
    from ddpviz.findings import Finding

    events = synthetic_run(3, 6, 3)
    mine = [e for e in events if e.rank == 1 and e.step == 1]
    param = next(e.param for e in mine if isinstance(e, ev.GradReady))
    finding = Finding(kind="nonfinite_gradient", severity="warning",
                      title=f"non-finite local gradient 'p{param}' on rank 1 at step 1",
                      ranks=(1,), param=param, step=1, world_size=3,
                      values=(("loss finite, local gradients finite", (0, 2)),
                              (f"loss finite, local gradient non-finite: 'p{param}'", (1,))))
    last = max(e.t_ns for e in mine)
    events.append(ev.FindingReported(1, 1, last + 1, 10**6, finding))
    t = HookTimeline(events)
    assert t.controls is not None
    t.controls.show_step(1)
    assert "⚠ NaN/Inf: non-finite local gradient" in t.nan_html.value
    assert "rank 1: loss finite, local gradient non-finite" in t.nan_html.value
    position = t.view.lanes[1].order.index(param) if t.view else -1
    cells = re.findall(r"<tr><th>r1</th>(.*?)</tr>", t.order_html.value)[0]
    marked = re.findall(r"<td class=n title='[^']*'>(\d+)</td>", cells)
    assert marked == [str(param)] and position >= 0
    assert "class=n" not in re.findall(r"<tr><th>r0</th>(.*?)</tr>", t.order_html.value)[0]
    t.controls.show_step(2)  # only the iteration where it began
    assert t.nan_html.value == "" and "class=n" not in t.order_html.value


def test_a_park_is_marked_on_the_lanes_drawn_and_buckets_are_click_targets_at_scale() -> None:
    # 24 ranks: the distribution band, then the slowest rank's lane only; the park is marked
    # on that lane, and the band's buckets are click targets too
    t = HookTimeline(synthetic_run(24, 8, 2, plant=Plant(slow={5: 400})))
    assert t.spread is not None and t.shown_ranks() == [5]
    n_buckets = len(t.spread.buckets)
    svg = t.svg_html.value
    for b in range(n_buckets):  # ready band and all-reduce of each bucket, across ranks
        band = re.findall(rf"<rect data-bucket='{b}' x='\d+' y='\d+' width='\d+' height='7'",
                          svg)
        assert len(band) == 2
    t.mark_stop(timeline_svg.StopMark(1, "bucket", 0, (), "step 1, before bucket 0's all-reduce"))
    t.refresh()
    svg = t.svg_html.value
    assert re.findall(r"<g class='ddpviz-stop' data-rank='(\d+)'", svg) == ["5"]
    assert svg.count("class='ddpviz-stop-bucket'") == 1
    assert "⏸ paused at step 1, before bucket 0" in html.unescape(t.header_html.value)
    t.mark_stop(None)
    t.refresh()
    assert "ddpviz-stop" not in t.svg_html.value and "paused" not in t.header_html.value
