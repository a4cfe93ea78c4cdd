"""Every count, index and size read from a trace file or a wire message is bounded before it
sizes anything: the small files that once exhausted memory or ran for minutes raise TraceError
naming the field, the wire codec rejects the same events (counted as "schema"), metadata
nesting and garbage after the magic raise TraceError, and 100,000 buckets stay linear."""

from __future__ import annotations

import struct
import warnings
import zlib
from pathlib import Path

import msgspec
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz import limits
from ddpviz.events import ParamInfo
from ddpviz.report import html as report
from ddpviz.traces.fileformat import MAGIC, TraceWriter
from ddpviz.traces.trace import Trace, TraceError
from ddpviz.transport.codec import Codec, WireError, make_header
from tests.security import bombs

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(("bomb", "field"), [
    ("world_size=10**10", "world_size"), ("ranks +-2**63", "rank"),
    ("10**10 broadcast chunks", "n_chunks"), ("200,000 shape dims", "shape"),
])
def test_bombs_raise_trace_error_naming_the_field(tmp_path: Path, bomb: str,
                                                  field: str) -> None:
    path = bombs.write(tmp_path / "bomb.ddpviz", bombs.BOMBS[bomb]())
    assert path.stat().st_size < 2_000_000
    with pytest.raises(TraceError, match=rf"at `\$\[\d+\]\.(params\[0\]\.)?{field}`"):
        Trace.load(path)


@pytest.mark.parametrize(("bomb", "field"), [
    ("world_size=10**10", "world_size"), ("ranks +-2**63", "rank"),
    ("10**10 broadcast chunks", "n_chunks"), ("200,000 shape dims", "shape"),
])
def test_the_wire_rejects_the_same_events_as_schema(bomb: str, field: str) -> None:
    codec = Codec(SECRET)
    events = [e for e in bombs.BOMBS[bomb]() if e.rank == bombs.BOMBS[bomb]()[0].rank][:3]
    rank = events[0].rank if 0 <= events[0].rank < 2**31 else 0
    parts = codec.encode(make_header("events", rank, "s", 0, count=len(events)), events)
    with pytest.raises(WireError, match=field) as info:
        codec.decode(parts)
    assert info.value.reason == "schema"


def test_a_shape_of_too_many_elements_is_rejected_by_file_and_wire(tmp_path: Path) -> None:
    p = ParamInfo(0, "w", (2**40, 2**40), "float32", "cpu", False)  # each dim within limits
    built = ev.ParamsBuilt(0, -1, 1, 0, (p,), (), ())
    with pytest.raises(TraceError, match=r"params\[0\]\.shape has 2\*\*80|1208925819614629174"
                                         r"706176 elements"):
        Trace.load(bombs.write(tmp_path / "numel.ddpviz", [built]))
    codec = Codec(SECRET)
    with pytest.raises(WireError, match="shape") as info:
        codec.decode(codec.encode(make_header("events", 0, "s", 0, count=1), [built]))
    assert info.value.reason == "schema"


def test_every_limit_sits_on_the_boundary(tmp_path: Path) -> None:
    """The largest allowed value loads; one more is rejected (for a rank, a world size, a
    chunk index and a string)."""
    top = limits.MAX_WORLD_SIZE
    ok = [ev.VerificationStarted(top - 1, -1, 1, 0, top, 0, 0),
          ev.BroadcastChunkDone(0, -1, 2, 0, limits.MAX_CHUNKS - 1, 0),
          ev.AllReduceLaunched(0, 0, 3, 1, 0, 1, "x" * limits.MAX_NAME)]
    assert len(Trace.load(bombs.write(tmp_path / "ok.ddpviz", ok))) == 3
    bad = [ev.VerificationStarted(top, -1, 1, 0, top, 0, 0),
           ev.VerificationStarted(0, -1, 1, 0, top + 1, 0, 0),
           ev.BroadcastChunkDone(0, -1, 2, 0, limits.MAX_CHUNKS, 0),
           ev.AllReduceLaunched(0, 0, 3, 1, 0, 1, "x" * (limits.MAX_NAME + 1))]
    for i, e in enumerate(bad):
        with pytest.raises(TraceError, match="limits"):
            Trace.load(bombs.write(tmp_path / f"bad{i}.ddpviz", [e]))


def test_deeply_nested_metadata_raises_trace_error_not_recursion_error(tmp_path: Path) -> None:
    for depth in (limits.MAX_META_DEPTH + 1, 100_000):
        nested: object = "x"
        for _ in range(depth):
            nested = [nested]
        path = tmp_path / "deep.ddpviz"
        encoded = msgspec.msgpack.encode({"format": 1, "schema": ev.SCHEMA_VERSION,
                                          "meta": {"deep": "PLACEHOLDER"}})
        # msgspec cannot encode 100,000 levels either: splice the nesting in by hand
        inner = b"\x91" * depth + msgspec.msgpack.encode("x")
        payload = encoded.replace(msgspec.msgpack.encode("PLACEHOLDER"), inner)
        path.write_bytes(MAGIC + struct.pack("<BII", 1, len(payload), zlib.crc32(payload))
                         + payload)
        with pytest.raises(TraceError, match=r"nested|recursion"):
            Trace.load(path)
    fine = {"a": [[[{"b": "c"}]]]}
    with TraceWriter(tmp_path / "fine.ddpviz", meta=fine):
        pass
    assert Trace.load(tmp_path / "fine.ddpviz").meta == fine


def test_magic_followed_by_garbage_is_not_an_empty_trace(tmp_path: Path) -> None:
    for tail in (b"garbage!", b"\x01\x02", b"\xff" * 9, b"\x01" + b"\xff" * 200):
        path = tmp_path / "garbage.ddpviz"
        path.write_bytes(MAGIC + tail)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(TraceError):
                Trace.load(path)


def test_100000_buckets_load_and_render(tmp_path: Path) -> None:
    """Linear renderers: 100,000 one-parameter buckets (a 35 MB file) load, diagnose, report
    and export (minutes before, when lookups were quadratic)."""
    trace = Trace.load(bombs.write(tmp_path / "buckets.ddpviz", bombs.many_buckets()))
    findings = list(ddpviz.diagnose(trace))
    assert not [f for f in findings if f.kind == "hook_fired_twice"]  # each hook fired once
    page = report.render(trace)
    assert "100000 buckets" in page and "99936 more buckets not shown" in page
    doc = trace.to_chrome_trace()
    lanes = [e for e in doc["traceEvents"] if e.get("name") == "thread_name"]
    # phases, one per bucket's all-reduce, gradient hooks, other events
    assert len(lanes) == 100_000 + 3
    assert sorted(e["tid"] for e in lanes) == list(range(len(lanes)))
