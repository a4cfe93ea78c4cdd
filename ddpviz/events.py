"""The one event vocabulary of ddpviz: every fact the engine can report, typed and frozen.

Events are msgspec Structs tagged with their class name, so the wire codec can encode and
validate them without knowing each one. Every event carries the rank that saw it, the DDP
iteration (`step`, -1 during construction), a monotonic time in ns and a per-rank sequence
number. Fields are plain values only (ints, floats, strings, tuples), never tensors.
Names are past-tense facts, in the order of DDP's life (see ddp-facts.md's walk-through).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Annotated, Literal, Protocol, TypeVar

import msgspec

from ddpviz.findings import Finding
from ddpviz.limits import (
    MAX_PARAMS,
    Blob,
    BucketIndex,
    BucketIndexOrNone,
    BucketLimits,
    BucketMap,
    Bytes,
    ChunkCount,
    ChunkIndex,
    Count,
    Name,
    Names,
    ParamCount,
    ParamIndex,
    ParamIndexOrNone,
    ParamIndices,
    Rank,
    RankValues,
    Shape,
    Step,
    TensorCount,
    Text,
    TimeNs,
    WorldSize,
)

_now = time.monotonic_ns

SCHEMA_VERSION = 1

# The collectives a rank can wait in (the watchdog's positions and hang findings name them).
Collective = Literal["all-reduce", "used-parameter all-reduce", "bucket rebuild broadcast",
                     "buffer broadcast"]
# Where in an iteration a rank is (the watchdog's positions): before the first forward, or in a
# forward or backward pass.
Phase = Literal["constructor", "forward", "backward"]
# The phase a rank is in while it waits in each collective (the watchdog reports it). Beside
# the two Literals rather than in the model's phase table (ddpviz/model/phases.py), which names
# event types for readers: the engine reads this one and imports only the vocabulary.
PHASE_OF_COLLECTIVE: dict[Collective, Phase] = {
    "all-reduce": "backward", "used-parameter all-reduce": "backward",
    "bucket rebuild broadcast": "forward", "buffer broadcast": "forward"}


class Event(msgspec.Struct, frozen=True, tag=True):
    """Base of every event; never emitted itself."""

    rank: Rank
    step: Step  # DDP iteration; -1 while the constructor runs
    t_ns: TimeNs  # time.monotonic_ns() on the emitting rank
    seq: Count  # per-rank sequence number, from 0, no gaps


# --- step 1: parameters -----------------------------------------------------------------------


class ParamInfo(msgspec.Struct, frozen=True):
    """A parameter as DDP sees it (index = position in the reducer's parameter list)."""

    index: ParamIndex
    name: Name
    shape: Shape
    dtype: Name
    device: Name
    sparse_grad: bool
    # bytes per element (tensor.element_size()); 0 in traces written before it was recorded:
    # read it with `element_size_of`, which falls back to the dtype's name for those.
    element_size: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0


# Bytes per element by dtype name, only for traces written before ParamInfo.element_size.
_LEGACY_ELEMENT_SIZE = {
    "float64": 8, "double": 8, "int64": 8, "long": 8, "uint64": 8, "complex64": 8,
    "complex128": 16, "complex32": 4, "float32": 4, "float": 4, "int32": 4, "int": 4,
    "uint32": 4, "float16": 2, "half": 2, "bfloat16": 2, "int16": 2, "uint16": 2, "uint8": 1,
    "int8": 1, "bool": 1}


def element_size_of(p: ParamInfo) -> int:
    """Bytes per element of `p`'s gradient: as recorded, or (traces written before it was)
    from its dtype's name (float8 types: 1); 0 when neither says."""
    if p.element_size:
        return p.element_size
    dtype = p.dtype.removeprefix("torch.")
    return _LEGACY_ELEMENT_SIZE.get(dtype, 1 if dtype.startswith("float8") else 0)


class ParamsBuilt(Event, frozen=True):
    params: Annotated[tuple[ParamInfo, ...], msgspec.Meta(max_length=MAX_PARAMS)]
    buffers: Names  # dotted names of the buffers synced from rank 0
    ignored: Names  # names in _ddp_params_and_buffers_to_ignore that matched


# --- step 2: verification ---------------------------------------------------------------------


class Mismatch(msgspec.Struct, frozen=True):
    """One field of one parameter (or buffer) that differs across ranks."""

    kind: Name  # "param" | "buffer" | "count" | "device" (ranks on one host sharing a GPU)
    index: ParamIndexOrNone  # position in the lowest holding rank's list (-1: count, device)
    name: Name  # dotted name ("parameters"/"buffers" for counts, "" for device)
    # "present" | "name" | "order" | "shape" | "stride" | "dtype" | "device" | "requires_grad"
    # | "sparse_grad" | "count" | "cuda_device"
    field: Name
    values: RankValues  # (value, ranks holding it), most common first


class VerificationStarted(Event, frozen=True):
    world_size: WorldSize
    n_params: ParamCount
    n_buffers: ParamCount


class VerificationPassed(Event, frozen=True):
    world_size: WorldSize
    digest: Name


class VerificationFailed(Event, frozen=True):
    world_size: WorldSize
    mismatches: Annotated[tuple[Mismatch, ...], msgspec.Meta(max_length=2 * MAX_PARAMS + 2)]


# --- step 3: state broadcast ------------------------------------------------------------------


class BroadcastStarted(Event, frozen=True):
    src: Rank
    n_tensors: TensorCount
    total_bytes: Bytes
    n_chunks: ChunkCount


class BroadcastChunkSent(Event, frozen=True):
    """A coalesced chunk's broadcast was launched (at most 2 are in flight)."""

    chunk: ChunkIndex
    dtype: Name
    device: Name
    nbytes: Bytes
    n_tensors: TensorCount


class BroadcastChunkDone(Event, frozen=True):
    chunk: ChunkIndex
    nbytes: Bytes


class BroadcastFinished(Event, frozen=True):
    total_bytes: Bytes
    seconds: float


# --- step 4: buckets --------------------------------------------------------------------------


class BucketAssigned(Event, frozen=True):
    """The bucket map in force from this step on (reduction order)."""

    buckets: BucketMap  # param indices per bucket, bucket 0 reduced first
    # per-bucket size limit (cap) in bytes, as torch used it; () where the recording could not
    # tell torch's caps (watch(): a map learned from the comm hook, or a replay that differs)
    limits: BucketLimits
    rebuilt: bool  # False for the constructor's map, True for a gradient-ready-order rebuild


# --- steps 5-6: forward and backward ----------------------------------------------------------


class ForwardStarted(Event, frozen=True):
    pass


class BuffersSynced(Event, frozen=True):
    n_buffers: ParamCount
    nbytes: Bytes


class BackwardStarted(Event, frozen=True):
    pass


class GradReady(Event, frozen=True):
    param: ParamIndex
    bucket: BucketIndex


class BucketReady(Event, frozen=True):
    bucket: BucketIndex


class GradsSummarized(Event, frozen=True):
    """The GradReady events of one bucket in one step, aggregated at the source: emitted just
    before the bucket's BucketReady on steps recorded at a detail level that skips
    per-parameter events (see `detail=` of DDP and watch). Times are the rank's monotonic ns of
    the first and last gradient that became ready in the bucket."""

    bucket: BucketIndex
    n_grads: ParamCount
    first_t_ns: TimeNs
    last_t_ns: TimeNs
    nbytes: Bytes


class AllReduceLaunched(Event, frozen=True):
    bucket: BucketIndex
    nbytes: Bytes
    dtype: Name


class AllReduceDone(Event, frozen=True):
    bucket: BucketIndex


class BackwardFinished(Event, frozen=True):
    pass


class BackwardComputed(Event, frozen=True):
    """This rank's autograd pass of the step ended: every gradient computed and every bucket
    handed to its all-reduce, before waiting for them (t_ns). Recorded on every synced step by
    watch()'s hook-less strategy, from one gradient hook on the parameter whose gradient is
    ready first (`param`, ready at `first_t_ns`): how the straggler verdict tells the backward
    from the wait on the steps without per-bucket events. See [Note: backward marks] in
    probes/backward_marks.py. `cpu_wait_ns`: how long the rank's main thread has waited for a
    CPU since it started (the kernel's run-queue delay, cumulative; -1 where unknown): See
    [Note: waiting for a CPU] in probes/cpu_wait.py. `left_prev_ns`: when this rank left the
    previous step's backward, its all-reduces waited for (-1: that step was not a synced one
    here, or not seen): whether a rank late at this step was already late leaving the last
    all-reduce (See [Note: lateness it did not add] in _diagnose/straggler.py)."""

    param: ParamIndex = 0
    first_t_ns: TimeNs = 0
    cpu_wait_ns: TimeNs = -1
    left_prev_ns: TimeNs = -1


class UnusedParametersFound(Event, frozen=True):
    params: ParamIndices
    names: Names


class BucketsRebuilt(Event, frozen=True):
    grad_ready_order: ParamIndices


# --- after backward: the optimizer step -------------------------------------------------------


class OptimizerStepStarted(Event, frozen=True):
    """An optimizer holding this DDP's parameters starts its `step()` (torch's global
    optimizer-step pre-hook); `step` is the DDP iteration whose backward it follows. Recorded
    on the sampled steps only (where the per-parameter hooks are armed, see `Recording.every`):
    with OptimizerStepFinished it tells the optimizer step from data loading in the gap
    between a backward and the next forward (the straggler verdict)."""


class OptimizerStepFinished(Event, frozen=True):
    """That optimizer's `step()` returned (torch's global optimizer-step post-hook)."""


# --- transport --------------------------------------------------------------------------------


class EventsDropped(Event, frozen=True):
    count: Count


# --- diagnosis --------------------------------------------------------------------------------


class FindingReported(Event, frozen=True):
    """A rank diagnosed a problem (a mismatch, a hang, a reassigned buffer): see findings.py."""

    finding: Finding


# --- the debugger (ddpviz/debugger/protocol.py: the commands these answer) --------------------

MAX_NONFINITE_AT = 16  # non-finite positions listed by one Inspected
FINITENESS_BINS = 64  # bins of an Inspected finiteness map
MAX_CHUNK_DIGESTS = 256  # chunk digests of one Inspected
HEAD_VALUES = 8  # first values shown by one Inspected


class DebugArmed(Event, frozen=True):
    """This rank is armed for the debugger (the first control message arms it): from here on it
    writes its position to the store at every forward. `bucket_points`: whether this DDP has a
    safe point before each bucket's all-reduce (ddpviz's DDP, watch(guard=True)); `ddp`: which
    DDP it watches ("ddpviz", "torch-guarded", "torch-hookless", "" not yet known)."""

    request: Count
    bucket_points: bool
    ddp: Name


class Parked(Event, frozen=True):
    """This rank stopped at a safe point of `step` and waits for commands (emitted only once it
    really is parked). `point`: "forward" | "bucket" | "after_backward" | "optimizer_step";
    `bucket`: the bucket about to be all-reduced (-1 elsewhere); `reason`: why ("break_at",
    "pause", "step", "finding nonfinite_gradient", "predicate: loss > 10", ...); `request`:
    the command that asked for it (0: a break set earlier, a finding or a predicate)."""

    point: Name
    bucket: BucketIndexOrNone
    reason: Text
    request: Count


class Unparked(Event, frozen=True):
    """This rank left its park: `how` is "resume" | "step" | "abort" | "advance" (the agreed
    boundary moved past it: another rank had gone further); `request` the command (0: none)."""

    how: Name
    request: Count


class Inspected(Event, frozen=True):
    """One tensor's summary on this parked rank, answering `Inspect` (`request`). `error` is
    non-empty (and the summary empty) when the tensor is not there, saying why. Positions are
    multi-indices into `shape`. `finiteness[i]`: fraction of non-finite elements in the i-th of
    up to 64 equal bins of the flat tensor. `digest`: blake2b-128 (hex) of the tensor's bytes;
    `chunk_digests[i]` (SHA-1 cut to 128 bits, hex) of flat elements [i * chunk_elements,
    (i + 1) * chunk_elements): two ranks' first differing chunk is then fetched alone
    (Fetch(chunk=i))."""

    request: Count
    name: Name
    what: Name
    error: Text = ""
    shape: Shape = ()
    dtype: Name = ""
    device: Name = ""
    numel: Count = 0
    norm: float = 0.0  # L2 norm (over the finite elements when some are not)
    max_abs: float = 0.0  # over the finite elements
    n_nan: Count = 0
    n_posinf: Count = 0
    n_neginf: Count = 0
    nonfinite_at: Annotated[tuple[Shape, ...], msgspec.Meta(max_length=MAX_NONFINITE_AT)] = ()
    finiteness: Annotated[tuple[float, ...], msgspec.Meta(max_length=FINITENESS_BINS)] = ()
    digest: Name = ""
    chunk_elements: Count = 0
    chunk_digests: Annotated[tuple[Name, ...], msgspec.Meta(max_length=MAX_CHUNK_DIGESTS)] = ()
    head: Annotated[tuple[float, ...], msgspec.Meta(max_length=HEAD_VALUES)] = ()


class Fetched(Event, frozen=True):
    """Part `part` of `parts` of a tensor's raw bytes (little-endian, C order, base64 in `data`:
    at most 768 KiB a part), answering `Fetch` (`request`): flat elements from `offset` on, of
    the whole tensor's `shape` and `dtype` (a torch dtype name, e.g. "float32"). `error` is
    non-empty (and no data) when refused, saying how to narrow the fetch."""

    request: Count
    name: Name
    what: Name
    error: Text = ""
    dtype: Name = ""
    shape: Shape = ()
    offset: Count = 0
    part: Count = 0
    parts: Count = 0
    data: Blob = ""


class CodeRan(Event, frozen=True):
    """`RunCode` (`request`) ran on this rank: what it printed (the last MAX_TEXT characters),
    the repr of its last expression's value ("" when none) and the error it raised ("" none)."""

    request: Count
    stdout: Text
    result_repr: Text
    error: Text


class StacksTaken(Event, frozen=True):
    """Every thread's stack on this rank, answering `Stacks` (`request`): one text per thread,
    `threads[i]` naming it."""

    request: Count
    threads: Names
    stacks: Annotated[tuple[Text, ...], msgspec.Meta(max_length=MAX_PARAMS)]


class DebugRefused(Event, frozen=True):
    """This rank did not do what command `request` asked, and says why (a replay, an unknown
    parameter, a bucket break under the hook-less watch(), a command that needs a park)."""

    request: Count
    reason: Text


ANY_EVENT = (
    ParamsBuilt | VerificationStarted | VerificationPassed | VerificationFailed
    | BroadcastStarted | BroadcastChunkSent | BroadcastChunkDone | BroadcastFinished
    | BucketAssigned | ForwardStarted | BuffersSynced | BackwardStarted | GradReady | BucketReady
    | GradsSummarized | AllReduceLaunched | AllReduceDone | BackwardFinished | BackwardComputed
    | UnusedParametersFound | BucketsRebuilt | OptimizerStepStarted | OptimizerStepFinished
    | EventsDropped | FindingReported | DebugArmed | Parked | Unparked | Inspected | Fetched
    | CodeRan | StacksTaken | DebugRefused
)


class Emitter(Protocol):
    """Anything that takes events: a list's append, a transport sender, a recorder."""

    def __call__(self, event: Event, /) -> None: ...


E = TypeVar("E", bound=Event)


ENV_SLOW_MOTION = "DDPVIZ_SLOW_MOTION"


def slow_motion_from_env() -> float:
    """Seconds to pause after each event, from DDPVIZ_SLOW_MOTION (teaching mode; 0: off)."""
    raw = os.environ.get(ENV_SLOW_MOTION, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"ddpviz: {ENV_SLOW_MOTION}={raw!r} is not a number of seconds >= 0.\n"
                         "Set it to e.g. 0.2, or unset it to run at full speed.")
    return value


class Tap:
    """Stamps and forwards events for one rank. With no emitter, `enabled` is False and callers
    skip building events at all: `if tap.enabled: tap.emit(GradReady, i, b)` (fields
    positional, in declared order).

    `slow_motion` (seconds; default from DDPVIZ_SLOW_MOTION) pauses after each emitted event,
    so a class can watch broadcast chunks, hooks and buckets happen one by one."""

    __slots__ = ("_counter", "_emitter", "enabled", "rank", "slow_motion", "step")

    def __init__(self, emitter: Emitter | None = None, rank: int = 0, *,
                 slow_motion: float | None = None) -> None:
        self._emitter = emitter
        self.enabled = emitter is not None
        self.rank = rank
        self.step = -1
        self._counter = itertools.count()
        self.slow_motion = slow_motion_from_env() if slow_motion is None else float(slow_motion)

    def emit(self, cls: type[E], *fields: object) -> None:
        """Build `cls(rank, step, now, seq, *fields)` and hand it on; fields in declared order."""
        if self._emitter is None:
            return
        self._emitter(cls(self.rank, self.step, _now(), next(self._counter), *fields))
        if self.slow_motion:
            time.sleep(self.slow_motion)

    def emit_as(self, step: int, t_ns: int, cls: type[E], *fields: object) -> None:
        """Like `emit`, for a fact observed earlier: stamped with that `step` and time (a
        sampled step's per-parameter times, emitted once a finding makes the step full)."""
        if self._emitter is None:
            return
        self._emitter(cls(self.rank, step, t_ns, next(self._counter), *fields))

    def flush(self, timeout: float = 1.0) -> None:
        """Wait, at most `timeout` seconds, until what was emitted is shipped, where the
        emitter can say (a `Sender`): for a fact that must outlive a process about to die."""
        flush = getattr(self._emitter, "flush", None)
        if callable(flush):
            flush(timeout)


_default_emitter: Emitter | None = None


def set_default_emitter(emitter: Emitter | None) -> Emitter | None:
    """Install the emitter that engine objects built without one report to (a launched rank or
    `ddpviz.connect()` sets it). Returns the previous one."""
    global _default_emitter
    previous, _default_emitter = _default_emitter, emitter
    return previous


def default_emitter() -> Emitter | None:
    """The emitter installed by `set_default_emitter`, or None (events off)."""
    return _default_emitter

