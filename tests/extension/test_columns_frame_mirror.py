"""The TS reader (extension/src/columnsFrame.ts, called by trace.ts) reads COLUMNS frames as
Python does (ddpviz/traces/columnframe.py, [Note: the COLUMNS frame]): a saved trace parses to
each rank's events in Python's order and values; its frame kind and bounds are Python's; a
frame that breaks a rule is rejected events with a reason, never a thrown error or a crash, and
the frames after it are still read. The hostile frames are built here from the format's rules
(not by Python's writer), and Python's reader must refuse each of them too."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from ddpviz import limits
from ddpviz.events import SCHEMA_VERSION
from ddpviz.traces import columnframe
from ddpviz.traces.columns import CODE
from ddpviz.traces.fileformat import EVENTS, FRAME, HEADER, MAGIC, FileHeader
from ddpviz.traces.trace import Trace, TraceError
from ddpviz.traces.view_summary import summarized
from tests.extension.mirror import run_typescript
from tests.extension.test_copy_frames_mirror import _js, plain
from tests.widgets.streams import synthetic_run

# per case: each rank's events as plain data, what was rejected and why
OUT = """cases.map(c => {
  const t = g.parseTrace(g.base64ToBytes(c), 'run');
  const byRank = {};
  for (const [r, events] of t.byRank) byRank[r] = events;
  return { byRank, rejected: t.rejected, reasons: t.rejectReasons, count: t.count,
           format: t.format, frames: g.FRAME_KINDS, version: g.FORMAT_VERSION };
})"""

NAMES = ("step", "t_ns", "seq", "a", "b", "s", "c", "d", "e")


def columns_payload(rank: Any, rows: Sequence[tuple[int, ...]], strings: list[str] | None = None,
                    widths: list[int] | None = None, head_rows: Any = None,
                    head: Any = None) -> bytes:
    """A COLUMNS payload as the spec lays it out: the head `[rank, rows, widths, strings]`
    (msgpack), then the columns kind (u8), step, t_ns, seq, a, b, s (and c, d, e: a wide
    frame), little-endian signed of their widths. `rows`: (kind, step, t_ns, seq, a, b, s) each,
    or (..., s, c, d, e); the widths default to the fewest bytes holding each column;
    `head_rows`/`head` replace the head's rows or the head."""
    cols = list(zip(*rows, strict=True)) if rows else [()] * 7
    if widths is None:
        widths = [_width(c) for c in cols[1:]]
    if head is None:
        head = [rank, len(rows) if head_rows is None else head_rows, widths, strings or []]
    out = [msgspec.msgpack.encode(head), bytes(cols[0])]
    for values, w in zip(cols[1:], widths, strict=False):
        out.append(b"".join(v.to_bytes(w, "little", signed=True) for v in values))
    return b"".join(out)


def _width(values: tuple[int, ...]) -> int:
    return next(w for w in (1, 2, 4, 8)
                if all(-(1 << (8 * w - 1)) <= v < 1 << (8 * w - 1) for v in values))


def frame(kind: int, payload: bytes) -> bytes:
    return FRAME.pack(kind, len(payload), zlib.crc32(payload)) + payload


def trace_file(*frames: bytes, fmt: int = 3) -> bytes:
    header = msgspec.msgpack.encode(FileHeader(fmt, SCHEMA_VERSION, {}))
    return MAGIC + frame(HEADER, header) + b"".join(frames)


def parse(*files: bytes) -> list[dict[str, Any]]:
    return run_typescript("trace", OUT, [base64.b64encode(f).decode() for f in files])


def python_reads(payload: bytes) -> bool:
    """Whether Python's reader takes the payload (False: it is damage there too)."""
    try:
        columnframe.decode_columns(payload, CODE)
    except (columnframe.ColumnsError, msgspec.MsgspecError, ValueError):
        return False
    return True


# one row of each kind, the 8-byte values past 2**53
BIG = (1 << 62) - 1
GOOD = [
    (4, 0, 100, 0, 0, 0, -1),
    (5, 0, 200, 1, 0, 0, -1),
    (0, 0, 300, 2, 5, 1, -1),
    (1, 0, 400, 3, 1, 0, -1),
    (3, 0, 500, 4, 1, limits.MAX_BYTES, 1),
    (3, 1, -limits.MAX_COUNT, 5, 0, 9, 0),
    (2, limits.MAX_STEP, limits.MAX_COUNT, limits.MAX_COUNT, 1, 0, -1),
    (6, -1, BIG, BIG - 1, 0, 0, -1),
    (0, 2, 600, 7, limits.MAX_PARAMS - 1, limits.MAX_BUCKETS - 1, -1),
]
STRINGS = ["float32", "bfloat16"]
TYPES = ["GradReady", "BucketReady", "AllReduceDone", "AllReduceLaunched", "ForwardStarted",
         "BackwardStarted", "BackwardFinished", "GradsSummarized"]
# a wide frame (9 widths): GOOD's rows with c, d, e 0, and GradsSummarized rows (kind 7) at
# their bounds
GOOD_WIDE = [*((*row, 0, 0, 0) for row in GOOD),
             (7, 0, 700, 8, 1, 40, -1, 650, 690, 4096),
             (7, 1, 800, 9, limits.MAX_BUCKETS - 1, limits.MAX_PARAMS, -1, -limits.MAX_COUNT,
              limits.MAX_COUNT, limits.MAX_BYTES),
             (7, 2, 900, 10, 0, 0, -1, BIG, -BIG, 0)]


def expected(rank: int, rows: Sequence[tuple[int, ...]],
             strings: list[str]) -> list[dict[str, Any]]:
    """The events of rows as the TS reader holds them (the spec's table, Python's key order)."""
    out = []
    for k, step, t, seq, a, b, s, *cde in rows:
        e: dict[str, Any] = {"type": TYPES[k], "rank": rank, "step": step, "t_ns": t, "seq": seq}
        if k == 0:
            e |= {"param": a, "bucket": b}
        elif k in (1, 2):
            e |= {"bucket": a}
        elif k == 3:
            e |= {"bucket": a, "nbytes": b, "dtype": strings[s]}
        elif k == 7:
            e |= {"bucket": a, "n_grads": b, "first_t_ns": cde[0], "last_t_ns": cde[1],
                  "nbytes": cde[2]}
        out.append(e)
    return _js(out)


def test_ts_reads_a_saved_trace_as_python_does(tmp_path: Path) -> None:
    trace = Trace(synthetic_run(3, 60, 3))
    path = trace.save(tmp_path / "run.ddpviz")
    data = path.read_bytes()
    assert Trace.load(path) == trace
    kinds = []
    pos = len(MAGIC)
    while pos < len(data):
        kind, length, _ = FRAME.unpack_from(data, pos)
        kinds.append(kind)
        pos += FRAME.size + length
    assert columnframe.COLUMNS in kinds and EVENTS in kinds  # both, interleaved per rank
    got = parse(data)[0]
    assert got["rejected"] == 0 and got["reasons"] == []
    assert got["format"] == 2 and got["count"] == len(trace)
    by_rank = _js(got["byRank"])
    assert by_rank == plain(trace)
    # keys in Python's order, as a msgpack event map decodes to
    assert all(list(a) == list(b) for r, events in plain(trace).items()
               for a, b in zip(by_rank[r], events, strict=True))


def test_ts_reads_every_kind_and_wide_values_as_the_spec_says() -> None:
    payload = columns_payload(7, GOOD, STRINGS)
    assert python_reads(payload)
    wide = columns_payload(7, GOOD, STRINGS, widths=[8] * 6)  # every column 8 bytes wide
    assert python_reads(wide)
    v1 = trace_file(frame(columnframe.COLUMNS, payload), fmt=1)  # a format-1 file: read too
    got = parse(trace_file(frame(columnframe.COLUMNS, payload)),
                trace_file(frame(columnframe.COLUMNS, wide)), v1)
    for g in got:
        assert g["rejected"] == 0, g["reasons"]
        assert _js(g["byRank"]["7"]) == expected(7, GOOD, STRINGS)
        assert [list(e) for e in g["byRank"]["7"]] == [list(e) for e in
                                                        expected(7, GOOD, STRINGS)]
    assert [g["format"] for g in got] == [3, 3, 1]
    # a name of MAX_NAME characters (Python counts code points: 2 UTF-16 units each here)
    names = ["\U0001f600" * limits.MAX_NAME, "é"]
    rows = [(3, 0, 0, 0, 0, 0, 0), (3, 0, 0, 1, 0, 0, 1)]
    astral = columns_payload(2, rows, names)
    assert python_reads(astral)
    read = parse(trace_file(frame(columnframe.COLUMNS, astral)))[0]
    assert read["rejected"] == 0 and read["byRank"]["2"] == expected(2, rows, names)


def test_ts_knows_pythons_frame_kind_version_and_bounds() -> None:
    got = parse(trace_file())[0]
    assert got["frames"]["columns"] == columnframe.COLUMNS == 6
    from ddpviz.traces import fileformat
    assert got["version"] == fileformat.FORMAT_VERSION == 3
    consts = run_typescript("columnsFrame", "[g.MAX_COLUMN_ROWS, g.MAX_COLUMN_STRINGS, "
                            "g.COLUMN_TYPES]", [])
    assert consts == [columnframe.MAX_COLUMN_ROWS, columnframe.MAX_COLUMN_STRINGS,
                      [t.__name__ for t in columnframe.TYPES]]
    assert consts[:2] == [1 << 20, 4096]


def test_other_formats_are_still_refused() -> None:
    err = run_typescript("trace", """cases.map(c => { try { g.parseTrace(
      g.base64ToBytes(c), 'run'); return null; } catch (e) { return String(e.message); } })""",
                         [base64.b64encode(trace_file(fmt=f)).decode() for f in (0, 4)])
    assert all("formats 1, 2 and 3" in e for e in err)
    with pytest.raises(TraceError, match="formats 1, 2 and 3"):
        Trace.from_bytes(trace_file(fmt=4))


def test_ts_reads_a_wide_frame_as_the_spec_says() -> None:
    """A frame of 9 widths: its rows of every kind, GradsSummarized's fields from c, d, e; in
    a format-2 or -3 file alike (and every column 8 bytes wide)."""
    payload = columns_payload(4, GOOD_WIDE, STRINGS)
    wide = columns_payload(4, GOOD_WIDE, STRINGS, widths=[8] * 9)
    assert python_reads(payload) and python_reads(wide)
    got = parse(trace_file(frame(columnframe.COLUMNS, payload)),
                trace_file(frame(columnframe.COLUMNS, wide)),
                trace_file(frame(columnframe.COLUMNS, payload), fmt=2))
    want = expected(4, GOOD_WIDE, STRINGS)
    for g in got:
        assert g["rejected"] == 0, g["reasons"]
        assert _js(g["byRank"]["4"]) == want
        assert [list(e) for e in g["byRank"]["4"]] == [list(e) for e in want]  # Python's order
    # Python reads the same events from the same bytes
    events = columnframe.events_of(columnframe.decode_columns(payload, CODE), CODE)
    assert _js([msgspec.to_builtins(e) for e in events]) == want


def test_ts_reads_a_saved_run_with_summaries_as_python_does(tmp_path: Path) -> None:
    """A trace holding GradsSummarized events (recorded at detail "buckets", or a view's
    summary) is saved with them in wide COLUMNS frames, as format 3; TS reads it as Python
    does."""
    trace, _ = summarized(Trace(synthetic_run(3, 60, 3)))
    path = trace.save(tmp_path / "run.ddpviz")
    assert Trace.load(path) == trace
    data = path.read_bytes()
    wide = []
    pos = len(MAGIC)
    while pos < len(data):
        kind, length, _ = FRAME.unpack_from(data, pos)
        if kind == columnframe.COLUMNS:
            head = data[pos + FRAME.size:pos + FRAME.size + length]
            wide.append(len(msgspec.msgpack.Decoder().decode(head[:columnframe._head_end(
                memoryview(head))])[2]) == columnframe.WIDE)
        pos += FRAME.size + length
    assert any(wide)
    got = parse(data)[0]
    assert got["rejected"] == 0 and got["reasons"] == []
    assert got["format"] == 3 and got["count"] == len(trace)
    by_rank = _js(got["byRank"])
    assert by_rank == plain(trace)
    assert all(list(a) == list(b) for r, events in plain(trace).items()
               for a, b in zip(by_rank[r], events, strict=True))


OK = (0, 0, 300, 2, 5, 1, -1)
WIDE_OK = (*OK, 0, 0, 0)
SUMMARY = (7, 0, 300, 3, 1, 40, -1, 250, 290, 4096)
HOSTILE: dict[str, tuple[bytes, int]] = {  # name: (payload, rows rejected)
    "payload short": (columns_payload(0, [OK, OK])[:-1], 2),
    "payload long": (columns_payload(0, [OK, OK]) + b"\0", 2),
    "head cut short": (columns_payload(0, [OK])[:3], 1),
    "rows 0": (columns_payload(0, []), 1),
    "rows past max": (columns_payload(0, [OK], head_rows=columnframe.MAX_COLUMN_ROWS + 1), 1),
    "rows negative": (columns_payload(0, [OK], head_rows=-1), 1),
    "width 3": (columns_payload(0, [OK], widths=[1, 3, 1, 1, 1, 1]), 1),
    "widths 5": (columns_payload(0, [OK, OK], widths=[1, 2, 1, 1, 1]), 2),
    "widths 7": (columns_payload(0, [OK], widths=[1, 2, 1, 1, 1, 1, 1]), 1),
    "too many strings": (columns_payload(0, [OK, OK],
                                         ["x"] * (columnframe.MAX_COLUMN_STRINGS + 1)), 2),
    "string too long": (columns_payload(0, [OK, OK], ["x" * (limits.MAX_NAME + 1)]), 2),
    "string of astral characters": (columns_payload(0, [OK], ["\U0001f600" * limits.MAX_NAME
                                                              + "x"]), 1),
    "string not UTF-8": (columns_payload(0, [OK], ["flo@t32"]).replace(b"flo@", b"flo\xff"),
                         1),
    "kind 7": (columns_payload(0, [OK, (7, 0, 0, 0, 0, 0, -1)]), 2),
    "wide: kind 8": (columns_payload(0, [WIDE_OK, (8, 0, 0, 0, 0, 0, -1, 0, 0, 0)]), 2),
    "wide: widths 8": (columns_payload(0, [WIDE_OK], widths=[2] * 8), 1),
    "wide: widths 10": (columns_payload(0, [WIDE_OK], widths=[2] * 10), 1),
    "wide: payload short": (columns_payload(0, [WIDE_OK, SUMMARY])[:-1], 2),
    "wide: c 1 for GradReady": (columns_payload(0, [(0, 0, 0, 0, 0, 0, -1, 1, 0, 0)]), 1),
    "wide: d -1 for AllReduceLaunched": (columns_payload(
        0, [(3, 0, 0, 0, 0, 0, 0, 0, -1, 0)], ["f"]), 1),
    "wide: e 1 for ForwardStarted": (columns_payload(0, [(4, 0, 0, 0, 0, 0, -1, 0, 0, 1)]), 1),
    "wide: first_t_ns past MAX_COUNT": (columns_payload(
        0, [SUMMARY, (7, 0, 0, 0, 0, 0, -1, limits.MAX_COUNT + 1, 0, 0)]), 2),
    "wide: last_t_ns below -MAX_COUNT": (columns_payload(
        0, [(7, 0, 0, 0, 0, 0, -1, 0, -limits.MAX_COUNT - 1, 0)]), 1),
    "wide: nbytes -1": (columns_payload(0, [(7, 0, 0, 0, 0, 0, -1, 0, 0, -1)]), 1),
    "wide: n_grads past MAX_PARAMS": (columns_payload(
        0, [(7, 0, 0, 0, 0, limits.MAX_PARAMS + 1, -1, 0, 0, 0)]), 1),
    "wide: bucket MAX_BUCKETS": (columns_payload(
        0, [(7, 0, 0, 0, limits.MAX_BUCKETS, 0, -1, 0, 0, 0)]), 1),
    "wide: s 0 for GradsSummarized": (columns_payload(0, [(7, 0, 0, 0, 0, 0, 0, 0, 0, 0)],
                                                      ["f"]), 1),
    "step -2": (columns_payload(0, [OK, (4, -2, 0, 0, 0, 0, -1)]), 2),
    "step past MAX_STEP": (columns_payload(0, [(4, limits.MAX_STEP + 1, 0, 0, 0, 0, -1)]), 1),
    "t_ns past MAX_COUNT": (columns_payload(0, [OK, (4, 0, limits.MAX_COUNT + 1, 0, 0, 0, -1)]),
                            2),
    "t_ns below -MAX_COUNT": (columns_payload(0, [(4, 0, -limits.MAX_COUNT - 1, 0, 0, 0, -1)]),
                              1),
    "seq -1": (columns_payload(0, [(4, 0, 0, -1, 0, 0, -1)]), 1),
    "seq past MAX_COUNT": (columns_payload(0, [(4, 0, 0, limits.MAX_COUNT + 1, 0, 0, -1)]), 1),
    "param MAX_PARAMS": (columns_payload(0, [(0, 0, 0, 0, limits.MAX_PARAMS, 0, -1)]), 1),
    "param -1": (columns_payload(0, [(0, 0, 0, 0, -1, 0, -1)]), 1),
    "bucket MAX_BUCKETS": (columns_payload(0, [(0, 0, 0, 0, 0, limits.MAX_BUCKETS, -1)]), 1),
    "BucketReady's bucket MAX_BUCKETS": (columns_payload(0, [(1, 0, 0, 0, limits.MAX_BUCKETS, 0,
                                                              -1)]), 1),
    "nbytes -1": (columns_payload(0, [(3, 0, 0, 0, 0, -1, 0)], ["f"]), 1),
    "s past the strings": (columns_payload(0, [(3, 0, 0, 0, 0, 0, 1)], ["f"]), 1),
    "s -1 for a launch": (columns_payload(0, [(3, 0, 0, 0, 0, 0, -1)], ["f"]), 1),
    "s of no strings": (columns_payload(0, [(3, 0, 0, 0, 0, 0, 0)]), 1),
    "s 0 for kind 0": (columns_payload(0, [(0, 0, 0, 0, 0, 0, 0)], ["f"]), 1),
    "b 1 for BucketReady": (columns_payload(0, [(1, 0, 0, 0, 0, 1, -1)]), 1),
    "a 1 for ForwardStarted": (columns_payload(0, [(4, 0, 0, 0, 1, 0, -1)]), 1),
    "b 1 for BackwardFinished": (columns_payload(0, [(6, 0, 0, 0, 0, 1, -1)]), 1),
    "head a map": (columns_payload(0, [OK], head={"rank": 0, "rows": 1}), 1),
    "head of 3": (columns_payload(0, [OK], head=[0, 1, [1] * 6]), 1),
    "head of 5": (columns_payload(0, [OK], head=[0, 1, [1] * 6, [], 0]), 1),
    "head's rank a float": (columns_payload(0, [OK], head=[0.0, 1, [1] * 6, []]), 1),
    "head's rows a string": (columns_payload(0, [OK], head=[0, "1", [1] * 6, []]), 1),
    "head's string an int": (columns_payload(0, [OK], head=[0, 1, [1] * 6, [5]]), 1),
    "rank -1": (columns_payload(-1, [OK]), 1),
    "rank MAX_WORLD_SIZE": (columns_payload(limits.MAX_WORLD_SIZE, [OK, OK]), 2),
    "not msgpack": (b"\xc1" * 20, 1),
    "empty": (b"", 1),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_python_refuses_each_hostile_frame_too(name: str) -> None:
    assert not python_reads(HOSTILE[name][0])


def test_ts_rejects_each_hostile_frame_and_reads_the_frames_after_it() -> None:
    good = columns_payload(3, GOOD, STRINGS)
    files = [trace_file(frame(columnframe.COLUMNS, payload), frame(columnframe.COLUMNS, good))
             for payload, _ in HOSTILE.values()]
    got = parse(*files)
    for name, (_, rows), g in zip(HOSTILE, HOSTILE.values(), got, strict=True):
        assert g["rejected"] == rows, name
        at = len(trace_file())  # the damaged frame's offset: right after the header
        assert g["reasons"] == [g["reasons"][0]] and g["reasons"][0].startswith(
            f"a COLUMNS frame at byte {at}: "), name
        assert list(g["byRank"]) == ["3"], name  # nothing of the damaged frame kept
        assert _js(g["byRank"]["3"]) == expected(3, GOOD, STRINGS), name
        assert g["count"] == len(GOOD), name


def test_ts_rejection_reasons_say_what_was_wrong() -> None:
    cases = {"kind 7": "kind 7 at row 1", "step -2": "step = -2 at row 1",
             "wide: kind 8": "kind 8 at row 1: a row's kind is 0 to 7",
             "wide: widths 8": "an array of 8 where the format has 6 or 9",
             "wide: c 1 for GradReady": "c = 1 at row 0, out of [0, 0] for a GradReady",
             "wide: first_t_ns past MAX_COUNT": f"c = {limits.MAX_COUNT + 1} at row 1, out of "
                                                f"[{-limits.MAX_COUNT}, {limits.MAX_COUNT}]",
             "wide: nbytes -1": f"e = -1 at row 0, out of [0, {limits.MAX_BYTES}] for a "
                                "GradsSummarized",
             "wide: n_grads past MAX_PARAMS": f"b = {limits.MAX_PARAMS + 1} at row 0, out of "
                                              f"[0, {limits.MAX_PARAMS}] for a GradsSummarized",
             "t_ns past MAX_COUNT": f"t_ns = {limits.MAX_COUNT + 1} at row 1",
             "seq past MAX_COUNT": f"seq = {limits.MAX_COUNT + 1} at row 0",
             "payload long": "bytes where its head says", "width 3": "column widths",
             "a 1 for ForwardStarted": "a = 1 at row 0, out of [0, 0] for a ForwardStarted",
             "nbytes -1": f"b = -1 at row 0, out of [0, {limits.MAX_BYTES}]",
             "head of 5": "an array of 5 where the format has 4",
             "rank -1": "rank -1", "rows past max": "1048577 rows"}
    got = parse(*(trace_file(frame(columnframe.COLUMNS, HOSTILE[c][0])) for c in cases))
    for (name, needle), g in zip(cases.items(), got, strict=True):
        assert needle in g["reasons"][0], (name, g["reasons"])


def test_columns_append_to_a_ranks_events_in_file_order() -> None:
    """A COLUMNS frame's rows follow the rank's events of the frames before it (an EVENTS
    frame between two COLUMNS frames stays in between), in a file and in a live update."""
    first = columns_payload(1, GOOD[:3])
    second = columns_payload(1, GOOD[3:], STRINGS)
    rare = msgspec.msgpack.encode([{"type": "ForwardStarted", "rank": 1, "step": 9,
                                    "t_ns": 9, "seq": 99}])
    data = trace_file(frame(columnframe.COLUMNS, first), frame(EVENTS, rare))
    update = frame(columnframe.COLUMNS, second) + frame(columnframe.COLUMNS, b"bad")
    got = run_typescript("trace", """(() => {
      const t = g.parseTrace(g.base64ToBytes(cases[0]), 'run');
      g.appendFrames(t, g.base64ToBytes(cases[1]), 'run');
      return { events: t.byRank.get(1), rejected: t.rejected, count: t.count };
    })()""", [base64.b64encode(data).decode(), base64.b64encode(update).decode()])
    want = [*expected(1, GOOD[:3], []), msgspec.msgpack.decode(rare)[0],
            *expected(1, GOOD[3:], STRINGS)]
    assert _js(got["events"]) == _js(want)
    assert got["rejected"] == 1 and got["count"] == len(GOOD) + 1


def test_a_million_row_frame_parses() -> None:
    """The largest frame a writer may write (MAX_COLUMN_ROWS rows) is read whole; how long
    it takes is printed (pytest -s)."""
    n = columnframe.MAX_COLUMN_ROWS
    rng = np.random.default_rng(0)
    kind = rng.choice([0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6], size=n).astype(np.uint8)
    launched = kind == 3
    cols = [np.arange(n) // 10_000, 1_700_000_000_000_000_000 + np.arange(n) * 1000,
            np.arange(n), np.where(kind < 4, np.arange(n) % 1000, 0),
            np.where(kind == 0, np.arange(n) % 100, np.where(launched, 1 << 20, 0)),
            np.where(launched, np.arange(n) % 2, -1)]
    widths = [2, 8, 4, 2, 4, 1]
    head = msgspec.msgpack.encode([5, n, widths, STRINGS])
    payload = head + kind.tobytes() + b"".join(
        c.astype(f"<i{w}").tobytes() for c, w in zip(cols, widths, strict=True))
    assert python_reads(payload)
    got = run_typescript("trace", """(() => {
      const data = g.base64ToBytes(cases[0]);
      let best = Infinity, t;
      for (let i = 0; i < 3; i++) {
        const start = performance.now();
        t = g.parseTrace(data, 'run');
        best = Math.min(best, performance.now() - start);
      }
      const e = t.byRank.get(5);
      return { ms: best, rejected: t.rejected, n: e.length, last: e[e.length - 1],
               launched: e.find(x => x.type === 'AllReduceLaunched') };
    })()""", [base64.b64encode(trace_file(frame(columnframe.COLUMNS, payload))).decode()])
    print(f"\n1M-row COLUMNS frame: parseTrace best of 3 in node: {got['ms']:.0f} ms")
    assert got["rejected"] == 0 and got["n"] == n
    last = n - 1
    assert _js(got["last"]["t_ns"]) == float(int(cols[1][last])) and got["last"]["seq"] == last
    assert got["launched"]["dtype"] in STRINGS and got["launched"]["nbytes"] == 1 << 20
    assert got["ms"] < 5000  # linear: ~0.5 s here (a shared, loaded machine); slack for CI
