"""The COLUMNS frame of a `.ddpviz` file: a run of one rank's hot events as integer columns.

[Note: the COLUMNS frame]
An EVENTS frame holds msgpack maps, ~62 bytes a gradient hook, which cost ~0.5 us each to read
even through framecolumns.py's numpy reader: 13.2M events of a 256-rank run took 7-9 s to load.
A COLUMNS frame (kind 6) holds the hot types' events of one rank (columns.py's HOT: ~99% of a
trace) as little-endian integer columns, ~20 bytes a row, which numpy reads as they lie. Its
payload is a head, the msgpack array `[rank, rows, widths, strings]`, then the columns `kind`
(u8), `step`, `t_ns`, `seq`, `a`, `b`, `s`, each `rows` signed integers of its width in
`widths` (1, 2, 4 or 8 bytes, in that order but for kind's); exactly that many bytes. Row i is
one event of `rank`, after every event of the frames before it:

    kind  type               a       b        s      c           d          e
    0     GradReady          param   bucket   -1     0           0          0
    1     BucketReady        bucket  0        -1     0           0          0
    2     AllReduceDone      bucket  0        -1     0           0          0
    3     AllReduceLaunched  bucket  nbytes   dtype  0           0          0
    4-6   ForwardStarted, BackwardStarted, BackwardFinished: a to e 0, s -1
    7     GradsSummarized    bucket  n_grads  -1     first_t_ns  last_t_ns  nbytes

(dtype: an index into `strings`.) A frame has 6 widths (the columns step to s; kinds 0-6) or
9: then the columns `c`, `d`, `e` follow `s`, and rows may be of kind 7. The wide frame
carries a view's gradient hooks summarized per bucket (view_summary.py: 128,000
GradsSummarized events for a 256-rank run, which as msgpack maps took ~1 s to write) and runs
recorded at detail "buckets". Every value is held to limits.py's bounds (the event's own field
types'), and a to e and s to the table, so a row means exactly one event, the one its fields
would decode to from msgpack; a frame that breaks a rule is damage (TraceError, naming it).
Reading is linear in the payload: a fixed number of numpy passes over its rows (See [Note:
checking a COLUMNS frame fast]). `TraceWriter(columns=True)` writes them (the rare events
between runs of hot rows stay EVENTS frames, and so do GradsSummarized rows unless
`summaries=True`); files that may hold them are format 2, format 3 where they may hold wide
ones (a format-2 reader would take a wide frame for damage). extension/src/columnsFrame.ts
reads them the same way (tests/extension/test_columns_frame_mirror.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import msgspec
import numpy as np

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.events import Event
from ddpviz.traces.columns import CODE, Table
from ddpviz.traces.framecolumns import EventColumns

COLUMNS = 6  # the frame kind (fileformat.py's kinds)
MAX_COLUMN_ROWS = 1 << 20  # rows of one frame
MAX_COLUMN_STRINGS = 4096  # dtype strings of one frame
COLUMN_CHUNK = 1 << 16  # rows a writer puts in one frame
NARROW, WIDE = 6, 9  # the widths a frame has: columns step to s, or to e

# The frame's kind codes, in order (format, not columns.py's codes); the last only in a wide
# frame.
TYPES: tuple[type[Event], ...] = (ev.GradReady, ev.BucketReady, ev.AllReduceDone,
                                  ev.AllReduceLaunched, ev.ForwardStarted, ev.BackwardStarted,
                                  ev.BackwardFinished, ev.GradsSummarized)
_LAUNCHED = TYPES.index(ev.AllReduceLaunched)
_SUMMARIZED = TYPES.index(ev.GradsSummarized)
_NAMES = ("step", "t_ns", "seq", "a", "b", "s", "c", "d", "e")
_BOUNDS = {"step": (-1, limits.MAX_STEP), "t_ns": (-limits.MAX_COUNT, limits.MAX_COUNT),
           "seq": (0, limits.MAX_COUNT)}
_MB, _MP, _MC = limits.MAX_BUCKETS - 1, limits.MAX_PARAMS, limits.MAX_COUNT
# per column a to e, per frame code: its lowest and highest value ((0, 0): the type has no
# such field)
_KIND_BOUNDS: dict[str, tuple[tuple[int, int], ...]] = {
    "a": ((0, _MP - 1), (0, _MB), (0, _MB), (0, _MB), (0, 0), (0, 0), (0, 0), (0, _MB)),
    "b": ((0, _MB), (0, 0), (0, 0), (0, limits.MAX_BYTES), (0, 0), (0, 0), (0, 0), (0, _MP)),
    "c": ((0, 0),) * 7 + ((-_MC, _MC),),
    "d": ((0, 0),) * 7 + ((-_MC, _MC),),
    "e": ((0, 0),) * 7 + ((0, limits.MAX_BYTES),),
}
_LOWS = {name: np.array([lo for lo, _ in b], dtype=np.int64) for name, b in _KIND_BOUNDS.items()}
_HIGHS = {name: np.array([hi for _, hi in b], dtype=np.int64)
          for name, b in _KIND_BOUNDS.items()}
_WIDTHS = (1, 2, 4, 8)
# columns.py's code -> the frame's code (255: not a hot type)
_TO_FRAME = np.full(256, 255, dtype=np.uint8)
for _i, _cls in enumerate(TYPES):
    _TO_FRAME[CODE[_cls]] = _i


class ColumnsHead(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A COLUMNS frame's head: whose rows, how many, the columns' widths (6 or 9: checked
    before it is decoded, by `_head_end`), the dtype strings."""

    rank: limits.Rank
    rows: int
    widths: tuple[int, ...]
    strings: tuple[limits.Name, ...]


_encode = msgspec.msgpack.Encoder().encode
_decode_head = msgspec.msgpack.Decoder(ColumnsHead).decode


class ColumnsError(ValueError):
    """A COLUMNS frame breaks the format (the message says how)."""


def is_hot(table: Table, summaries: bool = False) -> np.ndarray:
    """Which rows of `table` a COLUMNS frame holds (bool per row); GradsSummarized's only
    with `summaries` (in wide frames)."""
    return _TO_FRAME[table.kind] < (len(TYPES) if summaries else _SUMMARIZED)


def summarizes(tables: Iterable[Table]) -> bool:
    """Whether any of `tables` holds a GradsSummarized row (what a columns writer writes in
    wide frames with `summaries=True`, in a format-3 file)."""
    code = CODE[ev.GradsSummarized]
    return any(bool(np.any(t.kind == code)) for t in tables)


def encode_columns(table: Table, rows: np.ndarray) -> bytes:
    """The payload of a COLUMNS frame of these rows of `table` (hot rows, in order): a wide
    one where a GradsSummarized row is among them."""
    code = _TO_FRAME[table.kind[rows]]
    s = table.s[rows]
    strings: tuple[str, ...] = ()
    if np.any(code == _LAUNCHED):  # only the strings these rows use, in order of first use
        used, first, inverse = np.unique(s[code == _LAUNCHED], return_index=True,
                                         return_inverse=True)
        order = np.argsort(first)
        rank_of = np.empty(len(used), dtype=np.int64)
        rank_of[order] = np.arange(len(used))
        s = np.full(len(rows), -1, dtype=np.int64)
        s[code == _LAUNCHED] = rank_of[inverse.reshape(-1)]
        strings = tuple(table.strings[i] for i in used[order].tolist())
    else:
        s = np.full(len(rows), -1, dtype=np.int64)
    columns: tuple[np.ndarray, ...] = (table.step[rows], table.t[rows], table.seq[rows],
                                       table.a[rows], table.b[rows], s)
    summarized = code == _SUMMARIZED
    if np.any(summarized):
        held: list[ev.GradsSummarized] = list(map(table.objects.__getitem__,  # type: ignore
                                                  rows[summarized].tolist()))
        extra = np.zeros((3, len(rows)), dtype=np.int64)  # c, d, e
        # (a list of ints per field: numpy reads it ~10x faster than one of tuples)
        extra[0, summarized] = [e.first_t_ns for e in held]
        extra[1, summarized] = [e.last_t_ns for e in held]
        extra[2, summarized] = [e.nbytes for e in held]
        columns = (*columns, *extra)
    widths = tuple(_width(c) for c in columns)
    head = _encode(ColumnsHead(table.rank, len(rows), widths, strings))
    return b"".join([head, code.tobytes(), *(c.astype(f"<i{w}").tobytes()
                                            for c, w in zip(columns, widths, strict=True))])


def _width(column: np.ndarray) -> int:
    """The fewest bytes of a signed integer that hold every value of `column`."""
    if not len(column):
        return 1
    lo, hi = int(column.min()), int(column.max())
    return next(w for w in _WIDTHS if -(1 << (8 * w - 1)) <= lo and hi < 1 << (8 * w - 1))


def decode_columns(payload: memoryview | bytes,
                   codes: Mapping[type[Event], int]) -> EventColumns:
    """A COLUMNS frame's events as columns (`kind` in the caller's `codes`, as framecolumns.py
    gives them; a GradsSummarized row's event in `rare`), every rule of the Note checked.

    Raises:
        ColumnsError: the frame breaks a rule (said which); msgspec's ValidationError for a
            head out of limits.
    """
    data = memoryview(payload)
    end = _head_end(data)
    try:
        head = _decode_head(data[:end])
    except msgspec.ValidationError as e:  # (the field named, not its place in the array)
        text = str(e)
        for i, name in enumerate(("rank", "rows", "widths", "strings")):
            text = text.replace(f" - at `$[{i}]", f" - at `{name}").replace(
                f"`$[{i}]", f"`{name}")
        field = next((n for n in ("rank", "rows", "widths", "strings") if f"`{n}" in text),
                     "")
        raise ColumnsError(f"its head's {field}: {text.split(' - at ')[0]}" if field
                           else f"its head: {text}") from None
    rows = head.rows
    if not 1 <= rows <= MAX_COLUMN_ROWS:
        raise ColumnsError(f"it holds {rows:,} rows, not 1 to {MAX_COLUMN_ROWS:,}")
    if any(w not in _WIDTHS for w in head.widths):
        raise ColumnsError(f"column widths {list(head.widths)}: each must be 1, 2, 4 or 8")
    if len(head.strings) > MAX_COLUMN_STRINGS:
        raise ColumnsError(f"{len(head.strings):,} strings, over the {MAX_COLUMN_STRINGS:,} a "
                           "frame may hold")
    need = end + rows * (1 + sum(head.widths))
    if len(data) != need:
        raise ColumnsError(f"{len(data):,} bytes where its head says {need:,}")
    kind = np.frombuffer(data, dtype=np.uint8, count=rows, offset=end)
    n_types = len(TYPES) if len(head.widths) == WIDE else _SUMMARIZED
    if int(kind.max()) >= n_types:
        raise ColumnsError(f"kind {int(kind.max())} at row {int(np.argmax(kind >= n_types))}"
                           f": a row's kind is 0 to {n_types - 1} in a frame of "
                           f"{len(head.widths)} widths")
    kinds = bytes(data[end:end + rows])
    at = end + rows
    raw: dict[str, np.ndarray] = {}  # the columns as they lie in the payload
    for name, w in zip(_NAMES, head.widths, strict=False):
        raw[name] = np.frombuffer(data, dtype=f"<i{w}", count=rows, offset=at)
        at += rows * w
    if not _fine(raw, kind, kinds, len(head.strings)):
        _damage(raw, kind, len(head.strings))  # (raises, naming the first rule broken)
    return _columns(head, rows, kind, kinds, raw, codes)


# [Note: checking a COLUMNS frame fast]
# The rules are checked on the columns as they lie (1 to 8 bytes a value), never widened: a
# column's min and max settle its bounds for every kind at once, unless they are past the
# bounds of some kinds (b: a GradReady's bucket is below MAX_BUCKETS, an AllReduceLaunched's
# nbytes may be any size; a to e: 0 for the types without such a field); only those kinds'
# rows are then compared, through a mask made by `bytes.translate` of the kind column (a
# numpy gather by a uint8 index took as long as the rest). `_fine` says whether every rule
# holds; where one does not, `_damage` checks them one by one in the Note's order, on int64
# copies, and names the first broken: the message is the same whichever check found it.
# Linear in the rows, a few passes over narrow columns: ~0.3 s less for 13.2M rows than
# widening every column to int64 first and gathering each row's bounds.


def _groups(bounds: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int, bytes], ...]:
    """Per distinct (low, high) of a column: they, and a `bytes.translate` table mapping a
    kind code to 1 where that kind has them (0 elsewhere)."""
    return tuple((lo, hi, bytes(int(k < len(bounds) and bounds[k] == (lo, hi))
                                for k in range(256)))
                 for lo, hi in sorted(set(bounds)))


_KIND_GROUPS = {name: _groups(bounds) for name, bounds in _KIND_BOUNDS.items()}


def _fine(raw: Mapping[str, np.ndarray], kind: np.ndarray, kinds: bytes,
          n_strings: int) -> bool:
    """Whether the frame's columns keep every rule (See [Note: checking a COLUMNS frame
    fast])."""
    for name, (lo, hi) in _BOUNDS.items():
        column = raw[name]
        if int(column.min()) < lo or int(column.max()) > hi:
            return False
    s = raw["s"]
    if int(s.min()) < -1 or int(s.max()) >= n_strings:
        return False
    # (s is in [-1, n_strings): it is a string's index exactly on AllReduceLaunched's rows)
    if not np.array_equal(s >= 0, kind == _LAUNCHED):
        return False
    for name, groups in _KIND_GROUPS.items():
        values = raw.get(name)
        if values is None:
            continue  # (c, d and e of a frame of 6 widths)
        low, high = int(values.min()), int(values.max())
        for lo, hi, table in groups:
            if lo <= low and high <= hi:
                continue
            mine = np.frombuffer(kinds.translate(table), dtype=np.bool_)
            if np.any(mine & ((values != 0) if lo == hi == 0 else
                              (values < lo) | (values > hi))):
                return False
    return True


def _damage(raw: Mapping[str, np.ndarray], kind: np.ndarray, n_strings: int) -> None:
    """Raises ColumnsError naming the first rule of the Note the columns break, in its
    order."""
    cols = {name: column.astype(np.int64) for name, column in raw.items()}
    for name, (lo, hi) in _BOUNDS.items():
        _within(cols[name], lo, hi, name)
    s = cols["s"]
    launched = kind == _LAUNCHED
    if np.any(launched):
        if np.any(s[~launched] != -1):
            raise ColumnsError(f"s = {int(s[~launched][s[~launched] != -1][0])} on a row that "
                               "is not an AllReduceLaunched (its s is -1)")
        bad = launched & ((s < 0) | (s >= n_strings))
        if np.any(bad):
            i = int(np.argmax(bad))  # (the row in the frame)
            raise ColumnsError(f"s (AllReduceLaunched's dtype) = {int(s[i])} at row {i}, out "
                               f"of [0, {n_strings - 1}]")
    elif int(s.min()) != -1 or int(s.max()) != -1:
        raise ColumnsError(f"s = {int(s[s != -1][0])} on a row that is not an "
                           "AllReduceLaunched (its s is -1)")
    for name in _KIND_BOUNDS:
        values = cols.get(name)
        if values is None:
            continue
        lows, highs = _LOWS[name][kind], _HIGHS[name][kind]  # (gathered once)
        if name in ("a", "b"):  # (every low is 0: the first negative, if any)
            bad = values > highs if int(values.min()) >= 0 else values < 0
        else:
            bad = (values < lows) | (values > highs)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ColumnsError(f"{name} = {int(values[i])} at row {i}, out of "
                               f"[{int(lows[i])}, {int(highs[i])}] for a "
                               f"{TYPES[kind[i]].__name__}")


def _columns(head: ColumnsHead, rows: int, kind: np.ndarray, kinds: bytes,
             raw: Mapping[str, np.ndarray], codes: Mapping[type[Event], int]) -> EventColumns:
    """The checked columns as EventColumns: copies as narrow as they lie (columns.py widens
    them once, as it joins a rank's blocks), the kinds in the caller's codes, the rank one
    broadcast value (no memory per row), each GradsSummarized row's event in `rare`."""
    caller = np.frombuffer(kinds.translate(_to_caller(codes)), dtype=np.uint8).copy()
    step, t, seq, a, b, s = (raw[name].astype(raw[name].dtype.newbyteorder("="))
                             for name in _NAMES[:6])
    rare: dict[int, Event] = {}
    where = np.flatnonzero(kind == _SUMMARIZED) if "c" in raw else np.zeros(0, np.int64)
    if len(where):
        fields = [raw[name][where].tolist() for name in ("step", "t_ns", "seq", "a", "b",
                                                         "c", "d", "e")]
        rare = dict(zip(where.tolist(), map(ev.GradsSummarized,
                                            itertools.repeat(head.rank, len(where)), *fields),
                        strict=True))
    return EventColumns(np.broadcast_to(np.int64(head.rank), (rows,)), caller, step, t, seq,
                        a, b, s, tuple(head.strings), rare)


_caller_tables: dict[int, tuple[Mapping[type[Event], int], bytes]] = {}


def _to_caller(codes: Mapping[type[Event], int]) -> bytes:
    """A `bytes.translate` table from the frame's kind codes to the caller's."""
    cached = _caller_tables.get(id(codes))
    if cached is None or cached[0] is not codes:
        table = bytearray(256)
        for i, cls in enumerate(TYPES):
            table[i] = codes[cls]
        cached = _caller_tables[id(codes)] = (codes, bytes(table))
    return cached[1]


def _within(values: np.ndarray, lo: int, hi: int, name: str) -> None:
    bad = (values < lo) | (values > hi)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ColumnsError(f"{name} = {int(values[i])} at row {i}, out of [{lo}, {hi}]")


def _head_end(data: memoryview) -> int:
    """Where the head (a msgpack array of 4: two ints, an array of 6 or 9 ints, an array of
    strings) ends; ColumnsError when the bytes are not of that shape. Reads only the head's
    own bytes: at most 4 + 9 + 9 + 1 + 9 x 9 + 5 + MAX_COLUMN_STRINGS x (5 + 4 x MAX_NAME)."""
    p = _expect_array(data, 0, 4)
    p = _skip_int(data, p)
    p = _skip_int(data, p)
    p, n = _array(data, p)
    if n not in (NARROW, WIDE):
        raise ColumnsError(f"its head holds an array of {n} where the format has {NARROW} or "
                           f"{WIDE}")
    for _ in range(n):
        p = _skip_int(data, p)
    p, n = _array(data, p)
    if n > MAX_COLUMN_STRINGS:
        raise ColumnsError(f"{n:,} strings, over the {MAX_COLUMN_STRINGS:,} a frame may hold")
    for _ in range(n):
        p = _skip_str(data, p)
    if p > len(data):
        raise ColumnsError("its head is cut short")
    return p


def _byte(data: memoryview, p: int) -> int:
    if p >= len(data):
        raise ColumnsError("its head is cut short")
    return data[p]


def _expect_array(data: memoryview, p: int, n: int) -> int:
    p, got = _array(data, p)
    if got != n:
        raise ColumnsError(f"its head holds an array of {got} where the format has {n}")
    return p


def _array(data: memoryview, p: int) -> tuple[int, int]:
    b = _byte(data, p)
    if 0x90 <= b <= 0x9F:
        return p + 1, b & 15
    if b in (0xDC, 0xDD):
        size = 2 if b == 0xDC else 4
        if p + 1 + size > len(data):
            raise ColumnsError("its head is cut short")
        return p + 1 + size, int.from_bytes(data[p + 1:p + 1 + size], "big")
    raise ColumnsError(f"its head has byte 0x{b:02x} at {p} where the format has an array")


def _skip_int(data: memoryview, p: int) -> int:
    b = _byte(data, p)
    if b < 0x80 or b >= 0xE0:
        return p + 1
    if 0xCC <= b <= 0xD3:
        return p + 1 + (1 << ((b - 0xCC) & 3))
    raise ColumnsError(f"its head has byte 0x{b:02x} at {p} where the format has an integer")


def _skip_str(data: memoryview, p: int) -> int:
    b = _byte(data, p)
    if 0xA0 <= b <= 0xBF:
        return p + 1 + (b & 31)
    if 0xD9 <= b <= 0xDB:
        size = 1 << (b - 0xD9)
        if p + 1 + size > len(data):
            raise ColumnsError("its head is cut short")
        return p + 1 + size + int.from_bytes(data[p + 1:p + 1 + size], "big")
    raise ColumnsError(f"its head has byte 0x{b:02x} at {p} where the format has a string")


def events_of(columns: EventColumns, codes: Mapping[type[Event], int]) -> list[Event]:
    """The events of decoded columns as objects (for readers that take events)."""
    from_caller = {code: cls for cls, code in codes.items()}
    out: list[Event] = []
    strings = columns.strings
    rare = columns.rare
    for i, (k, rank, step, t, seq, a, b, s) in enumerate(zip(
            columns.kind.tolist(), columns.rank.tolist(), columns.step.tolist(),
            columns.t.tolist(), columns.seq.tolist(), columns.a.tolist(), columns.b.tolist(),
            columns.s.tolist(), strict=True)):
        cls = from_caller[k]
        if cls is ev.GradReady:
            out.append(ev.GradReady(rank, step, t, seq, a, b))
        elif cls is ev.AllReduceLaunched:
            out.append(ev.AllReduceLaunched(rank, step, t, seq, a, b, strings[s]))
        elif cls in (ev.BucketReady, ev.AllReduceDone):
            out.append(cls(rank, step, t, seq, a))
        elif cls is ev.GradsSummarized:
            out.append(rare[i])
        else:
            out.append(cls(rank, step, t, seq))
    return out
