"""The bounds on everything a trace file or a wire message may declare.

Trace files and wire messages are untrusted: every count, index and size in them is checked
against these limits before it sizes anything (a list, a loop, a widget). Most bounds are
msgspec constraints on the event fields themselves (the `Annotated` aliases below, used by
`ddpviz.events` and `ddpviz.findings`), so msgspec's typed decoders reject an out-of-range value
while decoding, with a message naming the field (`... - at $[3].world_size`). What one field
cannot say (a shape's element count, the total of a bucket map, the nesting of a trace's
metadata) `check_events` and `check_meta` check; the trace loader and the wire codec call them.

The JupyterLab viewer mirrors these numbers in extension/src/limits.ts (a test keeps them equal).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import msgspec

MAX_WORLD_SIZE = 1 << 17  # ranks per run (131,072); a rank is in [0, MAX_WORLD_SIZE)
MAX_PARAMS = 1 << 20  # parameters (or buffers) of one model, and indices below it
MAX_BUCKETS = 1 << 20  # buckets of one bucket map, and bucket indices below it
MAX_CHUNKS = 1 << 16  # coalesced broadcast chunks of one state broadcast
MAX_DIMS = 64  # dimensions of one parameter's shape
MAX_NUMEL = 1 << 62  # elements of one tensor (the product of its shape)
MAX_BYTES = (1 << 63) - 1  # any byte count (sys.maxsize: a bucket without a limit)
MAX_STEP = 1 << 40  # DDP iterations; -1 is construction
MAX_COUNT = 1 << 62  # sequence numbers, dropped-event counts
MAX_NAME = 4096  # characters of a name, dtype, device, digest or value
MAX_TEXT = 65536  # characters of a finding's title, detail line or fix, or a metadata string
MAX_LINES = 1024  # detail lines of one finding
MAX_META_DEPTH = 16  # nesting of lists and maps in a trace's metadata
MAX_META_ITEMS = 100_000  # values (strings, numbers, lists, maps) in a trace's metadata
MAX_BLOB = 1 << 20  # base64 characters in one debugger Fetched part (768 KiB of raw bytes)

# Field types: msgspec checks these while decoding (never when code builds an event).
Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]
WorldSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_WORLD_SIZE)]
WorldSizeOrUnknown = Annotated[int, msgspec.Meta(ge=0, le=MAX_WORLD_SIZE)]  # 0: unknown
Step = Annotated[int, msgspec.Meta(ge=-1, le=MAX_STEP)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
# a time or clock offset in ns: +-146 years, so a time plus an offset fits 64 bits (columns)
TimeNs = Annotated[int, msgspec.Meta(ge=-MAX_COUNT, le=MAX_COUNT)]
ParamIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_PARAMS)]
ParamIndexOrNone = Annotated[int, msgspec.Meta(ge=-1, lt=MAX_PARAMS)]  # -1: not about one
ParamCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_PARAMS)]
TensorCount = Annotated[int, msgspec.Meta(ge=0, le=2 * MAX_PARAMS)]  # parameters + buffers
BucketIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_BUCKETS)]
BucketIndexOrNone = Annotated[int, msgspec.Meta(ge=-1, lt=MAX_BUCKETS)]
ChunkIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_CHUNKS)]
ChunkCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_CHUNKS)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)]
Dim = Annotated[int, msgspec.Meta(ge=0, le=MAX_NUMEL)]
Shape = Annotated[tuple[Dim, ...], msgspec.Meta(max_length=MAX_DIMS)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
Pid = Annotated[int, msgspec.Meta(ge=0, lt=1 << 32)]  # a process id (pid_t is 32 bits)
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
Blob = Annotated[str, msgspec.Meta(max_length=MAX_BLOB)]  # base64 (a string in every viewer)
Ranks = Annotated[tuple[Rank, ...], msgspec.Meta(max_length=MAX_WORLD_SIZE)]
ParamIndices = Annotated[tuple[ParamIndex, ...], msgspec.Meta(max_length=MAX_PARAMS)]
Names = Annotated[tuple[Name, ...], msgspec.Meta(max_length=MAX_PARAMS)]
Lines = Annotated[tuple[Text, ...], msgspec.Meta(max_length=MAX_LINES)]
# (value, ranks holding it): at most one distinct value per rank
RankValues = Annotated[tuple[tuple[Name, Ranks], ...], msgspec.Meta(max_length=MAX_WORLD_SIZE)]
# ranks lo..hi as (lo, hi), lo <= hi (check_events checks the order): a group of ranks whatever
# the world's size, without a number per rank
RankSpans = Annotated[tuple[tuple[Rank, Rank], ...], msgspec.Meta(max_length=MAX_WORLD_SIZE)]
# (what a group of ranks holds, its ranks): at most one group per rank
HeldBy = Annotated[tuple[tuple[Name, RankSpans], ...], msgspec.Meta(max_length=MAX_WORLD_SIZE)]
# per tensor, (its dotted name, its groups): one per detail line at most
TensorGroups = Annotated[tuple[tuple[Name, HeldBy], ...], msgspec.Meta(max_length=MAX_LINES)]
BucketMap = Annotated[tuple[ParamIndices, ...], msgspec.Meta(max_length=MAX_BUCKETS)]
BucketLimits = Annotated[tuple[Bytes, ...], msgspec.Meta(max_length=MAX_BUCKETS)]


class LimitError(ValueError):
    """A decoded value beyond the limits of this module (the caller says where it came from)."""


# Types (msgspec Structs) by whether they have a field check_events looks at.
_CHECKED_FIELDS = {"params", "buckets", "values", "finding", "mismatches"}
_CHECKED: dict[type, bool] = {}


def _is_checked(cls: type) -> bool:
    checked = _CHECKED.get(cls)
    if checked is None:
        fields = set(getattr(cls, "__struct_fields__", ("params", "buckets", "values")))
        checked = _CHECKED[cls] = bool(fields & _CHECKED_FIELDS)
    return checked


def check_events(events: Iterable[Any]) -> None:
    """What the field types cannot bound: a shape's element count, the parameters of a bucket
    map in all, the ranks listed by a finding's values, a finding's rank spans per tensor.
    Raises LimitError naming the field."""
    if isinstance(events, list):
        types = set(map(type, events))  # a chunk of hooks only: nothing to check
        if not any(map(_is_checked, types)):
            return
    for i, e in enumerate(events):
        if not _is_checked(type(e)):
            continue  # e.g. a gradient hook: nothing its field types do not bound already
        params = getattr(e, "params", None)
        if isinstance(params, tuple) and params and hasattr(params[0], "shape"):
            for p in params:
                numel = 1
                for d in p.shape:  # at most MAX_DIMS factors, each <= MAX_NUMEL
                    numel *= d
                if numel > MAX_NUMEL:
                    raise LimitError(f"event {i} ({type(e).__name__}): params[{p.index}].shape "
                                     f"has {numel} elements, expected at most {MAX_NUMEL}")
        buckets = getattr(e, "buckets", None)
        if isinstance(buckets, tuple):
            total = sum(len(b) for b in buckets)
            if total > MAX_PARAMS:
                raise LimitError(f"event {i} ({type(e).__name__}): buckets list {total} "
                                 f"parameters in all, expected at most {MAX_PARAMS}")
        for holder in (e, getattr(e, "finding", None), *getattr(e, "mismatches", ())):
            values = getattr(holder, "values", None)
            if isinstance(values, tuple) and values:
                total = sum(len(rs) for _, rs in values)
                if total > MAX_WORLD_SIZE:
                    raise LimitError(f"event {i} ({type(e).__name__}): values list {total} "
                                     f"ranks in all, expected at most {MAX_WORLD_SIZE}")
        # a tensor's groups partition the ranks: at most one span per rank in all
        for j, (_, held) in enumerate(getattr(getattr(e, "finding", None), "tensors", ())):
            total = sum(len(spans) for _, spans in held)
            backwards = any(lo > hi for _, spans in held for lo, hi in spans)
            if total > MAX_WORLD_SIZE or backwards:
                raise LimitError(f"event {i} ({type(e).__name__}): finding.tensors[{j}] lists "
                                 f"{total} rank spans{' (one with lo > hi)' if backwards else ''}"
                                 f", expected at most {MAX_WORLD_SIZE}, each with lo <= hi")


def check_meta(meta: object) -> None:
    """A trace's metadata: plain data nested at most MAX_META_DEPTH deep, at most
    MAX_META_ITEMS values, strings of at most MAX_TEXT characters. Iterative (no recursion).
    Raises LimitError naming the offending key path."""
    stack: list[tuple[object, int, str]] = [(meta, 0, "meta")]
    items = 0
    while stack:
        value, depth, where = stack.pop()
        items += 1
        if items > MAX_META_ITEMS:
            raise LimitError(f"{where}: more than {MAX_META_ITEMS} values in the metadata")
        if isinstance(value, str):
            if len(value) > MAX_TEXT:
                raise LimitError(f"{where}: a string of {len(value)} characters, expected at "
                                 f"most {MAX_TEXT}")
        elif isinstance(value, dict | list | tuple):
            if depth >= MAX_META_DEPTH:
                raise LimitError(f"{where}: nested more than {MAX_META_DEPTH} deep")
            if isinstance(value, dict):
                for k, v in value.items():
                    if isinstance(k, str) and len(k) > MAX_NAME:
                        raise LimitError(f"{where}: a key of {len(k)} characters, expected "
                                         f"at most {MAX_NAME}")
                    stack.append((v, depth + 1, f"{where}[{str(k)[:40]!r}]"))
            else:
                stack.extend((v, depth + 1, f"{where}[{j}]") for j, v in enumerate(value))
