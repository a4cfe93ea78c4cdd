"""The TS reader's fast paths (extension/src/trace.ts `decodePayload`, extension/src/events.ts
`asEvent`'s checks made once per type, extension/src/eventModel.ts's bucket maps keyed by
their shared lists) give what the plain paths give: the same values as
@msgpack/msgpack's `decode` (or its very error) for every payload, well formed or hostile, and
the same event or the same reason as checking each field in declared order then `outOfLimits`."""

from __future__ import annotations

import base64
import random
import struct
from typing import Any

import msgspec

from ddpviz.traces.trace import Trace
from ddpviz.traces.view_bytes import trace_bytes
from tests.extension.mirror import run_typescript
from tests.widgets.streams import synthetic_run

# per payload: whether decodePayload's value (or error) is decode's, deeply (key order,
# prototypes, -0 and NaN included)
DECODE_OUT = """(() => {
  const { decode } = load('@msgpack/msgpack');
  const same = (a, b) => {
    if (typeof a !== typeof b) return false;
    if (typeof a !== 'object' || a === null || b === null) return Object.is(a, b);
    if (Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
    const ka = Object.keys(a), kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k, i) => k === kb[i] && same(a[k], b[k]));
  };
  const run = (fn, bytes) => {
    try { return { value: fn(bytes) }; } catch (err) { return { error: String(err) }; }
  };
  return cases.map(c => {
    const bytes = g.base64ToBytes(c);
    const want = run(b => decode(b, { useBigInt64: false }), bytes);
    const got = run(g.decodePayload, bytes);
    return 'error' in want ? got.error === want.error : same(got.value, want.value);
  });
})()"""

# per event: asEvent's verdict and the one of the plain path (each field's kind in declared
# order, then outOfLimits: what asEvent did before it was made fast)
EVENT_OUT = """(() => {
  const ev = load('./events');
  const lim = load('./limits');
  const plain = record => {
    if (typeof record !== 'object' || record === null || Array.isArray(record)) return 'not a map';
    const type = record.type;
    if (typeof type !== 'string' || !Object.prototype.hasOwnProperty.call(ev.EVENT_FIELDS, type)) {
      return `unknown event type ${JSON.stringify(type)}`;
    }
    for (const fields of [ev.BASE_FIELDS, ev.EVENT_FIELDS[type]]) {
      for (const [name, kind] of Object.entries(fields)) {
        if (!ev.hasKind(record[name], kind)) {
          return `${type}.${name} is not ${kind === 'int' ? 'an' : 'a'} ${kind}`;
        }
      }
    }
    const bad = lim.outOfLimits(type, record);
    return bad !== null ? `${bad} is out of ddpviz's limits or malformed` : record;
  };
  return cases.map(c => {
    const record = load('@msgpack/msgpack').decode(load('./trace').base64ToBytes(c));
    const got = g.asEvent(record), want = plain(record);
    return typeof want === 'string' ? got === want : got === record;
  });
})()"""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _events() -> list[dict[str, Any]]:
    trace = Trace(synthetic_run(3, 12, 2))
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in trace.ranks:
        for e in msgspec.msgpack.decode(msgspec.msgpack.encode(trace.events(r))):
            if e["type"] not in seen or len(out) < 60:
                seen.add(e["type"])
                out.append(e)
    return out


def _hostile_payloads() -> list[bytes]:
    good = msgspec.msgpack.encode(_events()[:20])
    out = [good[:n] for n in range(0, len(good), max(1, len(good) // 40))]  # torn
    out += [
        good + b"\x00",  # trailing bytes
        b"\xc1",  # never used
        b"\x91\xa3\xc3\xa9t",  # ["é" cut]: non-ASCII
        msgspec.msgpack.encode(["é", {"ü": 1}, "\u2603" * 100]),  # UTF-8
        b"\x91\xa2\xff\xfe",  # invalid UTF-8
        b"\x81\x01\x02",  # an int key
        b"\x81\xa9__proto__\x80",  # __proto__
        b"\x81\x90\x01",  # an array key
        b"\xc4\x03abc",  # bin
        b"\xd6\xff\x00\x00\x00\x01",  # timestamp ext
        b"\xc7\x02\x05ab",  # ext
        b"\x91" * 200 + b"\xc0",  # deep
        b"\xdd\xff\xff\xff\xff\x00",  # array32 past the end
        b"\xdf\xff\xff\xff\xff\x00",  # map32 past the end
        b"\xdb\xff\xff\xff\xffab",  # str32 past the end
        b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # uint64 max
        b"\xd3\x80\x00\x00\x00\x00\x00\x00\x01",  # int64 near min
        b"\xd3\xff\xff\xff\xff\xff\xff\xff\xfe",  # -2
        b"\xca\x7f\xc0\x00\x00",  # float32 NaN
        b"\xcb" + struct.pack(">d", -0.0),
        b"\x82\xa1a\x01\xa1a\x02",  # a repeated key
        b"\x82\xa12\x01\xa11\x02",  # integer-like keys
        b"",
    ]
    rng = random.Random(40)
    for _ in range(300):
        mutant = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            mutant[rng.randrange(len(mutant))] = rng.randrange(256)
        out.append(bytes(mutant))
    return out


def test_decode_payload_is_msgpacks_decode_on_every_payload() -> None:
    events = _events()
    payloads = [
        msgspec.msgpack.encode(events),
        msgspec.msgpack.encode([{"k" * n: "v" * n} for n in range(40)]),  # short and long
        msgspec.msgpack.encode([1.5, -(2**31), 2**40, -(2**40), 2**63, True, None, [], {}]),
        *_hostile_payloads(),
    ]
    got = run_typescript("trace", DECODE_OUT, [_b64(p) for p in payloads])
    assert len(got) == len(payloads)
    assert [i for i, ok in enumerate(got) if not ok] == []


def test_as_event_gives_the_plain_paths_event_or_reason() -> None:
    events = _events()
    cases: list[Any] = list(events)
    bad_values: list[Any] = [-1, 2**60, 1.5, "x", "x" * 5000, None, [], [1, -2], {}, True]
    for e in events[:40]:
        for field in e:
            if field == "type":
                continue
            for v in bad_values:
                cases.append({**e, field: v})
        # a key its type does not declare: bounded (checked by name) or not
        cases += [{**e, "names": ["a"]}, {**e, "names": [3]}, {**e, "extra": 1},
                  {**e, "param": -5}, {**e, "finding": {}}]
        cases.append({k: v for k, v in e.items() if k != "seq"})
    cases += [{"type": "Nope"}, {"type": 3}, [1], "x", {}]
    finding: dict[str, Any] = {"type": "FindingReported", "rank": 0, "step": 1, "t_ns": 5, "seq": 2,
               "finding": {"kind": "straggler", "severity": "info", "title": "t"}}
    cases += [finding, {**finding, "finding": {**finding["finding"], "ranks": [-1]}},
              {**finding, "finding": {**finding["finding"], "tensors": [["a", [["b", [[2, 1]]]]]]}}]
    got = run_typescript("events", EVENT_OUT, [_b64(msgspec.msgpack.encode(c)) for c in cases])
    assert len(got) == len(cases)
    assert [cases[i] for i, ok in enumerate(got) if not ok][:3] == []


# the bucket maps of a view's trace (its COPY frames' events share their lists) with events
# added whose lists are equal copies, differ, or are shared with another `rebuilt`: grouped as
# by each map's whole text, in first-seen order
MAPS_OUT = """(() => {
  const { parseTrace, base64ToBytes } = load('./trace');
  const t = parseTrace(base64ToBytes(cases[0]), 'run');
  const first = [...t.byRank.values()].flat().find(e => e.type === 'BucketAssigned');
  const add = (rank, e) => t.byRank.get(rank).push({ ...first, rank, ...e });
  add(0, { buckets: JSON.parse(JSON.stringify(first.buckets)) });
  add(1, { rebuilt: !first.rebuilt });
  add(2, { buckets: [[0], ...first.buckets] });
  add(1, { limits: [...first.limits, 1] });
  add(2, { limits: [...first.limits, 1] });
  const groups = new Map();
  for (const r of [...t.byRank.keys()].sort((a, b) => a - b)) {
    for (const e of t.byRank.get(r)) {
      if (e.type !== 'BucketAssigned') continue;
      const key = JSON.stringify([e.rebuilt, e.buckets, e.limits]);
      if (!groups.has(key)) groups.set(key, []);
      if (!groups.get(key).includes(e.rank)) groups.get(key).push(e.rank);
    }
  }
  const got = new g.TraceModel(t).bucketMaps;
  return { want: [...groups.values()], got: got.map(m => m.ranks),
           texts: got.map(m => JSON.stringify([m.rebuilt, m.buckets, m.limits])),
           wantTexts: [...groups.keys()] };
})()"""


def test_bucket_maps_group_by_content_whether_lists_are_shared_or_not() -> None:
    sent, _ = trace_bytes(Trace(synthetic_run(4, 30, 2)), limit=1 << 30)
    got = run_typescript("eventModel", MAPS_OUT, [_b64(sent)])
    assert got["got"] == got["want"] and got["texts"] == got["wantTexts"]
    assert len(got["want"]) >= 4  # the added maps make groups of their own
