"""Many distinct dtype strings in one frame (framecolumns._dtype sorts them out in one pass,
issue #37 M2) load exactly as msgspec decodes them: strings that differ only in trailing zero
bytes, in their ninth byte or in their length, empty ones, non-ASCII ones, over mixed ranks;
and one string msgspec refuses (bad UTF-8) among them fails the frame as msgspec fails it."""

from __future__ import annotations

import pytest

from ddpviz.traces.trace import Trace
from tests.traces.test_frame_columns import _array, _file, _map, _same, enc

DTYPES = ["", "\0", "a", "a\0", "a\0\0", "\0a", "float32", "float32\0", "bfloat16",
          "bfloat16\0", "bfloat17", "bfloat16\0\0\0\0\0\0\0", "x" * 15, "x" * 14, "x" * 9,
          "x" * 8, "x" * 7, "é", "ée", "e\u0301"]


def _launched(rank: int, seq: int, dtype: bytes) -> bytes:
    return _map(("type", enc("AllReduceLaunched")), ("rank", enc(rank)), ("step", enc(0)),
                ("t_ns", enc(9 + seq)), ("seq", enc(seq)), ("bucket", enc(seq % 7)),
                ("nbytes", enc(4 * seq)), ("dtype", dtype))


def test_distinct_dtypes_in_one_frame_load_as_msgspec_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    order = DTYPES + DTYPES[::-1] + DTYPES[::3]  # each rank sees them in its own order
    maps = [_launched(i % 3, i, enc(d)) for i, d in enumerate(order)]
    loaded = _same(_file(_array(*maps)), monkeypatch)
    assert isinstance(loaded, Trace) and len(loaded) == len(order)
    assert [e.dtype for e in loaded.events()] == order  # (one step, times in file order)
    tables = loaded.columns()
    assert set().union(*(t.strings for t in tables.values())) == set(DTYPES)


def test_a_dtype_msgspec_refuses_among_distinct_ones_fails_the_frame_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    maps = [_launched(i % 2, i, enc(d)) for i, d in enumerate(DTYPES)]
    maps.insert(5, _launched(1, 99, b"\xa2\xff\xfe"))  # not UTF-8
    outcome = _same(_file(_array(*maps)), monkeypatch)
    assert outcome[0] == "TraceError"
