"""TraceView (ddpviz/widgets/trace_view.py): what the kernel sends the browser is the run as one
`.ddpviz` file (a file's own bytes; anything else merged and written as Trace.save writes it),
bounded; the front end is the viewer's code bundled alone (no JupyterLab or Lumino import),
with every JupyterLab theme variable given a fallback for other hosts. Drawing it is tested
in Chromium (tests/browser/test_lab_trace_view.py)."""

from __future__ import annotations

import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.traces.source import SourceError
from ddpviz.traces.trace import Trace
from ddpviz.widgets import trace_feed, trace_view
from ddpviz.widgets.trace_view import TraceView, TraceViewError
from tests.widgets.streams import Plant, synthetic_run


def events_of(trace: Trace) -> dict[int, list[ev.Event]]:
    return {r: list(trace.events(r)) for r in trace.ranks}


def test_a_file_is_sent_as_its_own_bytes(tmp_path: Path) -> None:
    path = Trace(synthetic_run(2, steps=3)).save(tmp_path / "run.ddpviz")
    view = TraceView(path)
    assert view.trace == path.read_bytes()
    assert view.name == "run.ddpviz"


def test_a_trace_or_events_are_sent_as_one_file_that_loads_back_equal(tmp_path: Path) -> None:
    events = synthetic_run(3, steps=2, plant=Plant(missing={1: 2}))
    trace = Trace(events)
    for source in (trace, events):
        view = TraceView(source)
        sent = tmp_path / "sent.ddpviz"
        sent.write_bytes(view.trace)
        assert events_of(Trace.load(sent)) == events_of(trace)
    assert trace.view().trace == TraceView(trace).trace  # Trace.view() is the same widget


def test_a_folder_of_rank_files_is_merged(tmp_path: Path) -> None:
    trace = Trace(synthetic_run(2, steps=2))
    for rank in trace.ranks:
        Trace(list(trace.events(rank))).save(tmp_path / f"rank{rank}.ddpviz")
    sent = tmp_path / "sent.ddpviz"
    sent.write_bytes(TraceView(tmp_path).trace)
    assert events_of(Trace.load(sent)) == events_of(trace)


def test_a_run_over_the_bound_is_refused_with_where_to_look_instead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (just over the bound, a run is drawn with its hooks summarized: test_dashboard.py; over
    # even summarized, it is refused)
    path = Trace(synthetic_run(2, steps=3)).save(tmp_path / "run.ddpviz")
    monkeypatch.setattr(trace_view, "MAX_BYTES", 1000)
    for source in (path, Trace.load(path)):
        with pytest.raises(TraceViewError, match="file browser") as info:
            TraceView(source)
        assert "MiB" in str(info.value)


@pytest.mark.parametrize("kwargs,match", [
    ({"scheme": "rainbow"}, "scheme"), ({"max_events": 0}, "max_events"),
    ({"max_events": True}, "max_events")])
def test_bad_options_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TraceView(synthetic_run(2, steps=1), **kwargs)  # type: ignore[arg-type]


def test_no_kind_of_run_is_refused_as_every_verb_refuses_it() -> None:
    with pytest.raises(SourceError, match="TraceView cannot show"):
        TraceView(42)


def test_the_front_end_is_the_viewers_code_alone_with_a_fallback_for_each_theme_variable(
) -> None:
    js, css = TraceView._esm, TraceView._css
    assert js and css, "the front end is not built (cd extension && jlpm build)"
    assert "@jupyterlab" not in js and "@lumino" not in js
    assert not re.search(r"\bimport\s*[\w{*]", js)  # one module: nothing left to import
    assert re.search(r"export\s*\{[^}]*\bas default\b", js)
    # the viewer's panels (view.ts) are what it draws
    for section in ("verdict", "summary", "findings", "timeline"):
        assert f'"{section}"' in js
    themed = re.findall(r"var\(--jp-[a-z0-9-]+([^)]*)\)", css)
    assert themed and all(rest.startswith(", ") for rest in themed), themed


def test_the_verdict_sent_is_diagnoses_own_findings_as_checked_events(tmp_path: Path) -> None:
    # a parameter missing on rank 1: diagnose() names it (a verification the ranks did not
    # report live in this synthetic run); the healthy twin sends an empty list, not nothing
    sick = Trace(synthetic_run(2, steps=2, plant=Plant(missing={1: 2})))
    healthy = Trace(synthetic_run(2, steps=2))
    for trace in (sick, healthy):
        view = TraceView(trace)
        expected = list(ddpviz.diagnose(trace))
        assert view.findings == expected
        sent = msgspec.msgpack.decode(view.diagnosis, type=list[ev.FindingReported])
        assert [e.finding for e in sent] == expected
    assert TraceView(sick).findings and not TraceView(healthy).findings
    assert TraceView(healthy).diagnosis == msgspec.msgpack.encode([])


def test_refresh_sends_a_live_runs_new_events_and_their_diagnosis() -> None:
    events = synthetic_run(2, steps=3)
    half = len(events) // 2
    live = list(events[:half])
    view = TraceView(live)
    first = view.trace
    live.extend(events[half:])
    view.refresh()
    assert view.trace != first
    assert events_of(Trace.from_bytes(view.trace)) == events_of(Trace(events))
    assert view.findings == list(ddpviz.diagnose(events))


def test_the_schemes_it_accepts_are_the_front_ends_palettes() -> None:
    from tests.extension.mirror import run_typescript

    assert sorted(trace_view.SCHEMES) == sorted(run_typescript(
        "colors", "Object.keys(g.PALETTES)", None))


# --- a live source, followed (See [Note: a live view's wire], ddpviz/widgets/trace_feed.py) ---

class FakeSession:
    """A live Session's shape (traces/source.py's LiveSession): a Trace fed by hand, each
    batch delivered to the subscribers as a collector's thread would."""

    def __init__(self, events: list[ev.Event]) -> None:
        self.trace = Trace(events)
        self.collector = None
        self.closed = False
        self.subscribers: list[Any] = []
        self._lock = threading.Lock()

    def subscribe(self, callback: Any, *, batch: bool = False, replay: bool = False,
                  history: Any = None) -> Any:
        with self._lock:
            history(self.trace)
            self.subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self.subscribers:
                self.subscribers.remove(callback)

        return unsubscribe

    def feed(self, events: list[ev.Event]) -> None:
        with self._lock:
            self.trace.extend(events)
            for callback in list(self.subscribers):
                callback(list(events))


class FakeRun:
    """A ddpviz.Run's shape (LiveRun) over a FakeSession; `status` set by the test."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.status = "running"
        self.nprocs = 2
        self.backend = "gloo"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict[str, Any], bytes]]:
    """Every custom message a TraceView sends: (content, its one buffer). Sends are fast."""
    out: list[tuple[dict[str, Any], bytes]] = []

    def send(self: TraceView, content: dict[str, Any], buffers: Any = None) -> None:
        out.append((content, b"".join(bytes(b) for b in buffers or ())))

    monkeypatch.setattr(TraceView, "send", send)
    monkeypatch.setattr(trace_feed, "EVENTS_HZ", 50.0)
    return out


def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def frames_of(sent: list[tuple[dict[str, Any], bytes]]) -> list[tuple[dict[str, Any], bytes]]:
    return [(c, b) for c, b in sent if c["kind"] == "frames"]


def halves(world: int = 2, steps: int = 4) -> tuple[list[ev.Event], list[ev.Event]]:
    """A run's events cut in two at the same point of every rank."""
    events = synthetic_run(world, steps=steps)
    per = {r: [e for e in events if e.rank == r] for r in range(world)}
    first = [e for r in per for e in per[r][:len(per[r]) // 2]]
    return first, [e for r in per for e in per[r][len(per[r]) // 2:]]


def test_a_live_source_sends_only_the_new_events_as_frames_of_the_same_file(
        sent: list[tuple[dict[str, Any], bytes]]) -> None:
    first, rest = halves()
    session = FakeSession(first)
    view = TraceView(session)
    assert view.live == "running" and view.following
    assert view.trace_events == view.events_sent == len(first)
    assert events_of(Trace.from_bytes(view.trace)) == events_of(Trace(first))
    cut = len(rest) // 3
    for part in (rest[:cut], rest[cut:]):
        before = view.events_sent
        session.feed(part)
        until(lambda before=before, part=part: view.events_sent == before + len(part))
    frames = frames_of(sent)
    assert [(c["base"], c["total"]) for c, _ in frames] == [
        (len(first), len(first) + cut), (len(first) + cut, len(first) + len(rest))]
    # each send is just its new events, as frames that continue the file the view was sent
    empty = bytes(trace_feed.LiveFile({}, {}, {}).data)  # a header and no frame
    for (_, data), part in zip(frames, (rest[:cut], rest[cut:]), strict=True):
        assert events_of(Trace.from_bytes(empty + data)) == events_of(Trace(part))
    whole = Trace.from_bytes(view.trace + b"".join(d for _, d in frames))
    assert events_of(whole) == events_of(session.trace)
    view.close()


def test_nothing_is_sent_while_nothing_is_new(sent: list[tuple[dict[str, Any], bytes]]
                                              ) -> None:
    session = FakeSession(halves()[0])
    view = TraceView(session)
    time.sleep(0.3)  # ~15 ticks
    assert frames_of(sent) == [] and view.sends == 0
    view.close()


def test_a_view_opened_later_gets_the_whole_run_so_far_and_then_the_frames_after_it(
        sent: list[tuple[dict[str, Any], bytes]]) -> None:
    first, rest = halves()
    session = FakeSession(first)
    view = TraceView(session)
    session.feed(rest[:10])
    until(lambda: view.events_sent == len(first) + 10)
    view._on_msg(view, {"kind": "hello", "id": "page-2"}, [])
    content, data = sent[-1]
    assert content == {"kind": "whole", "to": "page-2", "total": len(first) + 10}
    assert events_of(Trace.from_bytes(data)) == events_of(session.trace)
    session.feed(rest[10:])  # the next frames continue that file
    until(lambda: view.events_sent == len(first) + len(rest))
    more = frames_of(sent)[-1]
    assert more[0]["base"] == len(first) + 10
    assert events_of(Trace.from_bytes(data + more[1])) == events_of(session.trace)
    for bad in ({"kind": "hello"}, {"kind": "hello", "id": "x" * 65}, "hello", {"kind": 1}):
        view._on_msg(view, bad, [])  # ignored, no answer
    assert sent[-1] == more
    view.close()


def test_the_thread_sends_the_last_events_and_findings_when_the_run_ends_then_stops(
        sent: list[tuple[dict[str, Any], bytes]]) -> None:
    first, rest = halves()
    run = FakeRun(FakeSession(first))
    view = TraceView(run)
    run.session.feed(rest)
    run.status = "finished"
    until(lambda: not view.following)
    assert view.live == "finished"
    assert view.events_sent == len(first) + len(rest)
    assert view.findings == list(ddpviz.diagnose(run.session.trace))
    assert msgspec.msgpack.decode(view.diagnosis, type=list[ev.FindingReported]) is not None
    assert run.session.subscribers == []  # unsubscribed
    n = len(sent)
    time.sleep(0.1)
    assert len(sent) == n  # nothing after the end


def test_a_closed_session_ends_it_too_and_close_stops_the_thread(
        sent: list[tuple[dict[str, Any], bytes]]) -> None:
    session = FakeSession(halves()[0])
    view = TraceView(session)
    session.closed = True
    until(lambda: not view.following)
    assert view.live == "closed"
    other = FakeSession(halves()[0])
    view = TraceView(other)
    assert view.following
    view.close()
    assert not view.following and other.subscribers == []


def test_a_finished_run_is_sent_once_with_no_thread() -> None:
    first, rest = halves()
    run = FakeRun(FakeSession(first + rest))
    run.status = "finished"
    view = TraceView(run)
    assert not view.following and view.live == ""
    assert view.trace_events == view.events_sent == len(first + rest)


def test_diagnose_runs_at_its_own_slower_pace_even_while_events_pour_in(
        sent: list[tuple[dict[str, Any], bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_feed, "DIAGNOSE_EVERY_S", 0.2)
    real = trace_view.diagnose

    def slow(run: Any) -> Any:  # 40 ms a diagnose: at most 10% of the time -> >= 0.4 s apart
        time.sleep(0.04)
        return real(run)

    monkeypatch.setattr(trace_view, "diagnose", slow)
    events = synthetic_run(2, steps=40)
    session = FakeSession(events[:50])
    view = TraceView(session)
    started = time.monotonic()
    for i in range(50, len(events), 20):
        session.feed(events[i:i + 20])
        time.sleep(0.02)
    until(lambda: view.events_sent == len(events))
    time.sleep(0.5)
    took = time.monotonic() - started
    runs = len(view.pace.took)
    assert 1 <= runs <= took / 0.4 + 1, (runs, took)
    assert view.sends > runs  # events went out far more often than diagnose() ran
    view.close()


def test_new_events_over_a_bound_are_refused_with_a_line_in_the_view(
        sent: list[tuple[dict[str, Any], bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    first, rest = halves()
    monkeypatch.setattr(trace_feed, "MAX_DELTA_BYTES", 200)
    session = FakeSession(first)
    view = TraceView(session)
    session.feed(rest)
    until(lambda: not view.following)
    assert "stopped following the run" in view.notice and "MiB one update" in view.notice
    assert frames_of(sent) == [] and view.events_sent == len(first)
    assert session.subscribers == []
    monkeypatch.setattr(trace_feed, "MAX_DELTA_BYTES", 8 << 20)
    session = FakeSession(first)
    view = TraceView(session)
    monkeypatch.setattr(trace_view, "MAX_BYTES", len(view.trace) + 100)
    session.feed(rest)
    until(lambda: not view.following)
    assert "MiB a TraceView sends in all" in view.notice
    monkeypatch.setattr(trace_view, "MAX_BYTES", 100)
    with pytest.raises(TraceViewError, match="already"):
        TraceView(FakeSession(first))
    monkeypatch.setattr(trace_view, "MAX_BYTES", 64 << 20)
    monkeypatch.setattr(trace_feed, "EVENTS_HZ", 0.01)  # no send of the thread's own here
    session = FakeSession(first)
    view = TraceView(session)
    monkeypatch.setattr(trace_feed, "MAX_DELTA_BYTES", 200)
    session.feed(rest)
    with pytest.raises(TraceViewError, match="stopped following"):
        view.refresh()  # in the caller's thread: said there, and in the view
    assert "stopped following" in view.notice
    view.close()
    assert not view.following and session.subscribers == []


def test_a_real_session_fed_by_senders_sends_each_event_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpviz.transport.sender import Sender
    from tests.widgets.wire import WireCounter

    monkeypatch.setattr(trace_feed, "EVENTS_HZ", 20.0)
    first, rest = halves(2, steps=6)
    with WireCounter() as wire, ddpviz.listen(show=False) as session:
        senders = {r: Sender(session.connect_string, r, batch=16) for r in (0, 1)}
        for e in first:
            senders[e.rank](e)
        for s in senders.values():
            s.flush()
        until(lambda: len(session.trace) == len(first))
        view = TraceView(session)
        opened = wire.total
        for e in rest:
            senders[e.rank](e)
        for s in senders.values():
            s.close()
        until(lambda: view.events_sent == len(first) + len(rest))
        updates = wire.total - opened
    until(lambda: not view.following)
    assert view.live == "closed"
    run = Trace(first + rest)  # (as event frames, as the updates carry it)
    with TraceWriter(Path(tempfile.mkdtemp()) / "r.ddpviz") as w:
        w.write_ranks(run.clock, (run.events(r) for r in run.ranks))
    whole = w.path.stat().st_size
    # the updates carried the second half once (frames of ~60 B an event), not the run again
    assert updates < whole, (updates, whole)


def test_the_front_end_appends_the_frames_to_the_trace_it_parsed_and_refuses_a_bad_one(
        sent: list[tuple[dict[str, Any], bytes]]) -> None:
    from tests.extension.mirror import run_typescript

    first, rest = halves()
    session = FakeSession(first)
    view = TraceView(session)
    cut = len(rest) // 2
    for part in (rest[:cut], rest[cut:]):
        before = view.events_sent
        session.feed(part)
        until(lambda before=before, part=part: view.events_sent == before + len(part))
    view.close()
    frames = [list(d) for _, d in frames_of(sent)]
    assert len(frames) == 2
    torn = frames[1][:-3]
    flipped = [*frames[1][:20], frames[1][20] ^ 1, *frames[1][21:]]
    read = run_typescript("trace", """cases.map(c => { try {
        const t = g.parseTrace(Uint8Array.from(c.file), 'v');
        for (const f of c.frames) g.appendFrames(t, Uint8Array.from(f), 'v');
        return [t.count, t.rejected, [...t.byRank.keys()].sort().map(r => [r,
                t.byRank.get(r).map(e => [e.type, e.seq])])];
      } catch (err) { return String(err.message).split('\\n')[0]; } })""", [
        {"file": list(view.trace), "frames": frames},
        {"file": list(view.trace), "frames": [frames[0], torn]},
        {"file": list(view.trace), "frames": [frames[0], [*flipped, *frames[1]]]}])
    expected = [len(session.trace), 0, [[r, [[type(e).__name__, e.seq] for e in
                                               session.trace.events(r)]]
                                        for r in session.trace.ranks]]
    assert read[0] == expected
    assert "torn frame" in read[1]
    assert "fails its checksum" in read[2]
