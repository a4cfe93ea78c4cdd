"""Event frames of hot events decoded straight into columns, without an object per event.

An EVENTS frame is a msgpack array of events, each a map whose first key is the "type" tag
(see events.py and tracefile.py). msgspec builds an object per event (~250 ns each): 12.8M
events of a 256-rank run would take seconds before the columns (columns.py) are even filled.
The hot types (gradient hooks, bucket and all-reduce events, phase starts: ~99% of a trace)
are encoded as msgspec writes them in one fixed layout per type but for the widths of their
integers; this module reads them with numpy, a window of frames at a time.

[Note: reading frames as msgspec would]
The fast reader must accept exactly what msgspec accepts and yield the same values, or say it
cannot (the frame is then decoded by msgspec, which yields the events or the error). Events are
found by searching the frame for the bytes `\\xa4type` that open every event's map; as strings
and integers may contain those bytes too, a frame is taken only when its events chain: the
first starts where the array header ends, each ends (decoded from its own bytes) exactly where
the next found start is, the last at the frame's end, and their number is the header's count.
A map's encoding is self-delimiting, so a chain that holds is the true sequence of events.
A hot event must match its type's layout byte for byte (map size, keys in declared order, its
tag) with integers in any msgpack encoding and within the bounds of limits.py; an event of
another type (rare) is decoded by msgspec from its own bytes (and checked by check_events).
Anything else sends the frame to msgspec. Each step is linear in the window, whatever it holds:
distinct dtype strings come from one sort, never a pass over the events per distinct string (a
window can be one frame of any size: 100,000 distinct dtypes took 12 s that way), and the
columns take a block's ranks alike (See [Note: a block of many ranks] in columns.py). So a
hostile file loads within a small constant factor of loading it through msgspec alone: at worst
2.2x measured (one frame of 100,000 distinct dtypes; tests/security/test_linear_loading.py).
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple, cast

import msgspec
import numpy as np

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.events import ANY_EVENT, Event


class EventColumns(NamedTuple):
    """The events of an event frame as columns, in file order (see columns.py for what `a`,
    `b` and `s` hold per type). A COLUMNS frame's (columnframe.py) keep the integer widths of
    the file (signed, 1 to 8 bytes) and a broadcast `rank`; columns.py widens them."""

    rank: np.ndarray  # int64
    kind: np.ndarray  # uint8: the caller's code of the event's type
    step: np.ndarray  # int64
    t: np.ndarray  # int64
    seq: np.ndarray  # int64
    a: np.ndarray  # int64
    b: np.ndarray  # int64
    s: np.ndarray  # int32: index into `strings`; -1 for none
    strings: tuple[str, ...]
    rare: dict[int, Event]  # row -> the event, for types not held in columns (a, b left 0)

    def __len__(self) -> int:
        return len(self.kind)


_U64 = np.uint64
_PAD = 256  # zero bytes after a copied window: every read of a field (even of a false find's
# fields: at most 6 fields of at most 16 bytes past its opening) stays inside


def _le(data: bytes) -> int:
    """The first 8 bytes of `data` (zero-padded) as a little-endian word."""
    return int.from_bytes(data[:8].ljust(8, b"\0"), "little")


def _key(name: str) -> bytes:
    raw = name.encode()
    return bytes([0xA0 | len(raw)]) + raw


# Integer encodings by first byte: (bytes in all, pre-shift, shift, signed, wide). A value is
# read from the big-endian word W at its first byte: fixints are int8(W >> 56); 1, 2 and 4 byte
# ints are (W << 8) >> (64 - 8 n), signed or not; 8-byte ints (wide) are the next 8 bytes.
_INT = np.zeros(256, dtype=np.int64)
for _t in range(256):
    if _t < 0x80 or _t >= 0xE0:
        _spec = (1, 0, 56, 1, 0)
    elif 0xCC <= _t <= 0xD3:
        _n = 1 << ((_t - 0xCC) & 3)
        _spec = (1 + _n, 8, 64 - 8 * _n, int(_t >= 0xD0), int(_n == 8))
    else:
        continue  # not an integer: length 0
    _INT[_t] = _spec[0] | _spec[1] << 4 | _spec[2] << 8 | _spec[3] << 16 | _spec[4] << 17


class RareCache:
    """Rare events decoded before, by their bytes but for the fields every event has: the
    parameter list of ParamsBuilt (a MB for a 10,000-parameter model) and the bucket maps are
    the same on every rank of a run, so each is decoded (and checked) once per file.

    [Note: a rare event from the cache]
    An event whose opening and own fields (the bytes after `seq`) equal a cached one's is that
    one with its rank, step, t_ns and seq (read and bounded in columns) replaced; that is what
    msgspec decodes unless the own fields repeat one of those keys (msgspec takes the last of
    duplicate keys). So an entry is made only once a second decode, with other values in front,
    shows the own fields do not set them."""

    KEEP = 64  # entries; only big events are kept
    BIG = 4096  # bytes of own fields below which decoding is cheaper than a lookup
    EDGE = 1024  # bytes at each end of the own fields that key an entry, with their size (a
    # checksum of all of them cost as much as comparing them: ~0.1 s of a 256-rank file)
    PER_KEY = 2  # entries under one key at most: a lookup compares at most this many

    def __init__(self) -> None:
        # (opening, size and CRCs of the ends of the own fields) -> [(own fields, event)]
        self._events: dict[tuple[bytes, int, int, int], list[tuple[bytes, Event]]] = {}
        self._size = 0
        self._scratch = np.zeros(0, dtype=np.uint8)

    def scratch(self, n: int) -> np.ndarray:
        """n bytes to copy frames into, reused from call to call (fresh memory costs a page
        fault per 4 KiB, which costs more than the decoding)."""
        if len(self._scratch) < n:
            self._scratch = np.zeros(max(n, 2 * len(self._scratch)), dtype=np.uint8)
        return self._scratch[:n]

    def decode(self, raw: memoryview, head: int, common: tuple[int, int, int, int]) -> Event:
        """The event encoded in `raw`, whose common fields (rank, step, t_ns, seq, read into
        `common`) end at byte `head` (-1: not read), checked within ddpviz's limits."""
        if head < 0 or len(raw) - head < self.BIG:
            e = _decode_event(raw)
            limits.check_events([e])
            return e
        opening = int(raw[6]) & 0x1F
        own = raw[head:]
        key = (bytes(raw[:7 + opening]), len(own), zlib.crc32(own[:self.EDGE]),
               zlib.crc32(own[-self.EDGE:]))
        entries = self._events.get(key, ())
        mine = bytes(own) if entries else b""  # (a memoryview compares byte by byte: slow)
        for fields, cached in entries:
            if mine == fields:
                rank, step, t_ns, seq = common
                return msgspec.structs.replace(cached, rank=rank, step=step, t_ns=t_ns, seq=seq)
        e = _decode_event(raw)
        limits.check_events([e])
        if (self._size < self.KEEP and len(self._events.get(key, ())) < self.PER_KEY
                and _common(e) == common):
            other = cast("tuple[int, int, int, int]", tuple(int(v == 0) for v in common))
            probe = bytearray(raw[:7 + opening])
            for name, value in zip(("rank", "step", "t_ns", "seq"), other, strict=True):
                probe += _key(name) + msgspec.msgpack.encode(value)
            probe += raw[head:]
            with contextlib.suppress(msgspec.MsgspecError, ValueError, RecursionError):
                if _common(_decode_event(bytes(probe))) == other:
                    self._events.setdefault(key, []).append((bytes(own), e))
                    self._size += 1
        return e


def _common(e: Event) -> tuple[int, int, int, int]:
    return (e.rank, e.step, e.t_ns, e.seq)


class _Words:
    """The bytes of a buffer at any positions as native uint64 words: `le(p)` the 8 bytes at
    each p read little-endian, `pair(p)` the 16 bytes at each p as two such words. A gather
    through a void dtype copies the bytes per position (16 cost about what 8 do); numpy's
    gather from an unaligned uint64 view takes ~1.4x as long, from a big-endian one ~1.8x, and
    a frame's fields are several gathers per event."""

    def __init__(self, raw: memoryview, n: int) -> None:
        self._v8 = np.ndarray((n,), dtype="V8", buffer=raw, offset=0, strides=(1,))
        self._v16 = np.ndarray((n - 8,), dtype="V16", buffer=raw, offset=0, strides=(1,))
        self._vrow = np.ndarray((n - _ROW + 8,), dtype=f"V{_ROW}", buffer=raw, offset=0,
                                strides=(1,))

    def le(self, p: np.ndarray) -> np.ndarray:
        return self._v8[p].view(_LE)

    def rows(self, p: np.ndarray) -> np.ndarray:
        """The _ROW bytes at each p: (len(p),) of a void dtype, one row each."""
        return self._vrow[p]

    def pair(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        both = self._v16[p].view(_LE).reshape(-1, 2)
        return both[:, 0], both[:, 1]


_LE = np.dtype("<u8")
_ALL = _U64((1 << 64) - 1)


def _be_at(first: np.ndarray, second: np.ndarray, s: int) -> np.ndarray:
    """The 8 bytes from byte `s` (0-8) of the 16 in `first`, `second` (byteswapped: msgpack's
    big-endian order), as numbers."""
    if s == 0:
        return first
    if s == 8:
        return second
    return (first << _U64(8 * s)) | (second >> _U64(64 - 8 * s))


def _field(words: _Words, p: np.ndarray, name: str, lo: int,
           hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The key `name` then a msgpack integer in [lo, hi] (as msgspec's typed decoder checks
    it) at positions `p`: (positions after them, values, ok). One read of 16 bytes holds both:
    a key is at most 7 bytes, an integer at most 9."""
    key = _key(name)
    k = len(key)
    word, more = words.pair(p)
    ok = (word & _U64((1 << (8 * k)) - 1)) == _U64(_le(key))
    p = p + k
    head = (word >> _U64(8 * k)).astype(np.uint8)
    if not len(head):
        return p, np.zeros(0, np.int64), ok
    top, bottom = int(head.max()), int(head.min())
    if top < 0x80:  # all positive fixints: the usual ranks, steps, buckets
        v = head.astype(np.int64)
        if lo > bottom or hi < top:  # (bounds checked only where they may fail)
            ok &= (v >= lo) & (v <= hi)
        return p + 1, v, ok
    first, second = word.byteswap(), more.byteswap()  # big-endian from here on
    if top == bottom and 0xCC <= top <= 0xCF:  # unsigned ints of one width: times, seqs
        size = 1 << (top - 0xCC)
        w = _be_at(first, second, k + 1)
        if size < 8:
            w = w >> _U64(64 - 8 * size)
        v = w.view(np.int64)
        if lo > 0 or size == 8 or hi < (1 << (8 * size)) - 1:
            ok &= (v >= max(lo, 0)) & (v <= hi)
        return p + 1 + size, v, ok
    w = _be_at(first, second, k)  # the 8 bytes from the integer's first
    if top <= 0xCE:  # a mix of unsigned ints of at most 4 bytes: parameter indices
        length = _SMALL_LEN[head]
        v = ((w >> _SMALL_SHIFT[head]) & _SMALL_MASK[head]).view(np.int64)
        ok &= (length > 0) & (v >= lo) & (v <= hi)
        return p + length, v, ok
    code = _INT[head]  # any mix of encodings
    length = code & 15
    x = w << ((code >> 4) & 15).astype(_U64)
    shift = (code >> 8) & 127
    signed = (code >> 16) & 1 == 1
    v = np.where(signed, x.view(np.int64) >> shift, (x >> shift.astype(_U64)).view(np.int64))
    ok &= length > 0
    wide = (code >> 17) & 1 == 1
    if wide.any():
        at = np.flatnonzero(wide)
        v[at] = _be_at(first[at], second[at], k + 1).view(np.int64)
        ok[at] &= signed[at] | (v[at] >= 0)  # an unsigned 8-byte int above int64: out of bounds
    ok &= (v >= lo) & (v <= hi)
    return p + length, v, ok


def _dtype(region: np.ndarray, words: _Words, p: np.ndarray,
           strings: dict[bytes, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The key "dtype" then a short string at positions `p`: (positions after them, index of
    each string in `strings` (added to it), ok)."""
    key = _key("dtype")
    ok = (words.le(p) & _U64((1 << (8 * len(key))) - 1)) == _U64(_le(key))
    p = p + len(key)
    head = region[p]
    size = (head & 0x1F).astype(np.int64)
    ok &= ((head & 0xE0) == 0xA0) & (size <= _MAX_DTYPE)  # a fixstr of at most 15 bytes
    size = np.minimum(size, _MAX_DTYPE)
    lo_w = words.le(p + 1) & np.where(size >= 8, _U64((1 << 64) - 1),
                                (_U64(1) << (np.minimum(size, 7) * 8).astype(_U64)) - _U64(1))
    hi_w = words.le(p + 9) & ((_U64(1) << (np.maximum(size - 8, 0) * 8).astype(_U64)) - _U64(1))
    index = np.full(len(p), -1, np.int32)
    at = np.flatnonzero(ok)
    if not len(at):
        return p + 1 + size, index, ok
    # Each string as one 16-byte key (its second word holds at most 7 bytes: the size goes in
    # the top one). The distinct keys come from one sort, not a pass over the events per
    # distinct key: a frame may hold 100,000 distinct strings, which made that quadratic.
    lo_k = lo_w[at]
    hi_k = hi_w[at] | (size[at].astype(_U64) << _U64(56))
    if bool(np.all(lo_k == lo_k[0])) and bool(np.all(hi_k == hi_k[0])):  # (the usual: one)
        order, group, firsts = None, np.zeros(len(at), np.intp), np.zeros(1, np.intp)
    else:
        order = np.lexsort((hi_k, lo_k))
        lo_k, hi_k = lo_k[order], hi_k[order]
        new = np.ones(len(at), dtype=bool)
        new[1:] = (lo_k[1:] != lo_k[:-1]) | (hi_k[1:] != hi_k[:-1])
        group = np.cumsum(new) - 1
        firsts = np.flatnonzero(new)
    mine = np.full(len(firsts), -1, np.int32)
    for j, (key_lo, key_hi) in enumerate(zip(lo_k[firsts].tolist(), hi_k[firsts].tolist(),
                                             strict=True)):
        text = (key_lo.to_bytes(8, "little") + key_hi.to_bytes(8, "little"))[:key_hi >> 56]
        if text not in strings:
            try:
                text.decode()
            except UnicodeDecodeError:
                continue  # msgspec refuses it: the frame goes to msgspec
            strings[text] = len(strings)
        mine[j] = strings[text]
    index[at if order is None else at[order]] = mine[group]
    return p + 1 + size, index, ok & (index >= 0)


# Unsigned ints of at most 4 bytes (fixint, uint8/16/32) by first byte: length (0: another
# type), and the shift and mask of the value in the big-endian word at the first byte.
_SMALL_LEN = np.zeros(256, dtype=np.int64)
_SMALL_SHIFT = np.zeros(256, dtype=_U64)
_SMALL_MASK = np.zeros(256, dtype=_U64)
_SMALL_LEN[:0x80], _SMALL_SHIFT[:0x80], _SMALL_MASK[:0x80] = 1, 56, 0x7F
for _t, _n in ((0xCC, 1), (0xCD, 2), (0xCE, 4)):
    _SMALL_LEN[_t], _SMALL_SHIFT[_t], _SMALL_MASK[_t] = 1 + _n, 56 - 8 * _n, (1 << 8 * _n) - 1


class _Hot(NamedTuple):
    """One hot type's layout: its map's fixed opening (map size, the tag), its fields after the
    common ones (name, column, bounds), and whether its last field is the dtype string."""

    cls: type[Event]
    opening: bytes
    fields: tuple[tuple[str, str, int, int], ...]
    dtype: bool


_COMMON = (("rank", 0, limits.MAX_WORLD_SIZE - 1), ("step", -1, limits.MAX_STEP),
           ("t_ns", -limits.MAX_COUNT, limits.MAX_COUNT), ("seq", 0, limits.MAX_COUNT))
_BUCKET = ("bucket", "a", 0, limits.MAX_BUCKETS - 1)
_HOT = tuple(
    _Hot(cls, bytes([0x80 | (5 + len(fields) + dtype)]) + _key("type") + _key(cls.__name__),
         fields, bool(dtype))
    for cls, fields, dtype in (
        (ev.GradReady, (("param", "a", 0, limits.MAX_PARAMS - 1),
                        ("bucket", "b", 0, limits.MAX_BUCKETS - 1)), 0),
        (ev.BucketReady, (_BUCKET,), 0),
        (ev.AllReduceDone, (_BUCKET,), 0),
        (ev.AllReduceLaunched, (_BUCKET, ("nbytes", "b", 0, limits.MAX_BYTES)), 1),
        (ev.ForwardStarted, (), 0),
        (ev.BackwardStarted, (), 0),
        (ev.BackwardFinished, (), 0)))
_FIRST_WORDS = np.array([_le(h.opening) for h in _HOT], dtype=_U64)
_TYPE_KEY = _U64(_le(_key("type")))  # bytes 1-5 of an event's map
_MAX_DTYPE = 15
# No event encodes in fewer bytes (its map byte, the type key and tag, rank, step, t_ns, seq):
# a frame whose header counts more events than fit is refused before any per-event work.
_MIN_EVENT = 32  # dtype strings read in columns (longer ones: the frame goes to msgspec)
_HOT_TYPES = frozenset(h.cls for h in _HOT)
_OPENING_SIZE = np.array([len(h.opening) for h in _HOT] + [0], dtype=np.int64)
# Bytes 8-15 of each hot type's opening (the first 8 are _FIRST_WORDS; GradReady's is 16 long).
_SECOND_WORD = np.array([_le(h.opening[8:16]) for h in _HOT] + [1], dtype=_U64)
_SECOND_MASK = np.array([(1 << (8 * len(h.opening[8:16]))) - 1 for h in _HOT] + [0], dtype=_U64)
_decode_event = msgspec.msgpack.Decoder(ANY_EVENT).decode
_codes_cache: dict[int, tuple[Mapping[type[Event], int], np.ndarray]] = {}


# [Note: layouts]
# A GradReady is ~97% of a trace's events, and a rank writes them in a handful of layouts: the
# same keys in the same order, each integer in one encoding (a step a fixint, a time a uint64,
# a parameter index a uint16 once past 255, ...). A layout is read off one event's bytes (the
# first of a window's GradReady events that no layout read so far has taken), as the bytes
# that must be equal (opening, keys, each integer's first byte or, for fixints, its class)
# and where each integer is. The _ROW bytes of every candidate are gathered once; an event
# has the layout when its size (its start to the next event's) is the layout's and its bytes
# equal the fixed ones under the mask; its integers are then read at fixed offsets, checked
# against the same bounds as `_field` checks. That is what reading field by field finds for
# it, so the result is the same [Note: reading frames as msgspec would]; what no layout of
# _LAYOUTS takes is read field by field. Each try costs one pass over the events left:
# bounded per window, whatever the file holds.
_ROW = 96  # bytes of a GradReady read at once (its usual ~70; longer ones: field by field)
_LAYOUTS = 4  # layouts tried per window
_GRAD_FIELDS = (*_COMMON, *((name, lo, hi) for name, _, lo, hi in _HOT[0].fields))


class _Layout(NamedTuple):
    """One layout of GradReady (See [Note: layouts])."""

    size: int  # bytes of the event
    mask: np.ndarray  # uint64 words over the event's bytes: the bits that are fixed
    want: np.ndarray  # uint64 words: their values
    ints: tuple[tuple[int, int, int, int], ...]  # per field: where its integer starts (the
    # first byte, its encoding), that byte, and the field's bounds


def _layout_of(event: bytes) -> _Layout | None:
    """The layout of one GradReady's bytes; None if they are not its fields in order, each a
    msgpack integer, in at most _ROW bytes."""
    opening = _HOT[0].opening
    if len(event) > _ROW or not event.startswith(opening):
        return None
    mask, want = bytearray(_ROW), bytearray(_ROW)
    mask[:len(opening)], want[:len(opening)] = b"\xff" * len(opening), opening
    at, ints = len(opening), []
    for name, lo, hi in _GRAD_FIELDS:
        key = _key(name)
        head = at + len(key)
        if event[at:head] != key or head >= len(event):
            return None
        mask[at:head], want[at:head] = b"\xff" * len(key), key
        first = event[head]
        length = int(_INT[first]) & 15
        if not length:
            return None
        mask[head], want[head] = ((0x80, 0) if first < 0x80 else (0xE0, 0xE0) if first >= 0xE0
                                  else (0xFF, first))
        ints.append((head, first, lo, hi))
        at = head + length
    if at != len(event):
        return None
    words = (at + 7) // 8
    return _Layout(at, np.frombuffer(bytes(mask), dtype=_LE)[:words].copy(),
                   np.frombuffer(bytes(want), dtype=_LE)[:words].copy(), tuple(ints))


def _ints(rows: np.ndarray, at: int, first: int, lo: int,
          hi: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The integers encoded from byte `at` of each row, all starting with `first` (or its
    fixint class): (values, in bounds (None: all are))."""
    if first < 0x80 or first >= 0xE0:
        dtype, start, low, high = (np.dtype(np.uint8), at, 0, 0x7F) if first < 0x80 else (
            np.dtype(np.int8), at, -32, -1)
    else:
        size = 1 << ((first - 0xCC) & 3)
        signed = first >= 0xD0
        dtype = np.dtype(f">{'i' if signed else 'u'}{size}")
        start = at + 1
        low, high = ((-(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1) if signed
                     else (0, (1 << (8 * size)) - 1))
    v = np.ndarray((len(rows),), dtype=dtype, buffer=rows, offset=start,
                   strides=(_ROW,)).astype(np.int64)  # (a uint64 past int64 wraps negative)
    if lo <= low and high <= hi:
        return v, None
    return v, (v >= max(lo, 0 if first == 0xCF else lo)) & (v <= hi)


def _by_layout(words: _Words, region: np.ndarray, c: np.ndarray, nxt: np.ndarray,
               candidates: np.ndarray, columns: tuple[np.ndarray, ...]) -> np.ndarray:
    """Which events (`candidates`: GradReady openings; each from c to nxt) have one of the
    first _LAYOUTS layouts found among them; their rank, step, t_ns, seq, param and bucket go
    into `columns`. See [Note: layouts]."""
    matched = np.zeros(len(c), dtype=bool)
    left = np.flatnonzero(candidates)
    if not len(left):
        return matched
    start = c[left]
    rows = words.rows(start)
    size = nxt[left] - start
    few = len(left) // 16  # left for field by field: another pass costs more than they do
    for _ in range(_LAYOUTS):
        if len(left) <= few:
            break
        # the sample: the first event of the commonest size (most likely the commonest layout)
        common = int(np.bincount(np.minimum(size, _ROW + 1)).argmax())
        pick = int(np.argmax(size == common)) if common <= _ROW else 0
        first = int(left[pick])
        layout = (_layout_of(bytes(region[c[first]:nxt[first]]))
                  if nxt[first] - c[first] <= _ROW else None)
        ok = np.zeros(len(left), dtype=bool)
        if layout is not None:
            w = rows.view(_LE).reshape(len(rows), _ROW // 8)
            ok = size == layout.size
            for j in range(2, len(layout.mask)):  # (the opening's 16 bytes: checked before)
                mask, want = layout.mask[j], layout.want[j]
                ok &= (w[:, j] if mask == _ALL else w[:, j] & mask) == want
            values = []
            for at, first_byte, lo, hi in layout.ints:
                v, fine = _ints(rows, at, first_byte, lo, hi)
                values.append(v)
                if fine is not None:
                    ok &= fine
            # (the values of events without the layout are written too: whatever reads them
            # next, a later layout or field by field, overwrites them)
            for column, v in zip(columns, values, strict=True):
                column[left] = v
            matched[left] = ok
        ok[pick] = True  # (the sample leaves the set: taken, or read field by field)
        miss = np.flatnonzero(~ok)
        left, rows, size = left[miss], rows[miss], size[miss]
    return matched


def _CODES_OF(codes: Mapping[type[Event], int]) -> np.ndarray:
    """The caller's code of each hot type, by index in _HOT (0 for the rest: set later)."""
    cached = _codes_cache.get(id(codes))
    if cached is None or cached[0] is not codes:
        table = np.array([codes[h.cls] for h in _HOT] + [0], dtype=np.uint8)
        cached = _codes_cache[id(codes)] = (codes, table)
    return cached[1]


def decode_frames(buf: memoryview, frames: Sequence[tuple[int, int]],
                  codes: Mapping[type[Event], int], seen: RareCache | None = None,
                  join: bool = False) -> list[EventColumns | None]:
    """Per frame ((start, length) of its payload in `buf`): its events as columns, or None
    where the frame is not one read here exactly as msgspec reads it (See [Note: reading frames
    as msgspec would]): decode that one with msgspec. `seen`: rare events decoded before (by
    earlier calls on the same file), see RareCache. With `join`, a run of frames read here
    comes as one block, the first's, its other frames' blocks empty (fewer, bigger blocks for
    the columns to take: each costs ~60 us there)."""
    seen = seen if seen is not None else RareCache()
    out: list[EventColumns | None] = [None] * len(frames)
    lo = frames[0][0]
    hi = frames[-1][0] + frames[-1][1]
    region = seen.scratch(hi - lo + _PAD)
    region[:hi - lo] = np.frombuffer(buf, dtype=np.uint8, count=hi - lo, offset=lo)
    region[hi - lo:] = 0
    raw = region.data
    words = _Words(raw, len(region) - 7)

    # The frames' array headers (count, where the first event starts).
    starts = np.array([s - lo for s, _ in frames], dtype=np.int64)
    ends = starts + np.array([n for _, n in frames], dtype=np.int64)
    first = np.full(len(frames), -1, dtype=np.int64)
    count = np.zeros(len(frames), dtype=np.int64)
    for i, (s, n) in enumerate(frames):
        head = bytes(buf[s:s + min(n, 5)])
        if head and 0x90 <= head[0] <= 0x9F:
            count[i], first[i] = head[0] & 15, s - lo + 1
        elif len(head) >= 3 and head[0] == 0xDC:
            count[i], first[i] = int.from_bytes(head[1:3], "big"), s - lo + 3
        elif len(head) >= 5 and head[0] == 0xDD:
            count[i], first[i] = int.from_bytes(head[1:5], "big"), s - lo + 5

    # Where events start: the `\xa4type` key after a fixmap byte (and false finds, see Note).
    is_y = region[3:max(hi - lo, 3)] == 0x79
    if np.count_nonzero(is_y) > (hi - lo) // 8:
        return out  # not events (a real frame has about one per 30 bytes): not worth indexing
    y = np.flatnonzero(is_y)
    c = y.astype(np.int64)  # ("y" of "type" is 3 bytes after the map's first byte)
    c = c[(region[c + 2] == 0x74) & (region[c + 4] == 0x70)]  # "t" before it, "p" after it
    w0, w1 = words.pair(c)  # the map's first 16 bytes: its opening, the type's if hot
    frame = np.searchsorted(starts, c, side="right") - 1
    inside = ((((w0 >> _U64(8)) & _U64((1 << 40) - 1)) == _TYPE_KEY)
              & ((w0 & _U64(0xF0)) == _U64(0x80))  # a fixmap
              & (frame >= 0) & (c < ends[np.maximum(frame, 0)]))
    c, frame, w0, w1 = c[inside], frame[inside], w0[inside], w1[inside]
    found = np.bincount(frame, minlength=len(frames))
    at_first = np.searchsorted(c, starts)
    good = (first >= 0) & (found == count) & (count * _MIN_EVENT <= ends - first)
    nonempty = count > 0
    if len(c):
        opens = c[np.minimum(at_first, len(c) - 1)] == first  # the first event found is there
        good &= np.where(nonempty, opens, first == ends)  # (an empty array: nothing after it)
    else:
        good &= ~nonempty & (first == ends)

    # Each event's end must be the next one's start (or its frame's end).
    nxt = np.empty_like(c)
    if len(c):
        nxt[:-1] = c[1:]
        last = np.ones(len(c), dtype=bool)
        last[:-1] = frame[1:] != frame[:-1]
        nxt[last] = ends[frame[last]]
    n = len(c)
    s_col = np.full(n, -1, np.int32)
    strings: dict[bytes, int] = {}
    # The type of each event by the first 8 bytes of its map (len(_HOT): not a hot type); then
    # the fields every type has, for all events at once (values of other events are dropped).
    which = np.full(n, len(_HOT), dtype=np.intp)
    for i, word in enumerate(_FIRST_WORDS):
        which[w0 == word] = i
    hot = which < len(_HOT)
    ok = hot & ((w1 & _SECOND_MASK[which]) == _SECOND_WORD[which])
    # (a rare event's opening: its map byte, the "type" key, its tag as a fixstr)
    p = c + np.where(hot, _OPENING_SIZE[which], 7 + (region[c + 6] & 0x1F))
    kind = _CODES_OF(codes)[which]
    rank, step, t, seq, a, b = (np.zeros(n, dtype=np.int64) for _ in range(6))
    end = nxt.copy()
    fine = np.ones(n, dtype=bool)
    common_ok = np.ones(n, dtype=bool)
    after_common = p.copy()
    # Most GradReady events in a few layouts, a gather each (See [Note: layouts]); the rest,
    # and the fields every type has, field by field.
    matched = _by_layout(words, region, c, nxt, (which == 0) & ok, (rank, step, t, seq, a, b))
    rest = np.flatnonzero(~matched)
    q = p[rest]
    for into, (name, lo_v, hi_v) in zip((rank, step, t, seq), _COMMON, strict=True):
        q, v, k = _field(words, q, name, lo_v, hi_v)
        into[rest] = v
        common_ok[rest] &= k
    ok &= common_ok
    after_common[rest] = q
    # GradReady's fields, read for every other event (the most by far); then the other hot
    # types'.
    (_, _, lo_a, hi_a), (_, _, lo_b, hi_b) = _HOT[0].fields
    q, v, k = _field(words, q, "param", lo_a, hi_a)
    a[rest] = v
    q, v, k_b = _field(words, q, "bucket", lo_b, hi_b)
    b[rest] = v
    end[rest] = q
    fine[rest] = k & k_b
    for i, h in enumerate(_HOT[1:], start=1):
        sel = np.flatnonzero(which == i)
        if not len(sel):
            continue
        q = c[sel]
        right = np.ones(len(sel), dtype=bool)
        for off in range(16, len(h.opening), 8):  # the rest of the opening, 8 bytes at a time
            start = min(off, len(h.opening) - 8)
            piece = h.opening[start:start + 8]
            right &= words.le(q + start) == _U64(_le(piece))
        q = after_common[sel]
        a[sel] = 0
        b[sel] = 0
        for name, column, lo_v, hi_v in h.fields:
            q, v, k = _field(words, q, name, lo_v, hi_v)
            right &= k
            (a if column == "a" else b)[sel] = v
        if h.dtype:
            q, index, k = _dtype(region, words, q, strings)
            right &= k
            s_col[sel] = index
        end[sel] = q
        fine[sel] = right
    ok &= fine & (end == nxt)

    # Frames with a bad event go to msgspec; the rare events of the others are decoded alone.
    bad_frames = set(frame[~ok & hot].tolist())
    rare_rows = np.flatnonzero(~hot)
    a[rare_rows] = 0  # (columns.py fills them from the objects)
    b[rare_rows] = 0
    rare: dict[int, dict[int, Event]] = {}
    bounds = np.searchsorted(frame, np.arange(len(frames) + 1))
    for i, f in zip(rare_rows.tolist(), frame[rare_rows].tolist(), strict=True):
        if f in bad_frames or not good[f]:
            continue
        start, stop = int(c[i]) + lo, int(nxt[i]) + lo
        prefix = (int(c[i]), int(after_common[i]) if common_ok[i] else -1)
        try:
            e = seen.decode(buf[start:stop], prefix[1] - prefix[0], (
                int(rank[i]), int(step[i]), int(t[i]), int(seq[i])))
        except (msgspec.MsgspecError, ValueError, RecursionError):
            bad_frames.add(f)
            continue
        if type(e) in _HOT_TYPES:  # a hot type in another layout (an extra key, say)
            bad_frames.add(f)
            continue
        rare.setdefault(f, {})[i - int(bounds[f])] = e
        rank[i], step[i], t[i], seq[i], kind[i] = e.rank, e.step, e.t_ns, e.seq, codes[type(e)]
    names = tuple(x.decode() for x in strings)
    read = [bool(good[f]) and f not in bad_frames for f in range(len(frames))]
    f = 0
    while f < len(frames):
        if not read[f]:
            f += 1
            continue
        g = f + 1
        while join and g < len(frames) and read[g]:
            out[g] = _EMPTY
            g += 1
        i, j = int(bounds[f]), int(bounds[g])
        rows = rare.get(f, {})
        if g > f + 1:
            rows = {int(bounds[h]) - i + row: e for h in range(f, g)
                    for row, e in rare.get(h, {}).items()}
        out[f] = EventColumns(rank[i:j], kind[i:j], step[i:j], t[i:j], seq[i:j], a[i:j],
                              b[i:j], s_col[i:j], names, rows)
        f = g
    return out


_NONE = np.zeros(0, dtype=np.int64)
_EMPTY = EventColumns(_NONE, np.zeros(0, dtype=np.uint8), _NONE, _NONE, _NONE, _NONE, _NONE,
                      np.zeros(0, dtype=np.int32), (), {})  # a frame joined to the one before
