"""Hostile COPY frames (fileformat.py, [Note: the COPY frame]): a copy that names nothing, a
later event, a hot event; ints out of bounds; a frame of too many copies; copies that repeat
more list entries than a file may; a chain of copies of copies. Each is a TraceError naming the
frame and why, or loads in time linear in the file; the TS reader's side is
tests/extension/test_copy_frames_mirror.py."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.traces import copies
from ddpviz.traces.fileformat import COPY, EVENTS, FRAME, TailReader, TraceWriter
from ddpviz.traces.trace import Trace, TraceError
from tests.traces.tailed import tail_read


def params(n: int) -> tuple[ev.ParamInfo, ...]:
    return tuple(ev.ParamInfo(i, f"layer{i}.weight", (4, 4), "float32", "cpu", False, 4)
                 for i in range(n))


BUILT = ev.ParamsBuilt(rank=0, step=-1, t_ns=10, seq=0, params=params(100), buffers=(),
                       ignored=())
HOT = ev.ForwardStarted(rank=0, step=0, t_ns=20, seq=1)


def frame(kind: int, obj: object) -> bytes:
    payload = msgspec.msgpack.encode(obj)
    return FRAME.pack(kind, len(payload), zlib.crc32(payload)) + payload


def written(path: Path, events: list[ev.Event], *after: bytes) -> Path:
    """A file of `events` (written whole) with the raw frames `after` appended."""
    with TraceWriter(path) as w:
        w.write_many(events)
    with open(path, "ab") as f:
        for raw in after:
            f.write(raw)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    return str(info.value)


@pytest.mark.parametrize(("entry", "why"), [
    ([5, 0, 1, 0, 0, 0], "no event before it"),  # names nothing
    ([0, 1, 1, 0, 0, 0], "no event before it"),  # names a hot event
    ([0, 0, -1, 0, 0, 0], "copy 0's rank"),
    ([0, 0, limits.MAX_WORLD_SIZE, 0, 0, 0], "copy 0's rank"),
    ([-1, 0, 1, 0, 0, 0], "copy 0's src_rank"),
    ([0, -1, 1, 0, 0, 0], "copy 0's src_seq"),
    ([0, 0, 1, -2, 0, 0], "copy 0's step"),
    ([0, 0, 1, 0, limits.MAX_COUNT + 1, 0], "copy 0's t_ns"),
    ([0, 0, 1, 0, 0, -1], "copy 0's seq"),
    ([0, 0, 1, 0, 0, 2**64 - 1], "copy 0's seq"),
    ([0, 0, 1, 0, 0], "at least length 6, got 5 - at copy 0"),  # too short
    ([0, 0, 1, 0, 0, 0, 7], "at most length 6, got 7 - at copy 0"),  # too long
    ("copy", "Expected `array`, got `str` - at copy 0"),
])
def test_a_bad_copy_is_a_trace_error_naming_its_frame(tmp_path: Path, entry: Any,
                                                      why: str) -> None:
    path = written(tmp_path / "t.ddpviz", [BUILT, HOT], frame(COPY, [entry]))
    where = path.stat().st_size - len(frame(COPY, [entry]))
    message = load_error(path)
    assert f"frame at byte {where}" in message and why in message, message


def test_a_copy_of_an_event_written_after_it_is_an_error(tmp_path: Path) -> None:
    later = msgspec.structs.replace(BUILT, rank=3)
    path = written(tmp_path / "t.ddpviz", [BUILT], frame(COPY, [[3, 0, 1, 0, 0, 0]]),
                   frame(EVENTS, [later]))
    assert "rank 3 with seq 0" in load_error(path)


def test_a_frame_of_more_than_max_copies_is_an_error(tmp_path: Path) -> None:
    many = [[0, 0, 1, 0, 0, i] for i in range(copies.MAX_COPIES + 1)]
    path = written(tmp_path / "t.ddpviz", [BUILT], frame(COPY, many))
    assert "Expected `array` of length <= 131072" in load_error(path)


def test_copies_repeating_more_entries_than_a_file_may_are_an_error(tmp_path: Path) -> None:
    """A few bytes per copy may not present more than a file of a GB would."""
    big = msgspec.structs.replace(BUILT, params=params(10_000))
    per_frame = copies.MAX_COPIES
    n = copies.MAX_COPIED // copies.entries(big) + 1
    entries = [[0, 0, 1 + i // per_frame, 0, 0, i] for i in range(n)]
    path = written(tmp_path / "t.ddpviz", [big],
                   *(frame(COPY, entries[i:i + per_frame]) for i in range(0, n, per_frame)))
    assert os.path.getsize(path) < 4 << 20  # (a file of a few MB)
    start = time.process_time()
    message = load_error(path)
    assert "over the 1,073,741,824 a file may" in message
    assert time.process_time() - start < 10


def test_a_chain_of_copies_of_copies_loads_in_linear_time(tmp_path: Path) -> None:
    """Each copy repeats the one before: resolved to the first payload, never walked."""
    def chain(n: int) -> Path:
        links = [[0 if i == 0 else 1, i, 1, 0, 0, i + 1] for i in range(n)]
        return written(tmp_path / f"chain{n}.ddpviz", [BUILT], frame(COPY, links))

    def cost(path: Path) -> tuple[float, Trace]:
        start = time.process_time()
        trace = Trace.load(path)
        return time.process_time() - start, trace

    small_s, small = cost(chain(10_000))
    big_s, big = cost(chain(100_000))
    assert len(big.events(1)) == 100_000 and len(small.events(1)) == 10_000
    built = big.of_type(ev.ParamsBuilt, rank=1)
    assert built[-1].params is built[0].params is big.of_type(ev.ParamsBuilt, rank=0)[0].params
    assert big_s < 10 * small_s + 1.0  # linear (x10 events), with room for a shared machine


def test_a_followed_file_with_a_bad_copy_raises_trace_error(tmp_path: Path) -> None:
    path = written(tmp_path / "t.ddpviz", [BUILT, HOT], frame(COPY, [[0, 1, 1, 0, 0, 0]]))
    reader = TailReader(path)
    with pytest.raises(TraceError, match="no event before it"):
        tail_read(reader, path)
    assert reader.events == 2  # the events before it stay read
