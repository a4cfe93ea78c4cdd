"""The TS reader (extension/src/trace.ts) reads COPY frames as Python does (fileformat.py,
[Note: the COPY frame]): the bytes a view sends, with copies, parse to each rank's events in
Python's order and values; its list of copyable types and its bounds are Python's; a hostile
copy is a rejected event, never a thrown error or a crash."""

from __future__ import annotations

import base64
import zlib
from typing import Any

import msgspec

from ddpviz.traces import copies
from ddpviz.traces.fileformat import COPY, EVENTS, FRAME
from ddpviz.traces.trace import Trace
from ddpviz.traces.view_bytes import trace_bytes
from ddpviz.traces.view_summary import summarized, summarized_bytes
from tests.extension.mirror import run_typescript
from tests.widgets.streams import synthetic_run

# per case: each rank's events as plain data, what was rejected and why
OUT = """cases.map(c => {
  const t = g.parseTrace(g.base64ToBytes(c), 'run');
  const byRank = {};
  for (const [r, events] of t.byRank) byRank[r] = events;
  const shared = [...t.byRank.values()].flat().filter(e => e.type === 'ParamsBuilt');
  return { byRank, rejected: t.rejected, reasons: t.rejectReasons, count: t.count,
           sharedParams: shared.every(e => e.params === shared[0].params),
           frames: g.FRAME_KINDS, sources: [...g.COPY_SOURCES].sort(),
           maxCopies: g.MAX_COPIES, maxCopied: g.MAX_COPIED };
})"""


def plain(trace: Trace) -> dict[str, list[dict[str, Any]]]:
    """Each rank's events as the TS reader holds them (msgpack's plain data, integers past
    2**53 as the doubles JavaScript reads them as)."""
    return {str(r): _js(msgspec.msgpack.decode(msgspec.msgpack.encode(trace.events(r))))
            for r in trace.ranks}


def _js(value: Any) -> Any:
    if isinstance(value, list):
        return [_js(v) for v in value]
    if isinstance(value, dict):
        return {k: _js(v) for k, v in value.items()}
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return float(value)
    return value


def parse(*files: bytes) -> list[dict[str, Any]]:
    return run_typescript("trace", OUT, [base64.b64encode(f).decode() for f in files])


def test_ts_reads_a_views_copies_as_python_does() -> None:
    trace = Trace(synthetic_run(5, 150, 2))
    whole, _ = trace_bytes(trace, limit=1 << 30)
    folded, _, _ = summarized_bytes(trace)
    assert bytes([COPY]) in whole and Trace.from_bytes(whole) == trace
    got_whole, got_folded = parse(whole, folded)
    assert got_whole["rejected"] == 0 and got_folded["rejected"] == 0
    assert _js(got_whole["byRank"]) == plain(trace)
    assert _js(got_folded["byRank"]) == plain(summarized(trace)[0])
    assert got_whole["count"] == len(trace)
    assert got_whole["sharedParams"]  # `{...src}`: the copies share the source's lists


def test_ts_knows_pythons_frame_kind_copyable_types_and_bounds() -> None:
    got = parse(trace_bytes(Trace(synthetic_run(1, 4, 1)), limit=1 << 30)[0])[0]
    assert got["frames"]["copy"] == COPY
    assert got["sources"] == sorted(t.__name__ for t in copies.COPY_SOURCES)
    assert (got["maxCopies"], got["maxCopied"]) == (copies.MAX_COPIES, copies.MAX_COPIED)


def _frame(kind: int, obj: object) -> bytes:
    payload = msgspec.msgpack.encode(obj)
    return FRAME.pack(kind, len(payload), zlib.crc32(payload)) + payload


def test_ts_rejects_each_hostile_copy_and_keeps_the_rest() -> None:
    trace = Trace(synthetic_run(2, 150, 1))
    data, _ = trace_bytes(trace, limit=1 << 30)
    built = trace.of_type(copies.ev.ParamsBuilt)[0]
    hot = trace.events(0)[-1]  # a BackwardFinished: hot, never a source
    bad: list[list[Any]] = [
        [9, 0, 0, 0, 0, 999],  # names nothing
        [0, hot.seq, 0, 0, 0, 998],  # a hot event
        [0, built.seq, -1, 0, 0, 997],  # rank out of bounds
        [0, built.seq, 0, -2, 0, 996],  # step out of bounds
        [0, built.seq, 0, 0, 0.5, 995],  # not an int
        [0, built.seq, 0, 0],  # too short
        "copy",
    ]
    later = [5, 0, 0, 0, 0, 994]  # names an event written after it
    good = [0, built.seq, 3, 0, 0, 0]
    after = msgspec.structs.replace(built, rank=5, seq=0)
    hostile = data + _frame(COPY, [*bad, later, good]) + _frame(EVENTS, [after]) \
        + _frame(COPY, {"not": "a list"}) \
        + _frame(COPY, [[0, 0, 0, 0, 0, 0]] * (copies.MAX_COPIES + 1))
    got = parse(hostile)[0]
    assert got["rejected"] == len(bad) + 1 + 2
    assert len(got["byRank"]["3"]) == 1 and got["byRank"]["3"][0]["params"] \
        == got["byRank"]["0"][[e["seq"] for e in got["byRank"]["0"]].index(built.seq)]["params"]
    assert any("no earlier event" in r for r in got["reasons"])
    assert len(got["byRank"]["5"]) == 1  # the later event itself, not the copy before it


def test_a_copy_in_a_live_update_repeats_an_event_of_the_trace_it_continues() -> None:
    """A live view appends frames to the parsed trace in place (trace.ts `appendFrames`): its
    sources are the events read before, in the file and in earlier updates."""
    trace = Trace(synthetic_run(1, 150, 1))
    data, _ = trace_bytes(trace, limit=1 << 30)
    built = trace.of_type(copies.ev.ParamsBuilt)[0]
    update = _frame(COPY, [[0, built.seq, 7, -1, 5, 0]])
    got = run_typescript("trace", """(() => {
      const t = g.parseTrace(g.base64ToBytes(cases[0]), 'run');
      g.appendFrames(t, g.base64ToBytes(cases[1]), 'run');
      const [copy] = t.byRank.get(7);
      const src = t.byRank.get(0).find(e => e.type === 'ParamsBuilt');
      return { copy: { ...copy, params: copy.params.length }, shared: copy.params === src.params,
               rejected: t.rejected };
    })()""", [base64.b64encode(data).decode(), base64.b64encode(update).decode()])
    assert got["rejected"] == 0 and got["shared"]
    assert got["copy"]["type"] == "ParamsBuilt" and got["copy"]["params"] == len(built.params)
    assert [got["copy"][k] for k in ("rank", "step", "t_ns", "seq")] == [7, -1, 5, 0]
