"""The hypothesis fuzz over structured hostile traces, run by test_fuzz.py in a child process
under a memory cap (RLIMIT_AS) and a time cap (not collected on its own: no test_ prefix).

Each example is a `.ddpviz` file (written with and without COPY frames, and with a COPY frame of
hostile entries after the events) of events of every type (found by introspecting
`ddpviz.events`) whose ints sit at and just beyond their limits and at 64-bit extremes, whose
strings carry markup or exceed their limits, whose lists are empty, short or long, and whose
metadata nests. Loading either raises TraceError or gives a trace that diagnose(), the
dashboard, the report and the Chrome export all handle without error."""

from __future__ import annotations

import math
import os
import tempfile
import typing
import warnings
import zlib
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ddpviz
from ddpviz import events as ev
from ddpviz import limits
from ddpviz.limits import LimitError
from ddpviz.report import html as report
from ddpviz.traces.columns import tables_of
from ddpviz.traces.fileformat import COLUMNS, COPY, FRAME, TraceWriter
from ddpviz.traces.trace import Trace, TraceError
from ddpviz.widgets.dashboard import Dashboard
from tests.security.hostile import PAYLOAD, raw_markup, without_own_scripts

EXAMPLES = int(os.environ.get("DDPVIZ_FUZZ_EXAMPLES", "60"))
I64 = (-(2**63), 2**63 - 1)


def ints(t: mi.IntType, valid: bool) -> st.SearchStrategy[int]:
    edges = {0, 1, 2, -1, 10**10, I64[0], I64[1]}
    for bound, step in ((t.ge, 0), (t.gt, 1), (t.le, 0), (t.lt, -1)):
        if bound is not None:
            edges |= {bound + step, bound + step + (1 if step >= 0 and bound in (t.ge, t.gt)
                                                    else -1)}
    edges |= {e + 1 for e in list(edges) if e < I64[1]} | {e - 1 for e in list(edges)
                                                          if e > I64[0]}
    edges = {e for e in edges if I64[0] <= e <= I64[1]}
    if valid:
        edges = {e for e in edges if (t.ge is None or e >= t.ge) and (t.gt is None or e > t.gt)
                 and (t.le is None or e <= t.le) and (t.lt is None or e < t.lt)}
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else I64[0])
        return st.one_of(st.integers(max(lo, -1), max(lo, -1) + 5),
                         st.integers(max(lo, 0), max(lo, 0) + 40), st.sampled_from(sorted(edges)))
    return st.one_of(st.integers(-1, 5), st.integers(0, 40), st.sampled_from(sorted(edges)))


def strings(t: mi.StrType, small: bool, valid: bool) -> st.SearchStrategy[str]:
    some = st.one_of(st.sampled_from(["", "float32", "cpu", "0.weight", "param", "shape",
                                      "error", PAYLOAD]), st.text(max_size=12))
    if small or valid:  # small: inside a long list, so that the file stays small
        return some
    return st.one_of(some, st.just("x" * ((t.max_length or limits.MAX_TEXT) + 1)))


def value(t: mi.Type, small: bool = False, valid: bool = False) -> st.SearchStrategy[Any]:
    """Values of type `t`; `small`: no long strings or lists inside (a long list's items);
    `valid`: within the limits (then the trace loads and every view must draw it)."""
    if isinstance(t, mi.IntType):
        return ints(t, valid)
    if isinstance(t, mi.StrType):
        return strings(t, small, valid)
    if isinstance(t, mi.FloatType):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.TupleType):
        return st.tuples(*(value(x, small, valid) for x in t.item_types))
    if isinstance(t, mi.VarTupleType | mi.ListType):
        short = st.lists(value(t.item_type, small, valid), max_size=5).map(tuple)
        if small:
            return short
        # one item repeated: just past the field's limit (when that is small), or long
        over = (t.max_length or 10**9) + 1
        counts = [n for n in (over, 500) if n <= 500 and not (valid and n >= over)]
        if not counts:
            return short
        return st.one_of(short, st.tuples(value(t.item_type, True, valid),
                                          st.sampled_from(counts))
                         .map(lambda xn: (xn[0],) * xn[1]))
    if isinstance(t, mi.StructType):
        return st.fixed_dictionaries({f.name: value(f.type, small, valid)
                                      for f in t.fields}).map(
            lambda kw, cls=t.cls: cls(**kw))
    raise TypeError(f"no strategy for {t}")


EVENT_TYPES = list(typing.get_args(ev.ANY_EVENT))
hostile_events = st.one_of(*(value(mi.type_info(cls)) for cls in EVENT_TYPES))
valid_events = st.one_of(*(value(mi.type_info(cls), valid=True) for cls in EVENT_TYPES))
traces = st.one_of(st.lists(valid_events, min_size=1, max_size=40),
                   st.lists(hostile_events, min_size=1, max_size=25))
LOADED = [0, 0]  # traces that loaded, traces tried
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(I64[0], I64[1]),
                      st.floats(allow_nan=False), st.text(max_size=8), st.just(PAYLOAD))
meta = st.one_of(
    st.dictionaries(st.text(max_size=8), st.recursive(
        json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                         max_size=3),
        max_leaves=12), max_size=4),
    st.integers(1, 3000).map(lambda depth: {"deep": _nested(depth)}))


def _nested(depth: int) -> Any:
    out: Any = PAYLOAD
    for _ in range(depth):
        out = [out]
    return out


# COPY frames' entries (fileformat.py, [Note: the COPY frame]): [src_rank, src_seq, rank,
# step, t_ns, seq], at and beyond their bounds, of any length, or not a list at all
_copy_int = st.one_of(st.integers(-2, 8), st.sampled_from(
    [limits.MAX_WORLD_SIZE - 1, limits.MAX_WORLD_SIZE, limits.MAX_COUNT, limits.MAX_COUNT + 1,
     I64[0], I64[1]]))
copy_frames = st.lists(st.one_of(st.lists(_copy_int, min_size=6, max_size=6),
                                 st.lists(_copy_int, max_size=8), st.just("copy")), max_size=6)



def exercise(path: Path) -> None:
    """Load; if it loads, every consumer of a trace must cope."""
    LOADED[1] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = Trace.load(path)
    except TraceError:
        return
    LOADED[0] += 1
    ddpviz.diagnose(trace)
    dash = Dashboard(trace)  # what it sends the browser: the run's bytes, the findings
    assert len(Trace.from_bytes(dash.trace)) == len(trace)
    dash.close()
    page = report.render(trace)  # (its interactive view's raw-text elements are ddpviz's own)
    assert raw_markup(without_own_scripts(page.split("</style>", 1)[1])) is None
    doc = trace.to_chrome_trace()
    assert all(math.isfinite(e.get("ts", 0)) for e in doc["traceEvents"])


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(traces, meta,
       st.sampled_from([0, 1, 2]), st.booleans(), copy_frames)
def test_hostile_traces_load_or_raise_trace_error_and_render(evs: list[Any], md: Any,
                                                             ranks: int, copies: bool,
                                                             copied: list[Any]) -> None:
    # (no draws of their own, so the examples stay those the fuzz drew before columns: a
    # third written with COLUMNS frames, and the hostile entries then a COLUMNS frame's head)
    columns = ranks == 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hostile.ddpviz"
        # move most events onto a few ranks so that they meet in the views
        evs = [e if ranks == 0 or i % 3 == 0 else
               type(e)(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "rank": i % ranks})
               for i, e in enumerate(evs)]
        try:
            with TraceWriter(path, meta=md, copies=copies, columns=columns) as w:
                if columns:  # (hot events as COLUMNS frames, from their columns)
                    w.write_tables(tables_of(evs).values())
                else:
                    w.write_many(evs)
        except (OverflowError, ValueError, RecursionError, LimitError):
            return  # msgpack cannot hold it: no file an attacker could write either
        if copied:  # a COPY frame of any entries, or a COLUMNS frame of any head and bytes
            kind = COLUMNS if columns else COPY
            payload = msgspec.msgpack.encode(copied[:4] if columns else copied)
            if columns:
                payload += msgspec.msgpack.encode(copied[4:])
            with open(path, "ab") as f:
                f.write(FRAME.pack(kind, len(payload), zlib.crc32(payload)) + payload)
        exercise(path)


def test_report_how_many_loaded() -> None:
    """Runs after the fuzz (file order): prints how many hostile traces loaded and were drawn
    (test_fuzz.py checks that some did, so the views were exercised)."""
    print(f"\nfuzz: {LOADED[0]} of {LOADED[1]} traces loaded and were drawn")
