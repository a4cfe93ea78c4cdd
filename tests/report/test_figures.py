"""The report's figures say what they count: the per-rank table (time in steps without the
construction before them, the all-reduce launch-to-done and the wait for the last launch apart),
which steps the timelines draw (the steps findings name first, at most MAX_STEPS, the rest
counted), a stopped rank's note, verification as recorded (bare watch(ddp): what torch checked),
the bucket caps (torch's, "not recorded" when unknown), and the summary's duration split at the
first step."""

from __future__ import annotations

import html
import json
import re

from ddpviz import events as ev
from ddpviz._diagnose.verdict import diagnosis_json, trace_facts
from ddpviz.findings import Finding, Severity
from ddpviz.model.event_model import EventModel
from ddpviz.model.spans import Span
from ddpviz.report.html import render
from ddpviz.report.ranks import launch_waits
from ddpviz.report.timeline import MAX_STEPS, Computed, timeline_section, timeline_steps
from ddpviz.traces.trace import Trace

MS = 1_000_000
SETUP = 7_000 * MS  # the wait before the first step (construction, ranks arriving)


def _ar(rank: int, step: int, bucket: int, start: int, end: int, done: bool = True) -> Span:
    return Span(rank, f"all-reduce b{bucket}", "allreduce", f"all-reduce bucket {bucket}", step,
                start, end, done, {})


def _phase(rank: int, step: int, name: str, start: int, end: int) -> Span:
    return Span(rank, name, "phase", "phases", step, start, end, True, {})


def _run(steps: int = 3, waits: tuple[int, int] = (0, 3 * MS)) -> list[ev.Event]:
    """Two ranks, a construction SETUP before step 0, then `steps` fully recorded steps with
    one bucket; rank r hands the bucket in waits[r] after the backward starts."""
    out: list[ev.Event] = []
    for r in (0, 1):
        seq = iter(range(10_000))
        t = 1_000
        out += [ev.VerificationPassed(r, -1, t, next(seq), 2, "d1g35t"),
                ev.BucketAssigned(r, -1, t + 10, next(seq), ((0, 1),), (), False)]
        t += SETUP
        for s in range(steps):
            launch = t + 2 * MS + waits[r]
            done = t + 2 * MS + max(waits) + MS
            out += [ev.ForwardStarted(r, s, t, next(seq)),
                    ev.BackwardStarted(r, s, t + 2 * MS, next(seq)),
                    ev.AllReduceLaunched(r, s, launch, next(seq), 0, 100, "float32"),
                    ev.AllReduceDone(r, s, done, next(seq), 0),
                    ev.BackwardFinished(r, s, done, next(seq))]
            t += 10 * MS
    return out


def _row(page: str, rank: int) -> list[str]:
    section = re.search(r"<section id='ranks'>.*?</section>", page, re.S)
    assert section
    rows = re.findall(r"<tr>(<td.*?)</tr>", section.group(0))
    return [html.unescape(re.sub(r"<.*?>", "", c))
            for c in re.findall(r"<td[^>]*>.*?</td>", rows[rank])]


def test_launch_waits_compare_every_ranks_launch_of_the_same_bucket() -> None:
    spans = {0: [_ar(0, 0, 0, 100, 900), _ar(0, 0, 1, 200, 900), _ar(0, 1, 0, 1_000, 1_500)],
             1: [_ar(1, 0, 0, 400, 900), _ar(1, 0, 1, 150, 900)]}
    # step 1's bucket 0 was recorded by rank 0 only: no wait to tell
    assert launch_waits(spans) == {0: [300, 0], 1: [0, 50]}


def test_the_rank_table_leaves_construction_out_and_splits_the_wait() -> None:
    page = render(Trace(_run()))
    section = re.search(r"<section id='ranks'>.*?</tr>", page, re.S)
    assert section
    head = [html.unescape(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", section.group(0))]
    late, early = _row(page, 0), _row(page, 1)  # rank 0 hands the bucket in first
    col = {h.split(" ¹")[0].split(" ²")[0].split(" ³")[0].split(" ⁴")[0].split(" ⁵")[0]: i
           for i, h in enumerate(head)}
    assert late[col["steps run"]] == "3" and late[col["steps recorded in full"]] == "0-2"
    # from step 0's forward to the last event: 2 steps of 10 ms and the last one's 2+3+1 ms
    assert late[col["time in steps"]] == "26 ms" and early[col["time in steps"]] == "26 ms"
    assert late[col["all-reduces recorded"]] == "3"
    assert late[col["all-reduce launch to done, mean"]] == "4 ms"  # 3 ms of it waiting
    assert late[col["of which waiting for the last rank's launch"]] == "3 ms"
    assert early[col["all-reduce launch to done, mean"]] == "1 ms"
    assert early[col["of which waiting for the last rank's launch"]] == "0.00 s"
    assert "first forward) is left out" in page


def test_the_summary_says_the_time_before_the_first_step_apart() -> None:
    trace = Trace(_run())
    facts = trace_facts(trace)
    assert facts.setup_ns == SETUP and facts.duration_ns == SETUP + 26 * MS
    assert facts.world_size == 2  # from the recorded comparison
    sentence = facts.sentence()
    assert "over 7.03 s (7.00 s before the first step: construction and setup; 26 ms from the " \
           "first step on)" in sentence, sentence
    doc = json.loads(diagnosis_json(trace, []))["trace"]
    assert doc["setup_s"] == SETUP / 1e9 and doc["duration_s"] == (SETUP + 26 * MS) / 1e9
    only_construction = Trace([e for e in _run() if e.step < 0])
    assert trace_facts(only_construction).setup_ns == 0
    assert "before the first step" not in trace_facts(only_construction).sentence()


def test_the_dashboards_rate_of_a_finished_run_is_over_its_steps() -> None:
    events = _run()
    model = EventModel()
    model.feed(events)
    in_steps = sum(1 for e in events if e.step >= 0)
    rate = model.status(as_of=events[-1].t_ns).events_per_s
    assert abs(rate - in_steps / 0.026) < 1e-6 * rate  # not over the 7 s before step 0


def _spans_for(steps: range) -> list[Span]:
    return [s for st in steps for r in (0, 1)
            for s in (_phase(r, st, "backward", st * 100, st * 100 + 50),
                      _ar(r, st, 0, st * 100 + 10, st * 100 + 50))]


def _finding(step: int, severity: Severity = "warning") -> Finding:
    return Finding(kind="rank_hang", severity=severity, title="t", step=step)


def test_the_timeline_draws_named_steps_first_then_the_first_and_latest() -> None:
    spans = _spans_for(range(21))
    picked, left_out = timeline_steps(spans, [], [_finding(12), _finding(5, "info")])
    assert len(picked) == MAX_STEPS and 12 in picked and 5 not in picked  # info names none
    assert picked == [0, 1, 2, 12, 19, 20]
    assert left_out == [s for s in range(21) if s not in picked]
    # a finding naming a step with nothing to draw is not drawn
    assert timeline_steps(spans, [], [_finding(40)])[0] == [0, 1, 2, 18, 19, 20]
    # more named steps than fit: the first MAX_STEPS of them
    named = [_finding(s) for s in range(3, 3 + MAX_STEPS + 2)]
    assert timeline_steps(spans, [], named)[0] == list(range(3, 3 + MAX_STEPS))
    # a step with only backward marks (hook-less watch(), unsampled) can be named and drawn
    marks = [Computed(0, 30, 3_000, 3_050)]
    assert 30 in timeline_steps(spans, marks, [_finding(30)])[0]


def test_the_timeline_says_how_many_steps_it_left_out() -> None:
    spans = _spans_for(range(21))
    picked, left_out = timeline_steps(spans, [], [])
    drawn = timeline_section(spans, [], [], picked, left_out, {}, {})
    assert drawn.count("<figure class='step'") == MAX_STEPS
    assert "Drawn: steps 0-2, 18-20." in drawn
    assert "Not drawn: 15 more recorded steps (3-17)." in drawn
    assert "Not drawn" not in timeline_section(spans, [], [], [0, 1], [], {}, {})


def test_the_legend_names_one_cycle_of_bucket_colours_and_counts_the_rest() -> None:
    """A swatch per bucket was a legend entry per bucket: 100,000 of them in the report of a
    100,000-bucket trace (a 50 MB page)."""
    from ddpviz.report.timeline import COLORS

    for n in (len(COLORS) - 1, len(COLORS), 2_000):
        spans = [_ar(0, 0, b, 10 * b, 10 * b + 5) for b in range(n)]
        drawn = timeline_section(spans, [], [], [0], [], {}, {})
        legend = drawn[drawn.index("<ul class='legend'>"):]
        named = re.findall(r"all-reduce of bucket (\d+) \(launch to done\)", legend)
        assert named == [str(b) for b in range(min(n, len(COLORS)))]
        more = n - len(COLORS)
        assert (f"… and {more:,} more buckets, their colours in the same cycle" in legend) == (
            more > 0)


def test_a_rank_with_nothing_in_the_hang_step_says_where_it_stopped() -> None:
    spans = [*_spans_for(range(3)), _phase(0, 3, "forward", 300, 320)]
    marks = [Computed(0, 3, 325, 340)]
    last = {0: 340, 1: 250}
    ends = {0: 340 + 5_000 * MS, 1: 250}
    drawn = timeline_section(spans, marks, [_finding(3, "error")], [3], [], last, ends)
    assert "rank 0: no further event (5.00 s until its trace ends)" in drawn
    assert "rank 1: no event in step 3 (its last was in step 2, where its trace ends)" in drawn
    assert "no further event from this rank until its trace ends" in drawn  # the legend


def _bare_watch(n_ranks: int = 2) -> list[ev.Event]:
    params = (ev.ParamInfo(0, "w", (4, 4), "float32", "cpu", False, 4),)
    return [ev.ParamsBuilt(r, -1, 100, 0, params, (), ()) for r in range(n_ranks)]


def test_bare_watch_says_what_torch_checked_and_what_was_not_compared() -> None:
    page = render(Trace(_bare_watch()))
    section = re.search(r"<section id='verification'>.*?</section>", page, re.S)
    assert section
    text = html.unescape(section.group(0))
    assert "No comparison of the models across ranks was recorded" in text
    assert "number of parameters and each one's size and stride" in text
    assert "returned on ranks 0,1" in text
    assert "Not compared: parameter names and dtypes, requires_grad, buffers." in text
    started = [ev.VerificationStarted(0, -1, 50, 1, 2, 1, 0), *_bare_watch(1)]
    text = render(Trace(started))
    assert "started on rank 0 and no result was recorded" in text
    assert "No model comparison and no DDP construction" in render(
        Trace([ev.ForwardStarted(0, 0, 1, 0)]))


def test_caps_are_torchs_or_said_not_recorded() -> None:
    params = tuple(ev.ParamInfo(i, f"p{i}", (256,), "float32", "cpu", False, 4)
                   for i in range(3))
    maxsize = (1 << 63) - 1
    evs: list[ev.Event] = [
        ev.ParamsBuilt(0, -1, 0, 0, params, (), ()),
        ev.BucketAssigned(0, -1, 1, 1, ((0, 1, 2),), (maxsize,), False),
        ev.BucketAssigned(0, 1, 2, 2, ((2,), (0, 1)), (), True)]  # learned: caps unknown
    page = render(Trace(evs))
    caps = re.findall(r"<tr id='bucket-\d-\d'>(?:<td[^>]*>.*?</td>){3}<td[^>]*>(.*?)</td>", page)
    assert caps == ["none (one bucket per dtype and device)", "not recorded", "not recorded"]
    assert "1 bucket," not in page and "Bucket map at construction (rank 0), 1 bucket</h3>" in page
    assert "2 buckets, bucket 0 reduced first" in page


def test_a_failed_comparison_that_stopped_the_ranks_says_ddp_was_not_built() -> None:
    mismatch = ev.Mismatch("param", 0, "w", "shape", (("(4,)", (0,)), ("(5,)", (1,))))
    failed = [ev.VerificationFailed(r, -1, 10, 0, 2, (mismatch,)) for r in (0, 1)]
    page = render(Trace(failed))
    said = "DDP was not built: the comparison of the models failed on ranks 0,1"
    assert page.count(said) == 2  # the bucket maps and the timelines
    # a difference torch accepts (the job goes on and builds DDP): not said
    assert said not in render(Trace(failed + _bare_watch()))
