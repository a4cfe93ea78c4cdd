"""A rank's events encoded from its columns (columns.py's `Table`) without an object per event:
the bytes msgspec writes for them, byte for byte. The writer's side of framecolumns.py.

Writing a run for a view or `Trace.save` used to rebuild every event as an object from the
columns (~0.7 us each) and encode it (~0.25 us): 1.3M events of a 64-rank run took 1.7 s before
a byte was sent. Here the hot types (columns.py's HOT: ~99% of a trace) are encoded with numpy
and the rest, the rare events, by msgspec from their kept objects.

[Note: encoding columns as msgspec would]
msgspec encodes an event as a map: its size, the "type" key and tag, then each field's key and
value in declared order, each integer in the fewest bytes msgpack allows (a fixint, else the
smallest uint or int of 1, 2, 4 or 8 bytes). So a hot event's bytes are fixed but for the width
class of each integer (10 classes) and, for AllReduceLaunched, its dtype string. Rows of one
type whose integers share their classes (and dtype) share a layout: the same size, the same
bytes but for the integers' at fixed places. Each layout's rows are written as a 2-D array
(rows x size: the constant bytes broadcast, each integer's bytes as a column block), then put
at their offsets in the output with one scatter of fixed-size items. A rank's events come in a
handful of layouts (steps and buckets fixints, times uint64, seqs one or two widths), so the
work is a few numpy passes over the rows whatever they hold. tests/traces/test_table_bytes.py
compares the bytes with msgspec's on every class boundary, random values and real traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np

from ddpviz import events as ev
from ddpviz.events import Event
from ddpviz.traces.columns import CODE, Table
from ddpviz.traces.framecolumns import _key  # (a map key as msgpack writes it)

# Width classes of a msgpack integer, by np.searchsorted(_BOUNDS, v, side="right"): int64,
# int32, int16, int8, negative fixint, positive fixint, uint8, uint16, uint32, uint64.
_BOUNDS = np.array([-(1 << 31), -(1 << 15), -(1 << 7), -32, 0, 128, 256, 1 << 16, 1 << 32],
                   dtype=np.int64)
_WIDTH = (9, 5, 3, 2, 1, 1, 2, 3, 5, 9)  # bytes in all
_MARKER = (0xD3, 0xD2, 0xD1, 0xD0, -1, -1, 0xCC, 0xCD, 0xCE, 0xCF)
_BIG_ENDIAN = (">i8", ">i4", ">i2", "i1", "", "", "u1", ">u2", ">u4", ">u8")
_CLASSES = len(_WIDTH)


class _Kind(NamedTuple):
    """A hot type's layout: the map's opening (size, the type key, the tag), then its fields'
    keys with the column each is read from ("rank" is the table's), and whether the dtype
    string (column `s`) ends it."""

    opening: bytes
    fields: tuple[tuple[bytes, str], ...]
    dtype: bool


_COMMON = (("rank", "rank"), ("step", "step"), ("t_ns", "t"), ("seq", "seq"))
_KINDS: dict[int, _Kind] = {
    CODE[cls]: _Kind(bytes([0x80 | (5 + len(own) + dtype)]) + _key("type") + _key(cls.__name__),
                     tuple((_key(name), column) for name, column in (*_COMMON, *own)),
                     bool(dtype))
    for cls, own, dtype in (
        (ev.GradReady, (("param", "a"), ("bucket", "b")), 0),
        (ev.BucketReady, (("bucket", "a"),), 0),
        (ev.AllReduceDone, (("bucket", "a"),), 0),
        (ev.AllReduceLaunched, (("bucket", "a"), ("nbytes", "b")), 1),
        (ev.ForwardStarted, (), 0),
        (ev.BackwardStarted, (), 0),
        (ev.BackwardFinished, (), 0))}
_DTYPE_KEY = _key("dtype")
_CODES = np.array(sorted(_KINDS), dtype=np.uint8)
_encode = msgspec.msgpack.Encoder().encode
_SMALL = 512  # bytes of a rare event placed with the others at once (8x in index memory)


class Encoded(NamedTuple):
    """Rows' events encoded one after another: row i's bytes are data[offsets[i]:offsets[i+1]]."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64, one more than the rows


def encode_rows(table: Table, rows: np.ndarray) -> Encoded:
    """The msgspec encoding of each of `rows` (row numbers of `table`, in the order wanted),
    concatenated. Every row is either a hot type's (columns) or kept in `table.objects`."""
    return encode_parts([(table, rows)])


def encode_parts(parts: Sequence[tuple[Table, np.ndarray]]) -> Encoded:
    """`encode_rows` of several tables' rows at once, concatenated in order: one pass over
    them all, as a table of a few thousand rows costs about as much in numpy's per-call
    overhead as it does in work (a view's 256 summarized ranks)."""
    cols, objects = _stacked(parts)
    kind = cols["kind"]
    n = len(kind)
    sizes = np.zeros(n, dtype=np.int64)
    hot = np.isin(kind, _CODES)
    plans: list[tuple[_Kind, np.ndarray, _Plan]] = []
    for code in np.unique(kind[hot]).tolist():
        at = np.flatnonzero(kind == code)
        plan = _layouts(cols, at, _KINDS[code])
        sizes[at] = plan.size_of[plan.group]
        plans.append((_KINDS[code], at, plan))
    rare = np.flatnonzero(~hot).tolist()
    rare_bytes = [_encode(e) for e in objects]
    sizes[rare] = [len(b) for b in rare_bytes]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for spec, at, plan in plans:
        _write(data, offsets[at], spec, plan, cols["strings"])
    # the small rare events' bytes put at their offsets at once (a summarized view has
    # 100,000s), the big ones (a ParamsBuilt: ~100 bytes a parameter) one by one
    small = [i for i, raw in zip(rare, rare_bytes, strict=True) if len(raw) <= _SMALL]
    if small:
        joined = np.frombuffer(b"".join(r for r in rare_bytes if len(r) <= _SMALL),
                               dtype=np.uint8)
        lengths = sizes[small]
        shift = offsets[small] - (np.cumsum(lengths) - lengths)  # (from its place in `joined`)
        data[np.repeat(shift, lengths) + np.arange(len(joined))] = joined
    for i, raw in zip(rare, rare_bytes, strict=True):
        if len(raw) > _SMALL:
            data[offsets[i]:offsets[i + 1]] = np.frombuffer(raw, dtype=np.uint8)
    return Encoded(data, offsets)


def _stacked(parts: Sequence[tuple[Table, np.ndarray]]) -> tuple[dict[str, Any], list[Event]]:
    """The parts' rows as one set of columns (with a rank column, and dtype indices into one
    tuple of strings), and the kept objects of their rare rows in order."""
    names = ("kind", "step", "t", "seq", "a", "b")
    cols: dict[str, Any] = {name: np.concatenate([getattr(t, name)[r] for t, r in parts])
                            if parts else np.zeros(0, dtype=np.int64) for name in names}
    cols["rank"] = np.concatenate([np.full(len(r), t.rank, dtype=np.int64) for t, r in parts]) \
        if parts else np.zeros(0, dtype=np.int64)
    strings: dict[str, int] = {}
    dtype_parts = []
    objects: list[Event] = []
    for t, r in parts:
        s = t.s[r]
        if t.strings:
            remap = np.array([strings.setdefault(x, len(strings)) for x in t.strings],
                             dtype=np.int32)
            s = np.where(s >= 0, remap[np.maximum(s, 0)], -1)
        dtype_parts.append(s)
        if t.objects:
            kept = t.objects
            objects.extend(kept[row] for row in r[~np.isin(t.kind[r], _CODES)].tolist())
    cols["s"] = np.concatenate(dtype_parts) if parts else np.zeros(0, dtype=np.int32)
    cols["strings"] = tuple(strings)
    return cols, objects


class _Plan(NamedTuple):
    """One hot type's rows by layout (`_layouts`)."""

    size_of: np.ndarray  # per layout: its bytes
    group: np.ndarray  # per row: its layout
    values: np.ndarray  # fields x rows: the integers
    classes: np.ndarray  # fields x rows: their width classes
    dtypes: np.ndarray  # per row: its dtype string's index (AllReduceLaunched)


def _layouts(cols: dict[str, Any], at: np.ndarray, spec: _Kind) -> _Plan:
    """Per distinct layout of these rows (`at`) of one hot type: its size (bytes); per row its
    layout (index); and the fields' values and width classes (fields x rows), the dtype
    index."""
    n = len(at)
    values = np.empty((len(spec.fields), n), dtype=np.int64)
    for j, (_, column) in enumerate(spec.fields):
        values[j] = cols[column][at]
    classes = np.searchsorted(_BOUNDS, values, side="right")
    key = np.zeros(n, dtype=np.int64)
    for j in range(len(spec.fields)):
        key = key * _CLASSES + classes[j]
    strings = cols["strings"]
    dtypes = cols["s"][at].astype(np.int64) if spec.dtype else np.zeros(n, dtype=np.int64)
    if spec.dtype:
        key = key * (len(strings) + 1) + (dtypes + 1)
    _, first, group = np.unique(key, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    width = np.asarray(_WIDTH, dtype=np.int64)
    fixed = len(spec.opening) + sum(len(k) for k, _ in spec.fields)
    size_of = fixed + width[classes[:, first]].sum(axis=0)
    if spec.dtype:
        size_of += np.array([len(_DTYPE_KEY) + len(_encode(strings[d]))
                             for d in dtypes[first].tolist()], dtype=np.int64)
    return _Plan(size_of, group, values, classes, dtypes)


def _write(data: np.ndarray, at: np.ndarray, spec: _Kind, plan: _Plan,
           strings: tuple[str, ...]) -> None:
    """Write one hot type's rows (starting at byte offsets `at` of `data`), layout by layout."""
    size_of, group, values, classes, dtypes = plan
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(len(size_of) + 1))
    for g in range(len(size_of)):
        mine = order[bounds[g]:bounds[g + 1]]
        first = int(mine[0])
        size = int(size_of[g])
        # the layout's bytes with zero integers, broadcast; then the integers over them
        template = bytearray(spec.opening)
        places = []
        for j, (key, _) in enumerate(spec.fields):
            template += key
            cls = int(classes[j, first])
            places.append((len(template), cls))
            template += bytes([max(_MARKER[cls], 0)]) + bytes(_WIDTH[cls] - 1)
        if spec.dtype:
            template += _DTYPE_KEY + _encode(strings[int(dtypes[first])])
        rec = np.empty((len(mine), size), dtype=np.uint8)
        rec[:] = np.frombuffer(bytes(template), dtype=np.uint8)
        for j, (p, cls) in enumerate(places):
            _put_int(rec, p, cls, values[j, mine])
        out = np.ndarray((len(data) - size + 1,), dtype=f"V{size}", buffer=data, offset=0,
                         strides=(1,))
        out[at[mine]] = rec.view(f"V{size}").reshape(-1)


def _put_int(rec: np.ndarray, p: int, cls: int, v: np.ndarray) -> None:
    """Integers of one width class as msgpack writes them, at column `p` of `rec` (its marker
    byte written already)."""
    width = _WIDTH[cls]
    if width == 1:  # a fixint: the value's low byte (two's complement for negatives)
        rec[:, p] = v.astype(np.uint8)
    else:
        rec[:, p + 1:p + width] = v.astype(_BIG_ENDIAN[cls]).view(np.uint8).reshape(-1, width - 1)


def min_bytes(table: Table) -> int:
    """The fewest bytes `table`'s hot events take as event maps (each integer in one byte;
    rare events and frames not counted), from the counts of each type alone: a bound below
    their size in an EVENTS frame (a COLUMNS frame holds them in fewer)."""
    counts = np.bincount(table.kind, minlength=256)
    return sum(int(counts[code]) * (len(spec.opening) + sum(len(k) + 1 for k, _ in spec.fields)
                                    + (len(_DTYPE_KEY) + 1 if spec.dtype else 0))
               for code, spec in _KINDS.items())
