"""The advisor's answer as the front end receives it (ddpviz/advisor/wire.py), and as
extension/src/advice.ts reads it: the advisor's own numbers and words (computed in Python,
sent as data), bounded, checked on arrival (anything malformed, oversized or of another
version is refused, said in the view, never drawn), carried by the TraceView (computed on a
thread of its own, again at its own pace for a live run and once more at its end) and embedded
in the report. That the panel draws it, and runs no script from its strings: tests/browser."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ddpviz.advisor import AdviceError, advise, wire
from ddpviz.advisor.wire import SentAdvice, advice_bytes
from ddpviz.traces.trace import Trace
from tests.extension.mirror import run_typescript
from tests.widgets.streams import synthetic_run

HOSTILE = "<img src=x onerror=alert(1)></script><script>alert(2)</script>"


def decoded(data: bytes) -> SentAdvice:
    return msgspec.msgpack.decode(data, type=SentAdvice)


def test_the_bytes_are_the_advisors_numbers_and_words() -> None:
    trace = Trace(synthetic_run(2, steps=6))
    advice = advise(trace)
    sent = decoded(advice_bytes(trace))
    assert sent.error == "" and sent.reason == advice.reason and sent.world_size == 2
    assert sent.steps == len(advice.steps) and sent.first_step == advice.steps[0]
    assert sent.measured_step_ms == pytest.approx(advice.measured_step_s * 1e3)
    records = advice.to_records()
    assert [(r.label, r.family, r.setting, r.buckets, r.current, r.recommended)
            for r in sent.rows] == [(x["candidate"], x["family"], x["setting"], x["buckets"],
                                     x["current"], x["recommended"]) for x in records]
    assert [r.step_ms for r in sent.rows] == pytest.approx(
        [x["predicted_step_ms"] for x in records])
    assert [r.exposed_ms for r in sent.rows] == pytest.approx(
        [x["predicted_exposed_comm_ms"] for x in records])
    assert [r.cap_mb for r in sent.rows] == [r.candidate.cap_mb for r in advice.rows]
    rec = advice.recommended
    assert sent.recommended == rec.label and sum(r.recommended for r in sent.rows) == 1
    assert sent.map is not None and sent.map.setting == rec.candidate.setting()
    assert sent.map.buckets == [list(b.param_indices) for b in rec.buckets]
    assert sent.map.bytes == [b.nbytes for b in rec.buckets]


def test_where_the_advisor_cannot_advise_its_message_is_sent() -> None:
    short = Trace(synthetic_run(2, steps=2))
    with pytest.raises(AdviceError) as refused:
        advise(short)
    sent = decoded(advice_bytes(short))
    assert sent.error == str(refused.value) and sent.rows == [] and sent.map is None


def test_any_other_failure_of_the_advisor_is_said_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpviz.advisor.advisor as advisor

    def broken(_source: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(advisor, "advise", broken)
    sent = decoded(advice_bytes(Trace(synthetic_run(2, steps=6))))
    assert sent.error.startswith("ddpviz: the bucket advisor failed on this run (KeyError")


def test_rows_past_the_bound_are_cut_keeping_the_current_and_recommended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    advice = advise(Trace(synthetic_run(2, steps=6)))
    monkeypatch.setattr(wire, "MAX_ROWS", 3)
    sent = wire.sent_advice(advice)
    assert len(sent.rows) <= 3 and sent.rows[0].current
    assert [r.recommended for r in sent.rows].count(True) == 1
    assert any("are not drawn" in n for n in sent.notes)


# what advice.ts's adviceOf makes of bytes: the advice read, or why not (a string)
READ = "cases.map(c => g.adviceOf(Uint8Array.from(c)))"


def _encode(value: Any) -> list[int]:
    return list(msgspec.msgpack.encode(value))


def test_the_front_end_reads_the_same_numbers_and_refuses_what_is_malformed() -> None:
    good = advice_bytes(Trace(synthetic_run(2, steps=6)))
    refused = advice_bytes(Trace(synthetic_run(2, steps=2)))
    base = msgspec.to_builtins(decoded(good))
    hostile = {**base, "reason": HOSTILE, "rows": [{**base["rows"][0], "label": HOSTILE}]}

    def but(**changes: Any) -> dict[str, Any]:
        return {**base, **changes}

    row = base["rows"][0]
    bad = [
        but(version=2),  # another version of the wire
        but(rows=[{**row, "label": "x" * 4097}]),  # past MAX_NAME
        but(rows=[{**row, "step_ms": "1"}]),
        but(rows=[row] * 1025),  # past the rows a view draws
        but(map={**base["map"], "buckets": [[1 << 20]]}),  # a parameter index past the bound
        but(map={**base["map"], "bytes": []}),  # lengths disagree
        but(world_size=-1),
        {k: v for k, v in base.items() if k != "reason"},
        [1, 2, 3],
    ]
    got = run_typescript("advice.ts", READ, [list(good), list(refused), [],
                                             _encode(hostile), [0xC1]]
                         + [_encode(b) for b in bad])
    assert got[0] == base  # every number and word as Python sent it
    assert got[1]["error"].startswith("ddpviz: the trace holds 2 step(s)")
    assert got[2] is None  # nothing sent: the panel says where to get it
    assert got[3]["reason"] == HOSTILE and got[3]["rows"][0]["label"] == HOSTILE  # as text
    assert isinstance(got[4], str)  # not msgpack
    for case, out in zip(bad, got[5:], strict=True):
        assert isinstance(out, str), case


def test_a_run_over_the_bound_is_not_advised_and_the_message_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(synthetic_run(2, steps=6))
    monkeypatch.setattr(wire, "MAX_EVENTS", len(trace) - 1)
    sent = decoded(advice_bytes(trace))
    assert sent.events == len(trace) and sent.rows == []
    assert "ddpviz advise PATH" in sent.error and f"{len(trace) - 1:,}" in sent.error


def test_the_trace_view_sends_the_advice_from_a_thread_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from ddpviz.widgets import trace_view
    from ddpviz.widgets.trace_view import TraceView
    from tests.widgets.test_trace_view import until

    events = synthetic_run(2, steps=6)
    gate = threading.Event()
    real = trace_view.advice_bytes

    def held(source: object) -> bytes:  # the advisor at work until the test lets it go
        gate.wait(10)
        return real(source)

    monkeypatch.setattr(trace_view, "advice_bytes", held)
    view = TraceView(Trace(events))  # made (and drawable) before the advisor answered
    assert view.advice == wire.PENDING and decoded(view.advice).pending
    gate.set()
    until(lambda: view.advised == 1)
    assert view.advice == advice_bytes(Trace(events))
    live = [e for e in events if e.step < 2]  # too few steps yet: the advisor says why
    view = TraceView(live)
    until(lambda: view.advised == 1)
    assert decoded(view.advice).error
    live.extend(e for e in events if e.step >= 2)
    view.refresh()  # asked again, with diagnose()
    until(lambda: view.advised == 2)
    assert decoded(view.advice).error == "" and decoded(view.advice).reason
    assert decoded(view.advice).events == len(events)


def test_the_report_embeds_the_advice_as_data() -> None:
    from ddpviz.report import interactive
    from ddpviz.report.html import render
    from tests.report.test_interactive import _data

    if not (interactive.STATIC / "report_view.js").is_file():
        pytest.skip("the front end is not built (cd extension && jlpm build)")
    trace = Trace(synthetic_run(2, steps=6))
    assert _data(render(trace), interactive.ADVICE_ID) == advice_bytes(trace)


def test_a_report_asks_the_advisor_about_smaller_runs_than_a_view(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A report is written before anyone looks: it does not wait for the advisor on a run a
    view would still advise on (wire.REPORT_MAX_EVENTS < MAX_EVENTS); it says how to ask."""
    from ddpviz.report import interactive
    from ddpviz.report.html import render
    from tests.report.test_interactive import _data

    if not (interactive.STATIC / "report_view.js").is_file():
        pytest.skip("the front end is not built (cd extension && jlpm build)")
    assert wire.REPORT_MAX_EVENTS < wire.MAX_EVENTS
    trace = Trace(synthetic_run(2, steps=6))
    monkeypatch.setattr(interactive, "REPORT_MAX_EVENTS", len(trace) - 1)
    sent = decoded(_data(render(trace), interactive.ADVICE_ID))
    assert sent.rows == [] and "a report asks" in sent.error and "ddpviz advise" in sent.error
    assert decoded(advice_bytes(trace)).rows  # a view of the same run is advised


def test_a_live_view_sends_the_advice_again_at_its_pace_and_once_more_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpviz.widgets import trace_feed
    from ddpviz.widgets.trace_view import TraceView
    from tests.widgets.test_trace_view import FakeSession, until

    monkeypatch.setattr(trace_feed, "DIAGNOSE_EVERY_S", 0.1)
    monkeypatch.setattr(TraceView, "send", lambda *_a, **_k: None)
    events = synthetic_run(2, steps=6)
    session = FakeSession([e for e in events if e.step < 2])
    view = TraceView(session)
    until(lambda: view.advised >= 1)
    assert decoded(view.advice).error  # 2 steps so far
    session.feed([e for e in events if e.step >= 2])
    until(lambda: decoded(view.advice).error == "")
    session.closed = True
    until(lambda: not view.following)
    until(lambda: view._advisor is None)  # (its last pass, after the source ended)
    assert view.advice == advice_bytes(Trace(events))  # as of all the events
    assert len(view.advice_pace.took) == view.advised >= 2
    view.close()
