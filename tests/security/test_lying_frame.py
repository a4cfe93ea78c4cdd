"""A frame mid-file that claims 4 GiB (issue 23): it used to be taken for a torn tail and the
valid rest of the file was dropped with only a warning. Now it raises TraceError naming where
reading stopped and how many events were read, with those events in `.partial`; a real torn
tail (the writer died mid-frame) still loads with a warning."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest

from ddpviz import events as ev
from ddpviz.traces.fileformat import FRAME, MAGIC, TraceWriter
from ddpviz.traces.trace import Trace, TraceError


def _file(path: Path, chunks: int = 3, per: int = 100) -> list[int]:
    """A trace of `chunks` event frames; returns the byte offset of each frame."""
    with TraceWriter(path, meta={"run": "x"}, chunk=per) as w:
        for c in range(chunks):
            w.write_many([ev.GradReady(0, c, 1000 + c * per + i, c * per + i, i, 0)
                          for i in range(per)])
            w.flush()
    data = path.read_bytes()
    offsets, pos = [], len(MAGIC)
    while pos < len(data):
        offsets.append(pos)
        pos += FRAME.size + FRAME.unpack_from(data, pos)[1]
    return offsets[1:]  # after the header frame


def test_a_mid_file_frame_claiming_4_gib_raises_with_the_prefix(tmp_path: Path) -> None:
    path = tmp_path / "t.ddpviz"
    frames = _file(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, frames[1] + 1, 0xFFFFFFFF)  # the second event frame lies
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    message = str(info.value)
    assert f"frame at byte {frames[1]:,} claims 4,294,967,295 bytes" in message
    assert "100 events were read before it" in message and ".partial" in message
    partial = info.value.partial
    assert isinstance(partial, Trace) and [e.seq for e in partial.events(0)] == list(range(100))


def test_a_torn_tail_still_loads_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.ddpviz"
    _file(path)
    data = path.read_bytes()
    path.write_bytes(data[:-50])  # the writer died mid-frame
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = Trace.load(path)
    assert any("torn frame" in str(w.message) for w in caught)
    assert [e.seq for e in trace.events(0)] == list(range(200))
