"""Hostile COLUMNS frames (columnframe.py, [Note: the COLUMNS frame]): every rule of the frame
broken once (lengths, widths, rows, strings, kinds, each column's bounds, the fields a type does
not have); each is a TraceError naming the frame and the rule, from Trace.load and from the
TailReader, and the events before it stay read; a big frame loads in linear time. The TS
reader's side is tests/extension/test_columns_frame_mirror.py."""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.traces.columnframe import COLUMNS, MAX_COLUMN_ROWS, MAX_COLUMN_STRINGS
from ddpviz.traces.fileformat import FRAME, TailReader, TraceWriter
from ddpviz.traces.trace import Trace, TraceError
from tests.traces.tailed import tail_read, tailed_events

FIRST = ev.ForwardStarted(rank=0, step=0, t_ns=1, seq=0)
NAMES = ("step", "t_ns", "seq", "a", "b", "s", "c", "d", "e")
WIDE = (8,) * 9  # a wide frame's widths: the columns c, d, e too (GradsSummarized's)


def payload(rows: list[dict[str, int]], *, rank: int = 0, widths: Any = (8,) * 6,
            strings: Any = ("torch.float32",), head: Any = None, extra: bytes = b"",
            n: int | None = None) -> bytes:
    """A COLUMNS payload of these rows (each: kind and the columns, missing ones 0, s -1; c,
    d and e with 9 widths)."""
    n = len(rows) if n is None else n
    out = msgspec.msgpack.encode([rank, n, list(widths), list(strings)] if head is None
                                 else head)
    out += bytes(r.get("kind", 0) for r in rows)
    for name, w in zip(NAMES, widths, strict=False):
        default = -1 if name == "s" else 0
        out += b"".join(r.get(name, default).to_bytes(w, "little", signed=True) for r in rows)
    return out + extra


def file_with(path: Path, *payloads: bytes) -> Path:
    with TraceWriter(path) as w:
        w.write_many([FIRST])
    with open(path, "ab") as f:
        for p in payloads:
            f.write(FRAME.pack(COLUMNS, len(p), zlib.crc32(p)) + p)
    return path


GOOD = {"kind": 0, "step": 1, "t_ns": 5, "seq": 1, "a": 3, "b": 0}
SUMMARY = {"kind": 7, "step": 1, "t_ns": 9, "seq": 2, "a": 0, "b": 10, "c": 3, "d": 8,
           "e": 40}


@pytest.mark.parametrize(("frame", "why"), [
    (payload([GOOD], extra=b"\0"), "bytes where its head says"),
    (payload([GOOD])[:-1], "bytes where its head says"),
    (payload([GOOD], n=0), "holds 0 rows"),
    (payload([GOOD], n=MAX_COLUMN_ROWS + 1), f"holds {MAX_COLUMN_ROWS + 1:,} rows"),
    (payload([GOOD], widths=(8, 8, 8, 3, 8, 8)), "each must be 1, 2, 4 or 8"),
    (payload([GOOD], widths=(8,) * 5), "array of 5 where the format has 6"),
    (payload([GOOD], strings=("x",) * (MAX_COLUMN_STRINGS + 1)), "strings, over the"),
    (payload([GOOD], strings=("x" * (limits.MAX_NAME + 1),)), "length"),
    (payload([GOOD], head=[0, 1, [8] * 6]), "array of 3 where the format has 4"),
    (payload([GOOD], head="columns"), "where the format has an array"),
    (payload([GOOD], rank=limits.MAX_WORLD_SIZE), "its head's rank: Expected `int` <= 131071"),
    (payload([{**GOOD, "kind": 7}]), "kind 7 at row 0"),
    (payload([{**GOOD, "step": -2}]), "step = -2"),
    (payload([{**GOOD, "step": limits.MAX_STEP + 1}]), "step = "),
    (payload([{**GOOD, "t_ns": limits.MAX_COUNT + 1}]), "t_ns = "),
    (payload([{**GOOD, "t_ns": -limits.MAX_COUNT - 1}]), "t_ns = "),
    (payload([{**GOOD, "seq": -1}]), "seq = -1"),
    (payload([{**GOOD, "a": limits.MAX_PARAMS}]), f"a = {limits.MAX_PARAMS} at row 0"),
    (payload([{**GOOD, "b": limits.MAX_BUCKETS}]), "for a GradReady"),
    (payload([{**GOOD, "s": 0}]), "not an AllReduceLaunched"),
    (payload([{**GOOD, "kind": 3, "s": 1}]), "s (AllReduceLaunched's dtype) = 1"),
    (payload([{**GOOD, "kind": 3, "s": -1}]), "AllReduceLaunched's dtype) = -1"),
    (payload([{**GOOD, "kind": 1, "b": 1}]), "b = 1 at row 0, out of [0, 0] for a BucketReady"),
    (payload([{**GOOD, "kind": 4, "a": 1}]), "out of [0, 0] for a ForwardStarted"),
    (payload([{**GOOD, "kind": 3, "s": 0, "b": -1}]), "b = -1"),
    # a wide frame (9 widths): kind 7, GradsSummarized, and the columns c, d, e
    (payload([GOOD], widths=(8,) * 8), "array of 8 where the format has 6 or 9"),
    (payload([GOOD], widths=(8,) * 10), "array of 10 where the format has 6 or 9"),
    (payload([{**GOOD, "kind": 7}]), "kind 7 at row 0: a row's kind is 0 to 6"),
    (payload([SUMMARY, {**SUMMARY, "kind": 8}], widths=WIDE), "kind 8 at row 1"),
    (payload([SUMMARY], widths=WIDE, extra=b"\0"), "bytes where its head says"),
    (payload([{**GOOD, "c": 1}], widths=WIDE), "c = 1 at row 0, out of [0, 0] for a GradReady"),
    (payload([{**GOOD, "kind": 3, "s": 0, "d": -1}], widths=WIDE), "d = -1 at row 0"),
    (payload([{**GOOD, "kind": 4, "a": 0, "e": 1}], widths=WIDE),
     "e = 1 at row 0, out of [0, 0] for a ForwardStarted"),
    (payload([SUMMARY, {**SUMMARY, "c": limits.MAX_COUNT + 1}], widths=WIDE),
     f"c = {limits.MAX_COUNT + 1} at row 1"),
    (payload([{**SUMMARY, "d": -limits.MAX_COUNT - 1}], widths=WIDE),
     f"d = {-limits.MAX_COUNT - 1} at row 0"),
    (payload([{**SUMMARY, "e": -1}], widths=WIDE), "e = -1 at row 0"),
    (payload([{**SUMMARY, "b": limits.MAX_PARAMS + 1}], widths=WIDE),
     f"b = {limits.MAX_PARAMS + 1} at row 0, out of [0, {limits.MAX_PARAMS}] for a "
     "GradsSummarized"),
    (payload([{**SUMMARY, "a": limits.MAX_BUCKETS}], widths=WIDE),
     f"a = {limits.MAX_BUCKETS} at row 0"),
    (payload([{**SUMMARY, "s": 0}], widths=WIDE), "not an AllReduceLaunched"),
])
def test_a_broken_rule_is_a_trace_error_naming_the_frame(tmp_path: Path, frame: bytes,
                                                         why: str) -> None:
    path = file_with(tmp_path / "t.ddpviz", frame)
    with pytest.raises(TraceError, match="frame at byte") as info:
        Trace.load(path)
    assert why in str(info.value)
    # the followed file's reader says the same, with the events before it kept
    reader = TailReader(path)
    with pytest.raises(TraceError) as tail:
        tail_read(reader, path)
    assert why in str(tail.value) and reader.events == 1


def test_a_valid_frame_of_every_width_loads(tmp_path: Path) -> None:
    rows = [{"kind": 3, "step": 2, "t_ns": -7, "seq": 9, "a": 1, "b": 300, "s": 0},
            {"kind": 0, "step": -1, "t_ns": 1 << 40, "seq": 10, "a": 2, "b": 1}]
    for widths in ((1, 8, 1, 1, 2, 1), (2, 8, 4, 4, 4, 2), (8,) * 6):
        trace = Trace.load(file_with(tmp_path / "t.ddpviz", payload(rows, widths=widths)))
        assert trace.events(0)[1:] == [
            ev.AllReduceLaunched(0, 2, -7, 9, 1, 300, "torch.float32"),
            ev.GradReady(0, -1, 1 << 40, 10, 2, 1)]


def test_a_valid_wide_frame_loads_in_trace_load_and_the_tail_reader(tmp_path: Path) -> None:
    rows = [{**GOOD, "seq": 1}, {**SUMMARY, "t_ns": -1, "c": -limits.MAX_COUNT,
                                 "d": limits.MAX_COUNT, "e": limits.MAX_BYTES},
            {"kind": 3, "step": 2, "t_ns": -7, "seq": 9, "a": 1, "b": 300, "s": 0}]
    want = [ev.GradReady(0, 1, 5, 1, 3, 0),
            ev.GradsSummarized(0, 1, -1, 2, 0, 10, -limits.MAX_COUNT, limits.MAX_COUNT,
                               limits.MAX_BYTES),
            ev.AllReduceLaunched(0, 2, -7, 9, 1, 300, "torch.float32")]
    for widths in (WIDE, (1, 8, 1, 1, 2, 1, 8, 8, 8)):
        path = file_with(tmp_path / "t.ddpviz", payload(rows, widths=widths))
        assert Trace.load(path).events(0)[1:] == want
        assert tailed_events(path)[1:] == want


def test_a_big_frame_loads_in_linear_time(tmp_path: Path) -> None:
    def cost(n: int) -> tuple[float, int]:
        kind = np.zeros(n, dtype=np.uint8)
        cols = [np.arange(n, dtype=np.int64) % 5, np.arange(n, dtype=np.int64),
                np.arange(1, n + 1, dtype=np.int64), np.arange(n, dtype=np.int64) % 1000,
                np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)]
        raw = msgspec.msgpack.encode([0, n, [8] * 6, []]) + kind.tobytes() + b"".join(
            c.astype("<i8").tobytes() for c in cols)
        path = file_with(tmp_path / f"big{n}.ddpviz", raw)
        start = time.process_time()
        trace = Trace.load(path)
        return time.process_time() - start, len(trace)

    small_s, small = cost(MAX_COLUMN_ROWS // 10)
    big_s, big = cost(MAX_COLUMN_ROWS)
    assert (small, big) == (MAX_COLUMN_ROWS // 10 + 1, MAX_COLUMN_ROWS + 1)
    assert big_s < 10 * small_s + 1.0  # linear (x10 rows), with room for a shared machine
