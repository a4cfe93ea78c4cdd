"""The static report opens with what diagnose() found: every finding, escaped, errors first,
each linked to a section of the page that exists; a healthy run in one line; a summary in
words (a date, durations), not raw nanoseconds."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import ddpviz
from ddpviz import events as ev
from ddpviz import markup
from ddpviz.findings import Finding, sort_findings
from ddpviz.report.html import render
from ddpviz.traces.trace import Trace
from tests.diagnose.random_runs import DEFECTS, random_run
from tests.diagnose.synthetic import Ranks
from tests.security.hostile import hostile_trace, raw_markup

_ORDER = {"error": 0, "warning": 1, "info": 2}
WALL_NS = 1_795_566_483_621_739_137  # 2026-11-25 00:28:03 UTC


class _Page(HTMLParser):
    """Every id, every in-page link, and the findings' ids and severities in page order."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.findings: list[tuple[str, str]] = []  # (id, severity)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        if tag == "a" and (a.get("href") or "").startswith("#"):
            self.links.append(str(a["href"])[1:])
        classes = (a.get("class") or "").split()
        if tag == "div" and "finding" in classes:
            self.findings.append((str(a["id"]), classes[1]))


def _parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


def _planted() -> Trace:
    """Two ranks, two buckets; rank 1's gradients come in another order at step 1 (a warning),
    a parameter differs (an error, with markup in its name), events were dropped (info)."""
    r = Ranks(2)
    buckets = ((3, 2), (1, 0))
    r.construct(buckets=buckets)
    for step in range(3):
        r.iteration(0, step, buckets=buckets)
        r.iteration(1, step, order=(2, 3, 1, 0) if step == 1 else (3, 2, 1, 0), buckets=buckets)
    odd = ev.Mismatch("param", 2, "fc2.<script>x</script>", "shape",
                      (("(4, 16)", (0,)), ("(16, 4)", (1,))))
    r.emit(1, ev.VerificationFailed, 2, (odd,), step=-1)
    r.emit(0, ev.EventsDropped, 7, step=2)
    return Trace(r.events, meta={"started_wall_ns": WALL_NS, "job": "<b>demo</b>"})


def test_the_page_opens_with_every_finding_escaped_errors_first() -> None:
    trace = _planted()
    findings = ddpviz.diagnose(trace)
    assert {f.severity for f in findings} == {"error", "warning", "info"}
    page = render(trace, interactive=False)  # (the interactive view's: test_interactive.py)
    body = page.split("</style>", 1)[1]
    assert raw_markup(body) is None
    assert body.index("<section id='findings'>") < body.index("<section id='summary'>")
    parsed = _parse(page)
    assert [i for i, _ in parsed.findings] == [f"finding-{n}" for n in range(len(findings))]
    shown = [s for _, s in parsed.findings]
    assert shown == [f.severity for f in sort_findings(findings)]
    assert shown == sorted(shown, key=_ORDER.__getitem__)
    for f in findings:
        assert markup.escape(f.title) in page
        assert markup.escape(f.fix) in page
        for line in f.detail:
            assert markup.escape(line) in page


def test_each_finding_links_to_the_section_it_names() -> None:
    page = render(_planted())
    parsed = _parse(page)
    assert parsed.links and set(parsed.links) <= set(parsed.ids)
    links = dict(re.findall(r"id='(finding-\d+)'>.*?<a href='#([^']+)'", page))
    kinds = {f.kind: n for n, f in enumerate(sort_findings(ddpviz.diagnose(_planted())))}
    assert links[f"finding-{kinds['param_mismatch']}"] == "verification"
    assert links[f"finding-{kinds['grad_order']}"] == "step-1"  # on the timeline
    assert "<a href='#finding-0'>" in page  # the verification section points back


def test_a_bucket_finding_links_to_its_row_in_the_map_in_force() -> None:
    from ddpviz.report.html import _bucket_maps, _link

    trace = _planted()
    maps = _bucket_maps(trace)
    f = Finding(kind="rank_hang", severity="error", title="t", bucket=1, step=2, ranks=(1,))
    assert _link(f, maps, [0, 1, 2]) == "bucket-0-1"
    assert "id='bucket-0-1'" in render(trace)
    beyond = Finding(kind="rank_hang", severity="error", title="t", bucket=9, step=7)
    assert _link(beyond, maps, [0, 1, 2]) == ""  # no such row, no such step: no link


def test_links_resolve_on_random_defective_runs() -> None:
    for seed in range(30):
        trace = Trace(random_run(seed, DEFECTS if seed % 2 else None))
        parsed = _parse(render(trace))
        assert set(parsed.links) <= set(parsed.ids), seed
        assert len(parsed.findings) == len(ddpviz.diagnose(trace)), seed


def test_a_healthy_run_says_so_in_one_line() -> None:
    r = Ranks(2)
    r.construct()
    for step in range(3):
        for rank in (0, 1):
            r.iteration(rank, step)
    trace = Trace(r.events, meta={"started_wall_ns": WALL_NS})
    assert ddpviz.diagnose(trace) == []
    page = render(trace)
    section = re.search(r"<section id='findings'>(.*?)</section>", page, re.S)
    assert section is not None
    assert re.findall(r"<p[^>]*>(.*?)</p>", section.group(1)) == [
        "<b>Healthy: no problems found.</b>"]


def test_the_summary_speaks_to_people() -> None:
    page = render(_planted())
    summary = re.search(r"<section id='summary'>(.*?)</section>", page, re.S)
    assert summary is not None
    text = summary.group(1)
    assert "recorded 2026-11-25 00:28:03 UTC over " in text
    assert "started_wall_ns" not in page and str(WALL_NS) not in page
    # the time before the first step (the twin's construction) said apart
    assert re.search(r"over [\d.]+ (s|ms|µs) \([\d.]+ (s|ms|µs) before the first step: "
                     r"construction and setup; [\d.]+ (s|ms|µs) from the first step on\)\.", text)
    assert "job: &lt;b&gt;demo&lt;/b&gt;" in text  # other metadata, escaped


def test_the_hostile_trace_findings_are_shown_escaped() -> None:
    trace = hostile_trace()
    findings = ddpviz.diagnose(trace)
    assert findings
    page = render(trace, interactive=False)  # (the interactive view's: test_interactive.py)
    assert raw_markup(page.split("</style>", 1)[1]) is None
    for f in findings:
        assert markup.escape(f.title) in page


def test_end_records_are_diagnosed_and_said_as_diagnose_does() -> None:
    from ddpviz._diagnose.diagnosis import diagnose
    from ddpviz._diagnose.verdict import diagnosis_text
    from ddpviz.traces.fileformat import End
    from tests.diagnose.test_ended import run

    # rank 0's file was read mid-all-reduce of step 3; rank 1 finished step 3 and ended
    trace = run({0: 3, 1: 3}, open_on=0)
    assert "rank 1 was not in it" in render(trace)  # without the record: named as not in it
    ended = {1: End(1, 50, 0)}
    page = render(trace, ended=ended)
    assert "rank_hang" not in page and "was not in it" not in page
    said = "rank 1 ended cleanly; rank 0 has no end record (still running, or killed)."
    assert f"<p id='ended' class='muted'>{said}</p>" in page
    assert f"ddpviz: {said}" in diagnosis_text(trace, diagnose(trace, ended=ended), (), ended)
    # a rank's own error: said, and no clean end (the hang stays named)
    died = render(trace, ended={1: End(1, 50, 0, error="Value<Error>")})
    assert "rank 1 was not in it" in died
    assert ("<p id='ended' class='bad'>rank 1 exited on an uncaught Value&lt;Error&gt;; rank 0 "
            "has no end record (still running, or killed).</p>") in died
    assert "id='ended'" not in render(trace, ended={})  # a saved trace: no record, no line


def test_the_timeline_and_the_chrome_export_draw_the_optimizer_step() -> None:
    from ddpviz.report.chrome_trace import chrome_trace_doc

    r = Ranks(2)
    r.construct()
    for step in range(3):
        for rank in (0, 1):
            r.iteration(rank, step)
            r.emit(rank, ev.OptimizerStepStarted)
            if (rank, step) != (1, 2):  # rank 1 never finishes its last optimizer step
                r.emit(rank, ev.OptimizerStepFinished)
    trace = Trace(r.events, meta={"started_wall_ns": WALL_NS})
    page = render(trace)
    section = re.search(r"<section id='timeline'>(.*?)</section>", page, re.S)
    assert section is not None
    drawn = re.findall(r"fill='([^']+)'><title>rank (\d) step (\d) optimizer step:",
                       section.group(1))
    assert sorted((int(rank), int(step)) for _, rank, step in drawn) == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert {fill for fill, rank, step in drawn if (rank, step) == ("1", "2")} == {"url(#hatch)"}
    assert "url(#hatch)" not in {fill for fill, rank, step in drawn if (rank, step) != ("1", "2")}
    spans = [e for e in chrome_trace_doc(trace)["traceEvents"]
             if e.get("ph") == "X" and e["name"] == "optimizer step"]
    assert sorted((e["pid"], e["args"]["step"]) for e in spans) == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [e["args"].get("unfinished") for e in spans if (e["pid"], e["args"]["step"]) == (1, 2)
            ] == [True]
    assert all(e["cat"] == "phase" and e["dur"] >= 0 for e in spans)
