"""Traces: save/load equality, crash safety, corruption, Chrome export, HTML report, CLI."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpviz import events as ev
from ddpviz.cli import main as cli_main
from ddpviz.report.html import render
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.traces.trace import Trace, TraceError
from tests.transport.fake_run import rank_events

ROOT = Path(__file__).resolve().parents[2]


def _trace() -> Trace:
    evs = rank_events(0, unused=True) + rank_events(1, hang_in_step=2)
    return Trace(evs, meta={"job": "fake", "world_size": 2}, clock={0: (0, 0), 1: (-5, 12)})


def _bytes_of(trace: Trace) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return trace.save(Path(tmp) / "t.ddpviz").read_bytes()


TRACE_BYTES = _bytes_of(_trace())


def test_save_load_round_trip_is_equal(tmp_path):
    trace = _trace()
    loaded = Trace.load(trace.save(tmp_path / "run.ddpviz"))
    assert loaded == trace
    assert loaded.events(1) == rank_events(1, hang_in_step=2)
    assert loaded.clock == {0: (0, 0), 1: (-5, 12)} and loaded.meta["job"] == "fake"
    assert not loaded.truncated
    assert loaded != Trace(rank_events(0, unused=True), meta=trace.meta, clock=trace.clock)


def test_files_are_data_only_never_pickle(tmp_path):
    path = _trace().save(tmp_path / "run.ddpviz")
    data = path.read_bytes()
    assert data.startswith(b"DDPVIZ") and b"\x80\x04\x95" not in data  # no pickle protocol 4
    with pytest.raises(TraceError, match="not a ddpviz trace"):
        bad = tmp_path / "bad.ddpviz"
        bad.write_bytes(b"\x80\x04\x95" + data)
        Trace.load(bad)


def test_every_truncation_keeps_exactly_the_complete_frames(tmp_path):
    path = tmp_path / "w.ddpviz"
    ends: list[int] = []  # file size after each flush
    counts: list[int] = []
    events = rank_events(0, steps=2)
    with TraceWriter(path, chunk=10_000) as w:
        ends.append(path.stat().st_size)
        counts.append(0)
        for i in range(0, len(events), 7):
            w.write_many(events[i:i + 7])
            w.flush()
            ends.append(path.stat().st_size)
            counts.append(w.count)
    data = path.read_bytes()
    assert Trace.load(path).events(0) == events
    for cut in range(ends[0], len(data) + 1):
        complete = max(i for i, end in enumerate(ends) if end <= cut)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = Trace.from_bytes(data[:cut])
        assert loaded.events(0) == events[:counts[complete]], cut
        torn = cut != ends[complete]
        assert loaded.truncated == torn and (len(caught) == 1) == torn, cut


def test_corruption_before_the_end_is_an_error_not_silent(tmp_path):
    path = tmp_path / "run.ddpviz"
    with TraceWriter(path, chunk=50) as w:
        w.write_many(rank_events(0, steps=20))
    data = bytearray(path.read_bytes())
    data[60] ^= 0xFF  # inside the first events frame, which is followed by more frames
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=r"checksum|does not decode"):
        Trace.load(path)


_WRITER = """
import sys, time
from ddpviz import events as ev
from ddpviz.traces.fileformat import TraceWriter
w = TraceWriter(sys.argv[1], chunk=1_000_000)
tap = ev.Tap(w, 0)
n = 0
while True:
    for i in range(997):
        tap.emit(ev.GradReady, i, n % 7)
    n += 997
    if n % (997 * 3) == 0:
        w.flush()
        print(w.count, flush=True)
"""


def test_killed_writer_leaves_everything_flushed_loadable(tmp_path):
    path = tmp_path / "crash.ddpviz"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    flushed = 0
    try:
        for line in proc.stdout:
            flushed = int(line)
            if flushed >= 60_000:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: it keeps emitting between flushes
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL and flushed >= 60_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn tail may or may not be there
        loaded = Trace.load(path)
    events = loaded.events(0)
    assert len(events) >= flushed and len(events) % (997 * 3) == 0
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(e.param == e.seq % 997 for e in events)  # type: ignore[attr-defined]


def test_chrome_trace_is_valid_json_with_the_expected_spans(tmp_path):
    trace = _trace()
    path = tmp_path / "run.json"
    trace.to_chrome_trace(path)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    by = {(e["pid"], e["name"], e["args"].get("step")) for e in spans}
    for rank in (0, 1):
        assert (rank, "backward", 0) in by and (rank, "forward", 0) in by
        assert (rank, "all-reduce b0", 0) in by and (rank, "all-reduce b1", 0) in by
        assert (rank, "broadcast", -1) in by and (rank, "verify", -1) in by
        assert (rank, "broadcast chunk 0", -1) in by and (rank, "broadcast chunk 1", -1) in by
    # a span's duration is Launched -> Done on that rank's aligned clock (offset -5 on rank 1)
    r1 = {e.seq: e for e in rank_events(1, hang_in_step=2)}
    launched = next(e for e in r1.values() if isinstance(e, ev.AllReduceLaunched)
                    and e.step == 1 and e.bucket == 1)
    done = next(e for e in r1.values() if isinstance(e, ev.AllReduceDone)
                and e.step == 1 and e.bucket == 1)
    span = next(e for e in spans if e["pid"] == 1 and e["name"] == "all-reduce b1"
                and e["args"]["step"] == 1)
    assert span["dur"] == pytest.approx((done.t_ns - launched.t_ns) / 1000)
    t0 = min(e.t_ns + (-5 if e.rank == 1 else 0) for e in trace.events())
    assert span["ts"] == pytest.approx((launched.t_ns - 5 - t0) / 1000)
    # rank 1 hung in step 2: its all-reduce b1 and backward have no end
    unfinished = {(e["name"], e["args"]["step"]) for e in spans
                  if e["pid"] == 1 and e["args"].get("unfinished")}
    assert unfinished == {("all-reduce b1", 2), ("backward", 2)}
    hooks = [e for e in events if e["ph"] == "i" and e["cat"] == "hook"]
    assert len(hooks) == 4 * 3 + 5 * 2 + 5  # rank 0: param 4 unused; rank 1: 3 steps
    lanes = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"phases", "gradient hooks", "all-reduce bucket 0", "all-reduce bucket 1",
            "broadcast lane 0", "broadcast lane 1"} <= lanes
    # spans on one thread never overlap partially (Perfetto would misdraw them)
    per_tid: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in spans:
        per_tid.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for intervals in per_tid.values():
        intervals.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(intervals))


class _Sections(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.tags: list[str] = []
        self.addresses: list[str] = []  # src and href values
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.addresses += [v for k, v in attrs if k in ("src", "href") and v]
        if tag not in ("meta", "rect", "path", "br"):
            self.stack.append(tag)
        self.ids += [v for k, v in attrs if k == "id" and v]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("rect", "path"):
            return
        assert self.stack and self.stack[-1] == tag, (self.stack[-3:], tag)
        self.stack.pop()


def test_report_is_self_contained_with_every_section():
    text = render(_trace())
    parser = _Sections()
    parser.feed(text)
    assert parser.stack == []
    assert {"findings", "summary", "ranks", "verification", "buckets", "timeline"} <= set(
        parser.ids)
    # nothing fetched: no link element, no address in the page's own HTML (the interactive
    # view's bundle names Perfetto's, which it opens on a click only)
    static = _Sections()
    static.feed(render(_trace(), interactive=False))
    assert "link" not in parser.tags and "script" not in static.tags
    assert "http" not in render(_trace(), interactive=False)
    assert not [v for v in parser.addresses if "//" in v or v.startswith("data:")]
    # its one script is ddpviz's own front end; the run, its findings and its bucket advice
    # beside it are data (test_interactive.py)
    assert parser.tags.count("script") in (0, 4)
    # two bucket maps, one timeline per drawn step
    assert text.count("aria-label='bucket sizes'") == 2
    assert text.count("<figure class='step'") >= 1
    assert text.count("<figure class='step'") == text.count("aria-label='timeline of step")
    assert "head.weight" in text and "the same on ranks 0,1" in text
    assert "Bucket map rebuilt in step 0" in text and "Bucket map at construction" in text
    assert "url(#hatch)" in text  # rank 1's unfinished all-reduce is drawn hatched


def test_report_names_mismatches_and_disagreeing_bucket_maps():
    mismatch = ev.Mismatch("param", 2, "fc2.weight", "shape",
                           (("(4, 16)", (0,)), ("(16, 4)", (1,))))
    evs = [ev.VerificationFailed(r, -1, 0, 0, 2, (mismatch,)) for r in (0, 1)]
    evs += [ev.BucketAssigned(0, -1, 1, 1, ((0, 1),), (100,), False),
            ev.BucketAssigned(1, -1, 1, 1, ((1, 0),), (100,), False)]
    text = render(Trace(evs))
    assert "Failed (reported by ranks 0,1): 1 difference" in text and "fc2.weight" in text
    assert "rank 1: (16, 4)" in text and "Ranks disagree" in text


def test_cli_report_merges_per_rank_files(tmp_path, capsys):
    for rank in (0, 1):
        Trace(rank_events(rank), meta={"rank": rank}).save(tmp_path / f"r{rank}.ddpviz")
    out = tmp_path / "report.html"
    code = cli_main(["report", str(tmp_path / "r0.ddpviz"), str(tmp_path / "r1.ddpviz"),
                     "-o", str(out)])
    assert code == 0 and "ranks [0, 1]" in capsys.readouterr().out
    assert "<section id='ranks'>" in out.read_text()
    assert cli_main(["report", str(tmp_path / "missing.ddpviz")]) == 2
    assert "missing.ddpviz" in capsys.readouterr().err


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2000))
def test_any_bytes_load_or_raise_trace_error(noise, where):
    good = bytearray(TRACE_BYTES)
    good[where % len(good):where % len(good) + len(noise)] = noise
    for data in (bytes(good), TRACE_BYTES[:8] + noise):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                trace = Trace.from_bytes(data)
            except TraceError:
                continue
        assert all(isinstance(e, ev.Event) for e in trace.events())


def test_report_formats_bytes_and_caps_in_words():
    params = (ev.ParamInfo(0, "w", (512, 1024), "float32", "cpu", False, 4),
              ev.ParamInfo(1, "b", (1024,), "float16", "cpu", False, 2))
    evs = [ev.ParamsBuilt(0, -1, 0, 0, params, (), ()),
           ev.BucketAssigned(0, -1, 1, 1, ((0,), (1,)), (2**20, (1 << 63) - 1), False)]
    text = render(Trace(evs), interactive=False)  # (the bundle's own code holds such numbers)
    assert "9223372036854775807" not in text and "2097152" not in text
    assert "<td>2.0 MiB</td>" in text
    assert "<td>none (one bucket per dtype and device)</td>" in text  # torch's sys.maxsize
    assert "<td>1.0 MiB</td>" in text and "<td>2.0 KiB</td>" in text


def test_element_size_comes_from_the_event_and_old_traces_fall_back_to_the_dtype():
    recorded = ev.ParamInfo(0, "w", (2,), "float8_e8m0fnu", "cpu", False, 1)
    assert ev.element_size_of(recorded) == 1
    legacy = msgspec.json.decode(
        b'{"index": 0, "name": "w", "shape": [2], "dtype": "bfloat16", "device": "cpu",'
        b' "sparse_grad": false}', type=ev.ParamInfo)
    assert legacy.element_size == 0 and ev.element_size_of(legacy) == 2
    unknown = ev.ParamInfo(0, "w", (2,), "mystery", "cpu", False)
    assert ev.element_size_of(unknown) == 0
