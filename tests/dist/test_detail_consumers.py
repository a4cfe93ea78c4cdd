"""Steps recorded at an aggregated detail level (GradsSummarized per bucket, no GradReady),
drawn by every consumer, on a real 2-rank gloo run of ddpviz's DDP at Recording(every=3): the
event model (live `feed` and trace `feed_table`) holds exactly the summaries the ranks emitted,
the hook timeline draws one span per bucket from its first to its last gradient ready with a
note and "not recorded" for the firing order, the report and the Chrome export carry one
"gradients ready" summary span per bucket; full steps are drawn as before."""

from __future__ import annotations

import html
import re

import msgspec
import pytest
import torch
from torch import nn

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.report.chrome_trace import chrome_trace_doc
from ddpviz.report.html import render
from ddpviz.traces.trace import Trace
from ddpviz.widgets import HookTimeline
from ddpviz.widgets.timeline_svg import LABEL, WIDTH
from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 6
FULL = {0, 1, 2, 3}  # sampled:3 over 6 steps: 0-2, and every 3rd (0, 3)
AGGREGATED = set(range(STEPS)) - FULL


def _rank(rank: int, world_size: int) -> bytes:
    import ddpviz

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(24, 24) for _ in range(5)], nn.Linear(24, 4))
    events: list[ev.Event] = []
    ddp = ddpviz.DistributedDataParallel(model, emitter=events.append,
                                         recording=ddpviz.Recording(every=3),
                                         hang_timeout=0, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS):
        torch.manual_seed(10 * rank + step)
        ddp(torch.randn(6, 24)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return msgspec.msgpack.encode(events)


@pytest.fixture(scope="module")
def events() -> list[ev.Event]:
    out = run_ranks(_rank, 2, timeout=240)
    decoded: list[ev.Event] = []
    for r in sorted(out):
        decoded += msgspec.msgpack.decode(out[r], type=list[ev.ANY_EVENT])  # type: ignore[arg-type]
    return decoded


def _summaries(events: list[ev.Event]) -> dict[tuple[int, int, int], tuple[int, int, int, int]]:
    """(rank, step, bucket) -> (first, last, n_grads, nbytes) of the GradsSummarized events."""
    return {(e.rank, e.step, e.bucket): (e.first_t_ns, e.last_t_ns, e.n_grads, e.nbytes)
            for e in events if isinstance(e, ev.GradsSummarized)}


def test_the_run_has_aggregated_steps_with_several_buckets(events: list[ev.Event]) -> None:
    s = _summaries(events)
    assert {step for _, step, _ in s} == AGGREGATED
    assert {e.step for e in events if isinstance(e, ev.GradReady)} == FULL
    assert len({b for _, _, b in s}) >= 3


@pytest.mark.parametrize("how", ["feed", "feed_table"])
def test_the_event_model_holds_the_summaries_the_ranks_emitted(events: list[ev.Event],
                                                                how: str) -> None:
    model = EventModel()
    if how == "feed":
        model.feed(events)
    else:
        for table in Trace(events).columns().values():
            model.feed_table(table)
    held = {(r, step, b): (s.first, s.last, s.n_grads, s.nbytes)
            for step in model.steps for r, rec in model.step_records(step).items()
            for b, s in rec.summaries.items()}
    assert held == _summaries(events)
    assert model.full_steps() == sorted(FULL)
    for step in model.steps:
        for rec in model.step_records(step).values():
            assert rec.summarized == (step in AGGREGATED)
            assert bool(rec.grads) == (step in FULL)


def test_the_hook_timeline_draws_one_span_per_bucket_on_an_aggregated_step(
        events: list[ev.Event]) -> None:
    t = HookTimeline(events)
    assert t.controls is not None
    step = 4
    t.controls.show_step(step)
    v = t.view
    assert v is not None and v.summarized == (0, 1)
    want = _summaries(events)
    svg = t.svg_html.value
    scale = (WIDTH - LABEL - 8) / (max(v.t1, v.t0 + 1) - v.t0)
    lanes = svg.split("font-weight='bold'>rank ")[1:]  # one chunk per lane, in rank order
    assert len(lanes) == 2
    for rank, chunk in zip((0, 1), lanes, strict=True):
        rects = re.findall(r"<rect class='ddpviz-grad-summary' data-bucket='(\d+)' x='(\d+)' "
                           r"y='\d+' width='(\d+)'", chunk)
        buckets = {b for (r, s, b) in want if r == rank and s == step}
        assert sorted(int(b) for b, _, _ in rects) == sorted(buckets)
        for b, x, width in rects:
            first, last, n, _ = want[(rank, step, int(b))]
            x0 = LABEL + int((first - v.t0) * scale)
            x1 = LABEL + int((last - v.t0) * scale)
            assert (int(x), int(width)) == (x0, max(1, x1 - x0))
            assert f"bucket {b}: {n:,} gradients ready" in chunk
        assert v.lanes[rank].compute_end == max(
            want[(rank, step, b)][1] for b in buckets)
    assert "step 4: per-bucket summaries; per-parameter hooks recorded on steps 0-3 " \
        "(Recording(every=1): every step)" in html.unescape(t.header_html.value)
    assert "hook firing order (step 4, ranks 0,1): not recorded" in t.order_html.value
    assert "<td" not in t.order_html.value  # no order table for summarized ranks
    # the bucket table counts the summarized gradients per bucket
    n_by_bucket = {b: n for (r, s, b), (_, _, n, _) in want.items() if s == step}
    assert {b.bucket: b.n_params for b in v.buckets} == n_by_bucket


def test_full_steps_of_the_same_run_are_drawn_hook_by_hook(events: list[ev.Event]) -> None:
    t = HookTimeline(events)
    assert t.controls is not None
    t.controls.show_step(3)
    v = t.view
    assert v is not None and v.summarized == ()
    assert "ddpviz-grad-summary" not in t.svg_html.value
    assert "per-bucket summaries" not in t.header_html.value
    fired = tuple(e.param for e in events if isinstance(e, ev.GradReady) and e.rank == 0
                  and e.step == 3)
    assert v.lanes[0].order == fired
    assert "✔ the same hook firing order on ranks 0,1" in t.order_html.value


def test_report_and_chrome_export_carry_one_summary_span_per_bucket(
        events: list[ev.Event]) -> None:
    trace = Trace(events)
    want = _summaries(events)
    spans = {(s.rank, s.step, s.args["bucket"]): (s.start_ns, s.end_ns, s.args["n_grads"])
             for s in trace.spans() if s.cat == "gradients"}
    assert spans == {k: (f, last, n) for k, (f, last, n, _) in want.items()}
    doc = chrome_trace_doc(trace)
    t0 = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    xs = [e for e in doc["traceEvents"] if e.get("cat") == "gradients"]
    assert len(xs) == len(want)
    for e in xs:
        first, last, n, nbytes = want[(e["pid"], e["args"]["step"], e["args"]["bucket"])]
        assert e["ph"] == "X" and e["name"] == f"gradients ready b{e['args']['bucket']} " \
            f"(summary of {n})"
        assert e["dur"] == pytest.approx((last - first) / 1000)
        assert e["args"]["nbytes"] == nbytes
    firsts = sorted(f for f, _, _, _ in want.values())
    assert min(e["ts"] for e in xs) - t0 == pytest.approx((firsts[0] - min(
        s.start_ns for s in trace.spans())) / 1000)
    page = render(trace)
    assert "per-parameter hooks were not recorded" in page
    shown = re.findall(r"step (\d+) gradients ready b(\d+) \(summary of (\d+)\)", page)
    assert shown  # the report's timeline covers its last steps: 4 and 5 are aggregated
    for step, b, n in shown:
        assert int(step) in AGGREGATED
        assert any(k[1:] == (int(step), int(b)) and v[2] == int(n) for k, v in want.items())
