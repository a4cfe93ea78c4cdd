"""Event frames decoded straight into columns (traces/framecolumns.py) load exactly as msgspec
decodes them, whatever a writer (or an attacker) put in them: other integer encodings, values
out of bounds, wrong tags, extra, reordered or repeated keys, the bytes of a map's opening
inside strings and times, ranks mixed in one frame, big rare events shared by ranks."""

from __future__ import annotations

import random
import struct
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from ddpviz import events as ev
from ddpviz.traces import fileformat as tracefile
from ddpviz.traces import framecolumns
from ddpviz.traces.fileformat import EVENTS, FRAME, MAGIC, TraceWriter
from ddpviz.traces.trace import Trace, TraceError
from tests.diagnose.random_runs import random_run

_HEADER = msgspec.msgpack.encode(tracefile.FileHeader(tracefile.FORMAT_VERSION,
                                                      ev.SCHEMA_VERSION, {}))


@pytest.fixture(autouse=True)
def _every_frame_through_the_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy reader takes frames of any size here (loading leaves a few KiB of frames to
    msgspec: fileformat.FEW_BYTES), so these small files test it."""
    monkeypatch.setattr(tracefile, "FEW_BYTES", 0)


def _file(*payloads: bytes) -> bytes:
    out = bytearray(MAGIC)
    for kind, payload in ((tracefile.HEADER, _HEADER), *((EVENTS, p) for p in payloads)):
        out += FRAME.pack(kind, len(payload), zlib.crc32(payload)) + payload
    return bytes(out)


def _outcome(load: Callable[[], Trace]) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            trace = load()
    except TraceError as e:
        return ("TraceError", str(e).split(":")[0])
    return trace


def _same(data: bytes, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The trace (or error) of `data` through the columns, asserted equal to msgspec's."""
    fast = _outcome(lambda: Trace.from_bytes(data))
    with monkeypatch.context() as m:
        m.setattr(tracefile, "decode_frames", lambda buf, frames, *a: [None] * len(frames))
        slow = _outcome(lambda: Trace.from_bytes(data))
    if isinstance(slow, Trace):
        assert isinstance(fast, Trace), fast
        assert fast == slow
        for rank, table in slow.columns().items():
            mine = fast.columns()[rank]
            for name in ("kind", "step", "t", "seq", "a", "b", "s"):
                assert np.array_equal(getattr(mine, name), getattr(table, name)), name
            assert mine.objects == table.objects and mine.strings == table.strings
    else:
        assert fast == slow
    return fast


def _map(*items: tuple[str, bytes]) -> bytes:
    """A msgpack map of already encoded values."""
    out = bytearray([0x80 | len(items)])
    for key, value in items:
        out += msgspec.msgpack.encode(key) + value
    return bytes(out)


def _array(*maps: bytes) -> bytes:
    return b"\xdc" + struct.pack(">H", len(maps)) + b"".join(maps)


enc = msgspec.msgpack.encode


def _grad(rank: bytes = enc(0), step: bytes = enc(1), t: bytes = enc(10**12),
          seq: bytes = enc(5), param: bytes = enc(3), bucket: bytes = enc(0),
          tag: str = "GradReady", extra: tuple[tuple[str, bytes], ...] = ()) -> bytes:
    return _map(("type", enc(tag)), ("rank", rank), ("step", step), ("t_ns", t), ("seq", seq),
                ("param", param), ("bucket", bucket), *extra)


def test_random_runs_load_as_msgspec_decodes_them(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    read = []
    decode = tracefile.decode_frames
    monkeypatch.setattr(tracefile, "decode_frames", lambda *a: read.extend(decode(*a)) or read[
        len(read) - len(a[1]):])
    for seed in range(12):
        events = random_run(seed)
        path = tmp_path / f"r{seed}.ddpviz"
        with TraceWriter(path, chunk=random.Random(seed).choice([1, 7, 64, 4096])) as w:
            w.write_many(events)  # ranks mixed in frames, as a collector writes them
        loaded = _same(path.read_bytes(), monkeypatch)
        assert loaded == Trace(events)
    assert sum(r is not None for r in read) > 0.9 * len(read)  # in columns, not by msgspec


@pytest.mark.parametrize("field, values", [
    ("rank", [b"\xcc\x05", b"\xcd\x00\x05", b"\xce\x00\x00\x00\x05", b"\xd0\x05",
              b"\xd1\x00\x05", b"\xcf" + (5).to_bytes(8, "big"), b"\xd3" + (5).to_bytes(8, "big")]),
    ("step", [b"\xff", b"\xd0\xff", b"\xd1\xff\xff", b"\xd2\xff\xff\xff\xff",
              b"\xd3" + (-1).to_bytes(8, "big", signed=True), b"\xcd\x01\x00"]),
    ("t", [b"\x00", b"\xce\xff\xff\xff\xff", b"\xd3" + (-(10**9)).to_bytes(8, "big", signed=True),
           b"\xcf" + (1 << 62).to_bytes(8, "big")]),
    ("param", [b"\x7f", b"\xcc\x80", b"\xcd\x27\x0f", b"\xce\x00\x0f\xff\xff"]),
])
def test_every_integer_encoding_msgspec_takes_reads_the_same(
        field: str, values: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    maps = [_grad(**{field: v}) for v in values]  # one per frame, then all in one frame
    _same(_file(*(_array(m) for m in maps)), monkeypatch)
    loaded = _same(_file(_array(*maps)), monkeypatch)
    assert len(loaded) == len(maps)


@pytest.mark.parametrize("bad", [
    {"rank": enc(1 << 17)}, {"rank": enc(-1)}, {"step": enc(-2)}, {"step": enc((1 << 40) + 1)},
    {"t": b"\xcf" + (2**64 - 1).to_bytes(8, "big")}, {"t": enc((1 << 62) + 1)},
    {"seq": enc(-1)}, {"param": enc(1 << 20)}, {"bucket": enc(-3)}, {"param": enc(1.0)},
    {"param": enc("3")}, {"bucket": b"\xc0"}, {"tag": "GradReadz"}, {"tag": "GradReadyX"},
])
def test_values_msgspec_refuses_are_refused(bad: dict[str, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    good = _grad()
    outcome = _same(_file(_array(good, _grad(**bad), good)), monkeypatch)
    assert outcome[0] == "TraceError"


def test_launched_dtypes_extra_reordered_and_repeated_keys_load_as_msgspec_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def launched(dtype: bytes, *extra: tuple[str, bytes]) -> bytes:
        return _map(("type", enc("AllReduceLaunched")), ("rank", enc(1)), ("step", enc(0)),
                    ("t_ns", enc(9)), ("seq", enc(2)), ("bucket", enc(4)),
                    ("nbytes", enc(1 << 40)), ("dtype", dtype), *extra)

    cases = [
        launched(enc("float32")), launched(enc("bfloat16")), launched(enc("x" * 15)),
        launched(enc("x" * 16)), launched(enc("é")), launched(b"\xa2\xff\xfe"),  # bad UTF-8
        launched(b"\xd9\x07float32"), launched(enc(7)),
        _grad(extra=(("unknown", enc(1)),)), _grad(extra=(("rank", enc(3)),)),
        _map(("rank", enc(0)), ("type", enc("GradReady")), ("step", enc(1)),
             ("t_ns", enc(1)), ("seq", enc(5)), ("param", enc(3)), ("bucket", enc(0))),
        _grad()[:1] + b"\xa4type" + b"\xd9\x09GradReady" + _grad()[16:],  # a str8 tag
    ]
    for case in cases:
        _same(_file(_array(_grad(), case, _grad())), monkeypatch)


def test_the_opening_bytes_of_an_event_inside_strings_and_times_load_as_msgspec_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = "ℤtype"  # "ℤ" is e2 84 a4: what looks like a fixmap byte, then "\xa4type"
    built = ev.ParamsBuilt(0, -1, 1, 0, (ev.ParamInfo(0, name, (2,), "float32", "cpu", False,
                                                      4),), (name,), ())
    t_with_opening = int.from_bytes(b"\x00\x87\xa4type", "big")
    events = [built, ev.GradReady(0, 0, t_with_opening, 1, 0, 0), ev.GradReady(0, 0, 5, 2, 0, 0)]
    payload = enc(events)
    assert payload.count(b"\xa4type") == len(events) + 3  # 3 false finds
    loaded = _same(_file(payload), monkeypatch)
    assert loaded.events(0) == events


def test_ranks_mixed_in_a_frame_keep_each_rank_s_order(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    events: list[ev.Event] = []
    seqs = [0] * 5
    for _ in range(3000):
        r = rng.randrange(5)
        cls = rng.choice([ev.GradReady, ev.BucketReady, ev.ForwardStarted, ev.EventsDropped])
        fields = {ev.GradReady: (rng.randrange(300), 2), ev.BucketReady: (1,),
                  ev.ForwardStarted: (), ev.EventsDropped: (7,)}[cls]
        events.append(cls(r, 0, rng.randrange(1 << 40), seqs[r], *fields))
        seqs[r] += 1
    loaded = _same(_file(enc(events[:1000]), enc(events[1000:])), monkeypatch)
    assert loaded == Trace(events)


def test_a_big_rare_event_is_shared_by_ranks_unless_its_own_fields_repeat_a_common_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    order = tuple(range(3000))
    same = [ev.BucketsRebuilt(r, 1, 10 + r, 7, order) for r in range(4)]
    loaded = _same(_file(enc(same[:2]), enc(same[2:])), monkeypatch)
    got = loaded.of_type(ev.BucketsRebuilt)
    assert got == same and got[0].grad_ready_order is got[3].grad_ready_order
    # own fields that set `rank` again: msgspec takes the last, on every rank alike
    repeated = [_map(("type", enc("BucketsRebuilt")), ("rank", enc(r)), ("step", enc(1)),
                     ("t_ns", enc(10)), ("seq", enc(7)), ("grad_ready_order", enc(order)),
                     ("rank", enc(9))) for r in range(3)]
    loaded = _same(_file(_array(*repeated[:2]), _array(repeated[2])), monkeypatch)
    assert [e.rank for e in loaded.of_type(ev.BucketsRebuilt)] == [9, 9, 9]
    # own fields of one size, alike at both ends (what keys the cache), other in the middle
    orders = [tuple(range(3000)), (*range(1500), 1501, 1500, *range(1502, 3000)),
              (*range(1500), 1502, 1501, 1500, *range(1503, 3000))]
    alike = [ev.BucketsRebuilt(r, 1, 10 + r, 7, orders[r % 3]) for r in range(9)]
    loaded = _same(_file(enc(alike[:4]), enc(alike[4:])), monkeypatch)
    assert loaded.of_type(ev.BucketsRebuilt) == alike


def test_a_frame_cut_or_padded_inside_is_refused_as_msgspec_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    three = _array(_grad(), _grad(seq=enc(6)), _grad(seq=enc(7)))
    for payload in (three[:-1], three + b"\x00", b"\xdc\x00\x04" + three[3:],
                    b"\xdc\x00\x02" + three[3:], b"\x90", b"\x90\x00", b"\xc0"):
        _same(_file(payload), monkeypatch)


def test_decode_frames_says_none_for_a_frame_it_cannot_read_exactly() -> None:
    good, bad = _array(_grad()), _array(_grad(extra=(("x", enc(1)),)))
    buf = memoryview(good + bad)
    from ddpviz.traces.columns import CODE

    got = framecolumns.decode_frames(buf, [(0, len(good)), (len(good), len(bad))], CODE)
    assert got[0] is not None and len(got[0]) == 1 and got[1] is None


def test_frames_that_would_cost_more_than_their_bytes_go_to_msgspec(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpviz.traces.columns import CODE

    many_y = b"\xdc\x00\x01" + b"y" * 4096  # an index per byte to search
    tight = b"\xdd\x00\x10\x00\x00" + _grad()  # 1M events claimed in 60 bytes
    for payload in (many_y, tight):
        assert framecolumns.decode_frames(memoryview(payload), [(0, len(payload))],
                                          CODE) == [None]
        assert _same(_file(payload), monkeypatch)[0] == "TraceError"


def test_events_of_one_layout_with_any_byte_changed_load_as_msgspec_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GradReady events of one layout are read a layout at a time (See [Note: layouts] in
    framecolumns.py): a change of any byte of one of them (a key, an integer's first byte or
    value, the size) is read as msgspec reads it, by the layout or field by field."""
    def grad(i: int, **fields: bytes) -> bytes:
        return _grad(**{"seq": enc(300 + i), "param": enc(200 + i), "t": enc(10**12 + i),
                        **fields})
    events = [grad(i) for i in range(8)]
    middle = bytearray(events[4])
    for at in range(len(middle)):
        for change in (0x01, 0x20, 0x80, 0xFF):
            changed = bytearray(middle)
            changed[at] ^= change
            _same(_file(_array(*events[:4], bytes(changed), *events[5:])), monkeypatch)
    # values at the edges of their fields' bounds, in the layout's encodings
    for t in (b"\xcf" + (2**64 - 1).to_bytes(8, "big"), b"\xcf" + (2**63).to_bytes(8, "big"),
              b"\xcf" + (1 << 62).to_bytes(8, "big"), b"\xcf" + ((1 << 62) + 1).to_bytes(8, "big")):
        _same(_file(_array(*events[:4], grad(4, t=t), *events[5:])), monkeypatch)
    # more layouts than are tried per window: the rest field by field
    mixed = [grad(i, rank=r, step=s) for i, (r, s) in enumerate(
        (a, b) for a in (enc(3), b"\xcc\x03", b"\xd0\x03") for b in (enc(1), b"\xcd\x00\x01"))]
    loaded = _same(_file(_array(*mixed, *events)), monkeypatch)
    assert len(loaded) == len(mixed) + len(events)


def test_layouts_read_the_values_field_by_field_reading_reads() -> None:
    """The layout of one GradReady and the values read through it, against msgspec's."""
    raw = _grad(rank=b"\xcc\x05", step=enc(1), t=enc(10**12), seq=b"\xcd\x01\x00",
                param=b"\xd1\x00\x07", bucket=enc(2))
    layout = framecolumns._layout_of(raw)
    assert layout is not None and layout.size == len(raw)
    assert framecolumns._layout_of(raw + b"\x00") is None  # not where the event ends
    assert framecolumns._layout_of(raw.replace(b"param", b"parab")) is None
    region = np.zeros(len(raw) + 512, dtype=np.uint8)
    region[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    words = framecolumns._Words(region.data, len(region) - 7)
    c = np.array([0], dtype=np.int64)
    columns = tuple(np.zeros(1, dtype=np.int64) for _ in range(6))
    matched = framecolumns._by_layout(words, region, c, c + len(raw), np.ones(1, dtype=bool),
                                      columns)
    e = msgspec.msgpack.decode(raw, type=ev.GradReady)
    assert matched.tolist() == [True]
    assert [int(x[0]) for x in columns] == [e.rank, e.step, e.t_ns, e.seq, e.param, e.bucket]


def test_joined_frames_hold_what_the_frames_hold_one_by_one() -> None:
    """decode_frames(..., join=True) (what loading uses): a run of frames read as columns is
    one block, the first frame's, with the rows and rare events of every frame of the run in
    order; the others are empty; a frame left to msgspec stays None and splits the runs."""
    from ddpviz.traces.columns import CODE

    events = random_run(3)
    chunks = [events[i:i + 7] for i in range(0, len(events), 7)]
    payloads = [enc(chunk) for chunk in chunks]
    bad = _array(_grad(extra=(("x", enc(1)),)))
    middle = len(payloads) // 2
    payloads.insert(middle, bad)
    buf = memoryview(b"".join(payloads))
    frames, at = [], 0
    for p in payloads:
        frames.append((at, len(p)))
        at += len(p)
    alone = framecolumns.decode_frames(buf, frames, CODE)
    joined = framecolumns.decode_frames(buf, frames, CODE, None, True)
    assert [x is None for x in alone] == [x is None for x in joined]
    assert alone[middle] is None and sum(x is None for x in alone) == 1

    def runs(blocks: list[framecolumns.EventColumns | None]) -> list[list[Any]]:
        out: list[list[Any]] = []
        for block in blocks:
            if block is None:
                out.append([])
                continue
            if not out or out[-1] == []:
                out.append([])
            out[-1].append(block)
        return [r for r in out if r]
    rare_seen = 0
    for one_by_one, (whole, *rest) in zip(runs(alone), runs(joined), strict=True):
        assert all(len(x) == 0 for x in rest) and len(rest) == len(one_by_one) - 1
        for name in ("rank", "kind", "step", "t", "seq", "a", "b", "s"):
            assert np.array_equal(getattr(whole, name), np.concatenate(
                [getattr(x, name) for x in one_by_one])), name
        at, rare = 0, {}
        for x in one_by_one:
            rare.update({at + row: e for row, e in x.rare.items()})
            at += len(x)
        assert whole.rare == rare
        rare_seen += len(rare)
    assert rare_seen  # (the constructor's events, in the first run)
