"""Steps recorded at an aggregated detail level (GradsSummarized per bucket, no GradReady),
drawn by every consumer, on a real 2-rank gloo run of ddpviz's DDP at Recording(every=3): the
event model (live `feed` and trace `feed_table`) holds exactly the summaries the ranks emitted,
hook_analysis gives the hook timeline one span per bucket from its first to its last gradient
ready and no firing order, the report and the Chrome export carry one
"gradients ready" summary span per bucket; full steps are drawn as before."""

from __future__ import annotations

import re

import msgspec
import pytest
import torch
from torch import nn

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import analyse
from ddpviz.report.chrome_trace import chrome_trace_doc
from ddpviz.report.html import render
from ddpviz.traces.trace import Trace
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
    """What the hook timeline (extension/src/hookTimeline.ts) draws an aggregated step from:
    per rank one span per bucket from its first to its last gradient ready, no firing order;
    its drawing: tests/browser/test_lab_summarized_steps.py."""
    model = EventModel()
    model.feed(events)
    step = 4
    v = analyse(step, model.step_records(step))
    assert v.summarized == (0, 1) and v.order.positions == {}
    want = _summaries(events)
    assert sorted(v.lanes) == [0, 1]
    for rank, lane in v.lanes.items():
        buckets = {b for (r, s, b) in want if r == rank and s == step}
        assert len(buckets) >= 3 and lane.order == () and lane.summarized
        spans = {b: (s.first, s.last, s.n_grads, s.nbytes)
                 for b, s in lane.record.summaries.items()}
        assert spans == {b: want[(rank, step, b)] for b in buckets}
        assert lane.compute_end == max(want[(rank, step, b)][1] for b in buckets)
        assert all(v.t0 <= first <= last <= v.t1 for first, last, _, _ in spans.values())
    assert model.full_steps() == sorted(FULL)  # the steps the note names
    # the bucket timing counts the summarized gradients per bucket
    n_by_bucket = {b: n for (r, s, b), (_, _, n, _) in want.items() if s == step}
    assert {b.bucket: b.n_params for b in v.buckets} == n_by_bucket


def test_full_steps_of_the_same_run_are_drawn_hook_by_hook(events: list[ev.Event]) -> None:
    model = EventModel()
    model.feed(events)
    v = analyse(3, model.step_records(3))
    assert v.summarized == () and not v.order.differs
    for rank, lane in v.lanes.items():
        hooks = [(e.t_ns, e.param, e.bucket) for e in events if isinstance(e, ev.GradReady)
                 and e.rank == rank and e.step == 3]
        assert lane.order == tuple(p for _, p, _ in hooks) and not lane.record.summaries
        assert [tuple(g) for g in lane.record.grads] == hooks  # one mark per hook
    assert v.order.reference_ranks == (0, 1)


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
