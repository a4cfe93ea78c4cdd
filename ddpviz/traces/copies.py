"""COPY frames: an event written once and repeated for other ranks by reference.

Every rank of a run reports its constructor alike: the parameter list (ParamsBuilt, a MB for a
10,000-parameter model) and the bucket maps (BucketAssigned, BucketsRebuilt) differ between
ranks only in the fields every event has (rank, step, t_ns, seq). A COPY frame says "append to
`rank`'s events the event that `src_rank` wrote with seq `src_seq` earlier in this file, with
these four fields": a few bytes instead of a MB per rank (See [Note: the COPY frame] in
fileformat.py for the format). `CopyFinder` is the writer's side, `Sources` the reader's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

import msgspec

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.events import Event

# The types a copy may repeat: the ones with a list field, the only events big enough to be
# worth it. Never a hot type (columns.py's HOT: those are held as columns, not objects), so a
# reader keeps a reference to a few events per rank, not to every event. The TS reader has the
# same list (extension/src/trace.ts COPY_SOURCES; tests/extension keeps them equal).
COPY_SOURCES: frozenset[type[Event]] = frozenset({
    ev.ParamsBuilt, ev.VerificationFailed, ev.BucketAssigned, ev.UnusedParametersFound,
    ev.BucketsRebuilt})
MAX_COPIES = 1 << 17  # copies in one frame (a copy per rank of the largest world)
MIN_BYTES = 1024  # an event encoded in fewer bytes is written whole, not copied
KEEP = 64  # distinct payloads a writer remembers as sources (bounds its memory)
# Entries (parameters, bucket slots, mismatches) that the copies of one file may repeat in all:
# a copy costs a reader O(1), but what reads the trace then (the model, diagnose()) walks each
# rank's lists, so a file of a few bytes per copy must not present more than a file of about a
# GB written whole would (1.1 GB holds 256 ranks x 10,000 parameters x 5 steps).
MAX_COPIED = 1 << 30


class Copy(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One entry of a COPY frame: `[src_rank, src_seq, rank, step, t_ns, seq]`."""

    src_rank: limits.Rank
    src_seq: limits.Count
    rank: limits.Rank
    step: limits.Step
    t_ns: limits.TimeNs
    seq: limits.Count


_decode = msgspec.msgpack.Decoder(
    Annotated[list[Copy], msgspec.Meta(max_length=MAX_COPIES)]).decode


def decode_copies(payload: bytes | memoryview) -> list[Copy]:
    """The entries of a COPY frame's payload, within ddpviz's limits.

    Returns:
        The copies in file order.

    Raises:
        msgspec.ValidationError: an entry is not 6 integers within limits.py's bounds (the
            message names the copy and its field), or the frame holds over MAX_COPIES.
    """
    try:
        return _decode(payload)
    except msgspec.ValidationError as e:
        raise msgspec.ValidationError(_WHERE.sub(_named, str(e))) from None


_WHERE = re.compile(r"`\$\[(\d+)\](?:\[(\d)\])?`")
_FIELDS = Copy.__struct_fields__


def _named(m: re.Match[str]) -> str:
    i, j = int(m.group(1)), m.group(2)
    return f"copy {i}" if j is None else f"copy {i}'s {_FIELDS[int(j)]}"


class CopyError(ValueError):
    """A copy that names no event it may repeat (the message says which and why)."""


class Sources:
    """What a reader may copy: the events of the COPY_SOURCES types read so far, by (rank, seq),
    copies included (a copy of a copy resolves to the same payload objects). A later event
    with the same (rank, seq) replaces an earlier one, as a writer that reuses a seq means."""

    def __init__(self) -> None:
        # -> (event, its entries: counted when first copied, -1 until then: a file without
        # copies never walks its events' lists here)
        self._events: dict[tuple[int, int], tuple[Event, int]] = {}
        self.copied = 0  # entries repeated by the copies so far (at most MAX_COPIED)

    def add(self, events: Iterable[Event]) -> None:
        """Remember the events of these that a copy may repeat."""
        sources = COPY_SOURCES
        for e in events:
            if type(e) in sources:
                self._events[(e.rank, e.seq)] = (e, -1)

    def resolve(self, copies: list[Copy]) -> list[Event]:
        """The events these copies append, in order (each one's payload shared with its
        source's: `msgspec.structs.replace`).

        Returns:
            One event per copy.

        Raises:
            CopyError: a copy names no earlier event of a COPY_SOURCES type, or the file's
                copies repeat more than MAX_COPIED entries.
        """
        out: list[Event] = []
        replace = msgspec.structs.replace
        for i, c in enumerate(copies):
            got = self._events.get((c.src_rank, c.src_seq))
            if got is None:
                raise CopyError(
                    f"copy {i} repeats the event of rank {c.src_rank} with seq {c.src_seq}, "
                    "and no event before it in the file is one a copy may repeat (one of "
                    f"{', '.join(sorted(t.__name__ for t in COPY_SOURCES))})")
            src, size = got
            if size < 0:
                size = entries(src)
                self._events[(c.src_rank, c.src_seq)] = (src, size)
            self.copied += size
            if self.copied > MAX_COPIED:
                raise CopyError(
                    f"copy {i} brings the entries the file's copies repeat to "
                    f"{self.copied:,}, over the {MAX_COPIED:,} a file may (a copy is a few "
                    "bytes, what reads the trace walks every entry)")
            e = replace(src, rank=c.rank, step=c.step, t_ns=c.t_ns, seq=c.seq)
            self._events[(c.rank, c.seq)] = (e, size)
            out.append(e)
        return out


def entries(e: Event) -> int:
    """The entries of an event's list fields, one level of nesting counted (a bucket map's
    parameter slots): what reading a copy of it walks.

    Returns:
        The count (1 at least).
    """
    n = 1
    for name in e.__struct_fields__:
        value = getattr(e, name)
        if isinstance(value, tuple):
            n += len(value) + sum(len(v) for v in value if isinstance(v, tuple))
    return n


_HEADER = frozenset(Event.__struct_fields__)  # rank, step, t_ns, seq: every event's own


class CopyFinder:
    """The writer's side: which events to write as a copy of one written before. An event of
    a COPY_SOURCES type whose encoding with the four common fields zeroed is at least
    MIN_BYTES and equals that of one written whole is a copy of it. At most KEEP distinct
    payloads are remembered (the first ones); an event written at the (rank, seq) of a
    remembered source ends that source (a reader takes the later event there)."""

    def __init__(self) -> None:
        self._encode = msgspec.msgpack.Encoder().encode
        self._by_payload: dict[bytes, tuple[int, int]] = {}  # payload -> (rank, seq) source
        self._at: dict[tuple[int, int], bytes] = {}  # the inverse
        # payloads already encoded, by their fields' identity (an in-memory Trace shares one
        # parameter list between ranks: columns.py's `Shared`), so that 256 ranks' 1 MB lists
        # are encoded once, not compared by encoding each; the events are kept (their ids
        # stay theirs), at most KEEP
        self._encoded: dict[tuple[object, ...], tuple[Event, bytes]] = {}

    def copy_of(self, e: Event) -> Copy | None:
        """`e` as a copy of an event written before, or None: `e` is written whole (call
        `written(e)` once it is).

        Returns:
            The copy, or None.
        """
        if type(e) not in COPY_SOURCES:
            return None
        key = self._key(e)
        src = self._by_payload.get(key) if key is not None else None
        self._forget((e.rank, e.seq))
        if src is None:
            if key is not None and len(self._by_payload) < KEEP:
                self._by_payload[key] = (e.rank, e.seq)
                self._at[(e.rank, e.seq)] = key
            return None
        return Copy(src[0], src[1], e.rank, e.step, e.t_ns, e.seq)

    def _key(self, e: Event) -> bytes | None:
        ident = (type(e), *(id(v) if isinstance(v := getattr(e, f), tuple) else v
                            for f in e.__struct_fields__ if f not in _HEADER))
        got = self._encoded.get(ident)
        if got is not None:
            key = got[1]
        else:
            key = self._encode(msgspec.structs.replace(e, rank=0, step=0, t_ns=0, seq=0))
            if len(self._encoded) < KEEP:
                self._encoded[ident] = (e, key)
        return key if len(key) >= MIN_BYTES else None

    def _forget(self, at: tuple[int, int]) -> None:
        key = self._at.pop(at, None)
        if key is not None:
            del self._by_payload[key]
