"""The debugger's wire protocol: what the notebook tells a rank (`Command`s) and the breaks it
sets (`Break`s). Torch-free: the notebook side and the rank side both import it.

Commands travel notebook -> rank in a signed message of header kind "control" (see
transport/codec.py): the collector sends them over the authenticated connection the rank's
Sender opened, so a peer without the session secret can neither complete the CURVE handshake
nor sign a message, and the rank never listens. The body is a msgpack array of at most
`MAX_COMMANDS` tagged `Command` structs. Every field is bounded (ddpviz.limits) and checked
while decoding, before anything is sized by it.

Replies come back rank -> notebook as ordinary events (ddpviz.events: `DebugArmed`, `Parked`,
`Unparked`, `Inspected`, `Fetched`, `CodeRan`, `StacksTaken`, `DebugRefused`), each carrying
the `request` of the command it answers, so they are in the trace as well.

[Note: request numbers]
Every command has a `request` number, strictly increasing over every command a notebook
process sends (`next_request()` hands them out; it starts from the wall clock in microseconds,
so a restarted kernel or a second Debugger still counts upwards). A rank executes a command only
if its request is above the last it accepted: a command captured and sent again is refused with
`DebugRefused(reason="replay ...")`. The control message's header frame number is checked the
same way first (per collector), so a replayed message is refused before its body is read.
"""

from __future__ import annotations

import threading
import time
from typing import Annotated, Literal

import msgspec

from ddpviz import limits
from ddpviz.limits import MAX_TEXT, BucketIndexOrNone, Count, Name, Text

MAX_COMMANDS = 64  # commands in one control message
MAX_BREAKS = 1024  # breaks in one SetBreaks (the whole break set)
MAX_FETCH_ELEMENTS = 1 << 24  # the most `Fetch.max_elements` may allow (16M elements)
DEFAULT_FETCH_ELEMENTS = 1_000_000  # what `Fetch` allows unless told
MAX_CODE = MAX_TEXT  # characters of code in one RunCode

# What a safe point is (where every rank parks):
#   forward         before DDP's forward of `step` (before any collective of that forward)
#   bucket          before bucket `bucket`'s all-reduce of `step` is launched
#   after_backward  after the synced backward of `step`: every bucket's all-reduce complete,
#                   its result in .grad, before the optimizer step (no point under no_sync())
#   optimizer_step  after the optimizer step that follows the backward of `step`
Point = Literal["forward", "bucket", "after_backward", "optimizer_step"]

# What one tensor of `Inspect`/`Fetch` is, for the parameter (or bucket) named:
#   value                  the parameter's data
#   grad                   its `.grad` (after the all-reduce once the bucket's is done)
#   grad_before_allreduce  the local gradient a nonfinite_gradient break kept before its
#                          all-reduce (the origin rank's NaN positions; see Note there)
#   bucket_buffer          bucket `bucket`'s flat buffer (ddpviz's DDP; under watch(guard=True)
#                          the buffer its comm hook was given), `name` ignored
#   bucket_grads           the concatenation of bucket `bucket`'s parameters' `.grad`s
#   optimizer_state        the optimizer's state tensor `state_key` of the parameter (e.g.
#                          "exp_avg"; "" for the first tensor it holds)
What = Literal["value", "grad", "grad_before_allreduce", "bucket_buffer", "bucket_grads",
               "optimizer_state"]

# How far `Step` moves: to the next bucket's safe point (same step, or the next step's first
# bucket), to the next forward, or to the end of the step where the next finding is said.
StepTo = Literal["bucket", "step", "finding"]


# --- breaks ---------------------------------------------------------------------------------


class Break(msgspec.Struct, frozen=True, tag=True, forbid_unknown_fields=True):
    """Base of every break condition; never sent itself."""


class BreakAt(Break, frozen=True):
    """Park every rank at a deterministic safe point: `where` of step `step` (`bucket` only with
    where="bucket": the bucket's index in launch order, bucket 0 launched first)."""

    step: limits.Step
    where: Point = "bucket"
    bucket: BucketIndexOrNone = -1  # -1 at every other point


class BreakOn(Break, frozen=True):
    """Park at the next forward after any rank says a finding of this kind (findings.py's kinds,
    e.g. "nonfinite_gradient", "replicas_diverged"). With "nonfinite_gradient" armed, the rank
    where the NaN began keeps its local gradient from before the all-reduce (bounded), for
    `Inspect(what="grad_before_allreduce")`."""

    kind: Name


class BreakWhen(Break, frozen=True):
    """Park at a forward soon after `predicate` (a Python expression) is true on any rank,
    evaluated after each forward and after each optimizer step in the training loop's names
    under the run-code namespace (`loss`, `output`, `step`, `rank`, `model`, ...;
    debugger/predicates.py). A predicate that raises is reported once (DebugRefused) and
    dropped."""

    predicate: Text


ANY_BREAK = BreakAt | BreakOn | BreakWhen
Breaks = Annotated[tuple[ANY_BREAK, ...], msgspec.Meta(max_length=MAX_BREAKS)]


# --- commands -------------------------------------------------------------------------------


class Command(msgspec.Struct, frozen=True, tag=True, forbid_unknown_fields=True):
    """Base of every command; never sent itself. `request`: see [Note: request numbers]."""

    request: Count


class Arm(Command, frozen=True):
    """Arm the rank: from now on it writes its position to the store at every forward (one store
    write and one read per step). Answered by `DebugArmed`. Every other command arms too."""


class SetBreaks(Command, frozen=True):
    """Replace the whole break set with `breaks` (empty: clear). Applied on every rank from one
    agreed step boundary on, so every rank has the same breaks at every step."""

    breaks: Breaks = ()


class Pause(Command, frozen=True):
    """Park every rank at the next forward every rank can reach (claimed through the store)."""


class Resume(Command, frozen=True):
    """Leave the park; the run goes on exactly as if it had never stopped."""


class Step(Command, frozen=True):
    """Resume and park again at the next safe point of kind `to` (see StepTo)."""

    to: StepTo = "step"


class Abort(Command, frozen=True):
    """End the rank: a parked rank raises `ddpviz.debugger.Aborted` (a BaseException) out of its
    park, events flushed; a rank not parked is ended within 5 s after flushing its events."""


class Inspect(Command, frozen=True):
    """Summarize one tensor on the parked rank (answered by `Inspected`): norms, non-finite
    counts and positions, a finiteness map, digests (whole and per chunk), the first values."""

    name: Name  # a parameter's dotted name (as in ParamsBuilt); "" for a bucket's tensors
    what: What = "value"
    bucket: BucketIndexOrNone = -1  # for bucket_buffer / bucket_grads
    state_key: Name = ""  # for optimizer_state


class Fetch(Command, frozen=True):
    """The raw bytes of one tensor (answered by one or more `Fetched` parts), or of one of its
    `Inspected.chunk_digests` chunks (`chunk` >= 0), or of the flat range `start`..`stop`.
    Refused (DebugRefused) above `max_elements`, naming a narrower slice to ask for."""

    name: Name
    what: What = "value"
    bucket: BucketIndexOrNone = -1
    state_key: Name = ""
    chunk: Annotated[int, msgspec.Meta(ge=-1, le=1 << 20)] = -1  # -1: not one chunk
    start: Count = 0  # a flat element range [start, stop) (stop 0: to the end)
    stop: Count = 0
    max_elements: Annotated[int, msgspec.Meta(ge=1, le=MAX_FETCH_ELEMENTS)] = \
        DEFAULT_FETCH_ELEMENTS


class RunCode(Command, frozen=True):
    """Run `code` on the parked rank's training thread, stdout captured (answered by
    `CodeRan`). Its namespace holds `model`, `ddp`, `step`, `rank`, `world_size`, and where
    known `loss`, `output`, `optimizer`, `torch`; it persists between RunCodes of one park."""

    code: Annotated[str, msgspec.Meta(max_length=MAX_CODE)]


class Stacks(Command, frozen=True):
    """Every thread's stack on the rank (answered by `StacksTaken`)."""


ANY_COMMAND = Arm | SetBreaks | Pause | Resume | Step | Abort | Inspect | Fetch | RunCode | Stacks
Commands = Annotated[list[ANY_COMMAND], msgspec.Meta(max_length=MAX_COMMANDS)]

_request_lock = threading.Lock()
_last_request = 0


def last_request() -> int:
    """The last request number `next_request` handed out in this process (0: none yet)."""
    return _last_request


def next_request() -> int:
    """A request number above every one this process handed out before, and above the wall
    clock in microseconds (See [Note: request numbers])."""
    global _last_request
    with _request_lock:
        _last_request = max(_last_request + 1, time.time_ns() // 1000)
        return _last_request
