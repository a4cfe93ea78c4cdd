"""The job's collectives, as each rank issued them: a ledger of every collective the job calls
through `torch.distributed`'s Python functions (all_reduce, all_gather, barrier, the object
collectives, send/recv, ...), on every process group, with its op, what must agree across
ranks (dtype, element count, source rank, reduce op), the user's call site and its position in
the group's own sequence of collectives. DDP's collectives (torch's C++ reducer) are not calls
into Python; they take positions in the same sequence, which the ledger marks by DDP step.

The histories are compared across ranks by collective_check.py. See [Note: positions].
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from ddpviz.engine import comm
from ddpviz.envvars import ENV_RING_DIR, ENV_TRACE_DIR
from ddpviz.probes import ledger_ring
from ddpviz.probes.collective_compare import Entry, Mark
from ddpviz.probes.stack_text import user_frame

# [Note: positions]
# Every process group counts the collectives issued on it: torch's per-group sequence number
# (`ProcessGroup._get_sequence_number_for_group()`, the number Flight Recorder and
# TORCH_DISTRIBUTED_DEBUG use), which DDP's C++ reducer and torch's internal collectives
# advance too. Collectives pair across ranks by that order, so the k-th collective of a group
# on one rank runs with the k-th on every other: the ledger keys each call by the number
# before it (its *position*). A rank whose position k is a barrier while another's is DDP's
# bucket all-reduce has paired the two, whatever either returned.
# Point-to-point calls (send/recv, batch_isend_irecv, monitored_barrier, which is built of
# them) advance the number only on the ranks involved (gloo), so positions after them would
# differ on healthy ranks: the ledger subtracts what they advanced (`shift`), and such a call
# still in progress ends what can be compared on that rank. Functional collectives and C++
# extensions advance the number without a Python call: their positions read as "not issued
# through torch.distributed", never as a mismatch of their own.

MAX_ENTRIES = 4096  # per group: the history kept for comparison (older ones were compared)
MAX_SITE = 160  # characters of a call site


# [Note: the ledger's hot path]
# The wrapper runs on the training thread at every collective the job issues, often every step
# (a metric's all_reduce), so it keeps only what it reads for free and leaves the text to the
# poster thread (collective_check.py, twice a second): a `Call` holds the raw arguments that
# must agree (a tensor's dtype object and element count, a list's length, the reduce op and
# source rank as given) and the user's frame as (code object, line); `entry()` turns it into
# the `Entry` the ranks compare, with the same text as if it had been written at the call. The
# user's frame is the first whose code is not torch's, ddpviz's or the standard library's:
# that is decided once per code object (stack_text.user_frame, the rule every "where in the
# job's code" of ddpviz follows) and a new call site is one (code, line) not seen before.
# Arguments are picked from `args`/`kwargs` by the positions read once from the function's
# signature, never bound.
# With a trace folder the call is also written to this rank's ring before it runs (See [Note:
# the ring], ledger_ring.py): its text (op, signature, site) is encoded once per call site and
# arguments and kept (`_ring_texts`), so a call seen before costs a dict lookup and one slot's
# write. Measured in docs/collectives.md (benchmarks/bench_collectives.py).


class Call(msgspec.Struct, gc=False):
    """One collective as this rank issued it, as the training thread recorded it (raw: See
    [Note: the ledger's hot path]); `entry()` is what ranks compare. `span` is set once, when
    the call returns (by the thread that issued it)."""

    pos: int
    span: int
    op: str
    raw: tuple[Any, ...]  # the arguments that must agree, as `_SIGS`/`_ASYM` keep them
    code: CodeType | None  # the user's frame (None: no frame outside torch/ddpviz/stdlib)
    line: int
    step: int
    asym: bool
    bucket: int
    forward: int = 0
    ring: int = -1  # its record in this rank's ring (ledger_ring.py), -1: none

    def entry(self) -> Entry:
        """The Entry of this call (its text made now; the poster's thread calls this)."""
        return Entry(self.pos, self.span, self.op, _text(self.op, self.raw),
                     site_text(self.code, self.line), self.step, self.asym, self.bucket,
                     self.forward)


class GroupLedger:
    """One process group's history on this rank."""

    def __init__(self, group: dist.ProcessGroup, name: str, ranks: tuple[int, ...]) -> None:
        self.group = group
        self.name = name
        self.ranks = ranks  # global ranks, in group-rank order
        self.entries: deque[Call] = deque(maxlen=MAX_ENTRIES)
        self.marks: deque[Mark] = deque(maxlen=MAX_ENTRIES)
        self.count = 0  # entries ever appended
        self.since = 0  # positions below this were not recorded (before the ledger was on)
        self.shift = 0  # sequence numbers taken by point-to-point calls
        self.open_asym: Call | None = None  # a point-to-point call in progress
        self.comparable = True
        self._seq = getattr(group, "_get_sequence_number_for_group", None)

    def seq(self) -> int | None:
        try:
            return self._seq()  # type: ignore[misc]
        except Exception:  # a backend without sequence numbers: nothing to compare by
            return None

    def position(self) -> int | None:
        """How far this rank got in the group's sequence (positions below it are issued)."""
        if self.open_asym is not None:
            return self.open_asym.pos
        seq = self.seq()
        return None if seq is None else seq - self.shift


class _Local(threading.local):
    depth = 0


_local = _Local()
_lock = threading.Lock()
_groups: dict[int, GroupLedger] = {}  # id(ProcessGroup) -> its ledger
_issued = 0
_step = -1  # the DDP step the training thread is in (set by the watches)
_installed = False
_enabled = 0  # watches and twins that asked for the ledger and are still open
_failed: list[str] = []  # why the ledger stepped aside, said once
# collective_check sets this: post `ledger` now, counting the entry being issued (a new call
# site's first collective)
on_new_site: Callable[[GroupLedger], None] | None = None


def job_collectives_issued() -> int:
    """How many collectives this process issued through torch.distributed's Python functions
    while a ledger was on (monotonically increasing)."""
    return _issued


def enabled() -> bool:
    """Whether the ledger records now."""
    return _enabled > 0


_known = 0  # process groups seen in torch's registry


def groups() -> list[GroupLedger]:
    """Every group's ledger, including groups this rank has issued nothing on yet (a group
    only other ranks use still has a position here, which the comparison needs)."""
    global _known
    try:
        from torch.distributed import distributed_c10d as c10d

        registry = list(c10d._world.pg_map)
    except Exception:
        registry = []
    if len(registry) != _known:
        _known = len(registry)
        for group in registry:
            _ledger_of(group)
    with _lock:
        return list(_groups.values())


def set_step(step: int) -> None:
    global _step
    _step = step


def mark_ddp_step(group: dist.ProcessGroup, step: int) -> None:
    """A DDP's forward of `step` begins on `group` (its collectives follow)."""
    global _step
    _step = step
    if _enabled:
        _mark(group, step, -1)


# [Note: the step mark's hot path]
# Every forward of a watched DDP marks its step in its group's ledger: ~9 us a step through
# `mark_ddp_step` at ~1 ms steps (the training thread comes back to it cold after torch's
# step: each line costs ~1-2 us there, against 1.2 us for the whole call in a warm loop).
# `step_marker(group)` is the same for one DDP's forward: the ledger is resolved once, and
# without a ring to write the mark is appended without `_lock`: `deque.append` is atomic, and
# the poster finds what it has not posted by the identity of the last mark it posted, not by
# a count the lock would have to keep in step with the deque (`new_marks`). A point-to-point
# call in progress or a ring to write take `_mark`'s locked path.


def step_marker(group: dist.ProcessGroup) -> Callable[[int], None]:
    """`mark_ddp_step(group, step)` for one DDP's forward (See [Note: the step mark's hot
    path])."""
    found: list[GroupLedger | None] = []

    def mark(step: int) -> None:
        global _step
        _step = step
        if not _enabled:
            return
        if not found:
            found.append(_ledger_of(group))
        ledger = found[0]
        if ledger is None or not ledger.comparable:
            return
        if ledger.open_asym is not None or _ring is not None:
            _mark(group, step, -1)
            return
        try:
            pos = ledger._seq() - ledger.shift  # type: ignore[misc]
        except Exception:  # (position(): a backend without sequence numbers)
            return
        ledger.marks.append(Mark(pos, step, -1))

    return mark


def new_marks(marks: Sequence[Mark], last: Mark | None) -> list[Mark]:
    """The marks of a ledger's snapshot after `last` (the last one posted; None: all)."""
    if last is not None:
        for i in range(len(marks) - 1, -1, -1):
            if marks[i] is last:
                return list(marks[i + 1:])
    return list(marks)  # (none posted yet, or `last` rotated out of the deque: all kept)


def mark_bucket(group: dist.ProcessGroup, step: int, bucket: int) -> None:
    """DDP's all-reduce of `bucket` is issued next on `group`."""
    if _enabled:
        _mark(group, step, bucket)


def _mark(group: dist.ProcessGroup, step: int, bucket: int) -> None:
    ledger = _groups.get(id(group))
    if ledger is None or ledger.group is not group:
        ledger = _ledger_of(group)
    if ledger is None or not ledger.comparable:
        return
    pos = ledger.position()
    if pos is not None:
        with _lock:
            ledger.marks.append(Mark(pos, step, bucket))
            ring = _ring
            if ring is not None:
                try:
                    text = _mark_texts.get(ledger.name)
                    if text is None:
                        text = _mark_texts[ledger.name] = ring.text(ledger.name)
                    ring.write(ledger.name, ledger.ranks, pos, step, bucket, text)
                except Exception as exc:
                    _ring_aside(exc)


# --- what must agree ------------------------------------------------------------------------

# How the wrapper keeps an argument (See [Note: the ledger's hot path]): "t" a tensor as its
# (dtype, element count), anything else as its type's name; "ts" a list or tuple as its length
# and its first element kept as "t" (length -1: not a list, the value kept as "t"); "n" a
# length (`len(value or ())`); "d" `getattr(value, "dtype", "")`; "" the value as given.


class _Sig:
    """Which arguments of one function must agree across ranks, and how they read as text."""

    def __init__(self, keep: str, text: Callable[..., str]) -> None:
        self.keep = tuple(tuple(k.split(":")) if ":" in k else (k, "") for k in keep.split())
        self.text = text  # the kept values, in `keep`'s order -> text


def _t(kept: Any) -> str:
    if isinstance(kept, tuple):
        return f"{str(kept[0]).removeprefix('torch.')} x{kept[1]}"
    return str(kept)


def _ts(kept: tuple[int, Any]) -> str:
    n, first = kept
    if n < 0:
        return _t(first)
    return f"{n} of " + (_t(first) if n else "-")


def _reduce_op(op: Any) -> str:
    if op is None:
        return "sum"
    name = getattr(op, "name", None) or str(op)
    return str(name).rsplit(".", 1)[-1].lower()


def _src(value: Any, group_value: Any) -> str:
    """A source or destination rank as given: global (`src`) or in the group (`group_src`)."""
    if value is None:
        if group_value is None:
            return "?"
        return f"group rank {group_value}"
    return f"rank {value}"


_SIGS: dict[str, _Sig] = {
    "all_reduce": _Sig("tensor:t op", lambda t, op: f"{_t(t)} {_reduce_op(op)}"),
    "all_reduce_coalesced": _Sig("tensors:ts op", lambda t, op: f"{_ts(t)} {_reduce_op(op)}"),
    "all_gather": _Sig("tensor:t tensor_list:n", lambda t, n: f"{_t(t)} into {n}"),
    "all_gather_into_tensor": _Sig("input_tensor:t", _t),
    "_all_gather_base": _Sig("input_tensor:t", _t),
    "all_gather_coalesced": _Sig("input_tensor_list:ts", _ts),
    "reduce_scatter": _Sig("output:t op", lambda t, op: f"{_t(t)} {_reduce_op(op)}"),
    "reduce_scatter_tensor": _Sig("input:t op", lambda t, op: f"{_t(t)} {_reduce_op(op)}"),
    "_reduce_scatter_base": _Sig("input:t op", lambda t, op: f"{_t(t)} {_reduce_op(op)}"),
    "broadcast": _Sig("tensor:t src group_src", lambda t, s, g: f"{_t(t)} from {_src(s, g)}"),
    "reduce": _Sig("tensor:t op dst group_dst",
                   lambda t, op, d, g: f"{_t(t)} {_reduce_op(op)} to {_src(d, g)}"),
    "gather": _Sig("tensor:t dst group_dst", lambda t, d, g: f"{_t(t)} to {_src(d, g)}"),
    "scatter": _Sig("tensor:t src group_src", lambda t, s, g: f"{_t(t)} from {_src(s, g)}"),
    "barrier": _Sig("", lambda: ""),
    # sizes may differ across ranks in these: only the dtype must agree
    "all_to_all": _Sig("input_tensor_list:ts", lambda ts: _ts(ts).split(" x")[0]),
    "all_to_all_single": _Sig("input:d", lambda d: str(d).removeprefix("torch.")),
    # objects differ in size across ranks by design
    "all_gather_object": _Sig("", lambda: ""),
    "broadcast_object_list": _Sig("object_list:n src group_src",
                                  lambda n, s, g: f"{n} from {_src(s, g)}"),
    "gather_object": _Sig("dst group_dst", lambda d, g: f"to {_src(d, g)}"),
    "scatter_object_list": _Sig("src group_src", lambda s, g: f"from {_src(s, g)}"),
}
# point-to-point: only the ranks involved take part (see [Note: positions])
_ASYM: dict[str, _Sig] = {
    "send": _Sig("tensor:t dst group_dst", lambda t, d, g: f"{_t(t)} to {_src(d, g)}"),
    "recv": _Sig("tensor:t src group_src", lambda t, s, g: f"{_t(t)} from {_src(s, g)}"),
    "isend": _Sig("tensor:t dst group_dst", lambda t, d, g: f"{_t(t)} to {_src(d, g)}"),
    "irecv": _Sig("tensor:t src group_src", lambda t, s, g: f"{_t(t)} from {_src(s, g)}"),
    "send_object_list": _Sig("dst group_dst", lambda d, g: f"to {_src(d, g)}"),
    "recv_object_list": _Sig("src group_src", lambda s, g: f"from {_src(s, g)}"),
    "batch_isend_irecv": _Sig("p2p_op_list:n", lambda n: f"{n} ops"),
    "monitored_barrier": _Sig("", lambda: ""),
}
# the functional collectives (torch.distributed._functional_collectives, See [Note: functional
# collectives]): their name there -> (the op as ranks compare it, the arguments kept, as in
# `_Sig`); the group is their argument `group`. Each reads as the torch.distributed call that
# pairs with it, so a rank that issues one and a rank that issues the other agree.
_FUNCTIONAL: dict[str, tuple[str, str]] = {
    "all_reduce": ("all_reduce", "self:t reduceOp"),
    "broadcast": ("broadcast", "self:t src"),  # src: the group's rank, made global when kept
    "all_gather_single": ("all_gather_into_tensor", "self:t"),
    "reduce_scatter_single": ("reduce_scatter_tensor", "self:t reduceOp"),
    "all_reduce_coalesced": ("all_reduce_coalesced", "self:ts reduceOp"),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", "self:ts"),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", "inputs:ts reduceOp"),
    "all_to_all_single": ("all_to_all_single", "self:d"),
}
_TEXT = {name: sig.text for table in (_SIGS, _ASYM) for name, sig in table.items()}
_TEXT["all_gather_into_tensor_coalesced"] = _ts
_TEXT["reduce_scatter_tensor_coalesced"] = lambda ts, op: f"{_ts(ts)} {_reduce_op(op)}"


def _text(op: str, raw: tuple[Any, ...]) -> str:
    return _TEXT[op](*raw)


def _getter(index: int, name: str, default: Any, how: str) -> Callable[[tuple[Any, ...],
                                                                         dict[str, Any]], Any]:
    """The argument `name` (positional at `index`) of a call, kept as `how` says."""
    tensor = torch.Tensor

    def value(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        return a[index] if len(a) > index else k.get(name, default)

    def t(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        v = a[index] if len(a) > index else k.get(name, default)
        return (v.dtype, v.numel()) if isinstance(v, tensor) else type(v).__name__

    def ts(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        v = a[index] if len(a) > index else k.get(name, default)
        if not isinstance(v, (list, tuple)):
            return -1, ((v.dtype, v.numel()) if isinstance(v, tensor) else type(v).__name__)
        if not v:
            return 0, None
        first = v[0]
        return len(v), ((first.dtype, first.numel()) if isinstance(first, tensor)
                        else type(first).__name__)

    def n(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        return len((a[index] if len(a) > index else k.get(name, default)) or ())

    def d(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        return getattr(a[index] if len(a) > index else k.get(name, default), "dtype", "")

    return {"": value, "t": t, "ts": ts, "n": n, "d": d}[how]


Capture = Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]


def _capture(getters: list[Callable[[tuple[Any, ...], dict[str, Any]], Any]]) -> Capture:
    """One function that keeps every argument of `getters` (one call per argument)."""
    if not getters:
        return lambda a, k: ()
    if len(getters) == 1:
        (g0,) = getters
        return lambda a, k: (g0(a, k),)
    if len(getters) == 2:
        g0, g1 = getters
        return lambda a, k: (g0(a, k), g1(a, k))
    if len(getters) == 3:
        g0, g1, g2 = getters
        return lambda a, k: (g0(a, k), g1(a, k), g2(a, k))
    return lambda a, k: tuple([g(a, k) for g in getters])


# --- the call site ----------------------------------------------------------------------------

# id(code) -> (code, whether it is the user's): decided once per code object, which the entry
# keeps alive (so its id is not reused while it is here); a code's own hash reads its bytecode
_SITE_DEPTH = 256  # frames walked outward from a collective (torch.compile's can be many)


# (id(code), instruction offset) -> (code, line) of the call sites seen: a frame's `f_lineno`
# decodes its code's line table up to the instruction (O(the code's size): ~10k instructions
# a call from a short module, more from a long training function), its `f_lasti` is read as
# it is; the code is kept so its id stays its own; bounded (past it, decoded each time)
_LINES: dict[tuple[int, int], tuple[CodeType, int]] = {}
MAX_LINES = 65536


def _user_frame(frame: FrameType | None) -> tuple[CodeType | None, int]:
    """The first frame outside torch, ddpviz and the standard library, as (code, line)."""
    f = user_frame(frame, _SITE_DEPTH)
    if f is None:
        return None, 0
    code = f.f_code
    key = (id(code), f.f_lasti)
    hit = _LINES.get(key)
    if hit is not None and hit[0] is code:
        return code, hit[1]
    line = f.f_lineno
    if len(_LINES) < MAX_LINES:
        _LINES[key] = (code, line)
    return code, line


def site_text(code: CodeType | None, line: int) -> str:
    """A call site as text: "file.py:54 in fn" ("?" when there was no user frame)."""
    if code is None:
        return "?"
    name = code.co_filename.rsplit("/", 1)[-1]
    return f"{name}:{line} in {code.co_name}"[:MAX_SITE]


# --- recording --------------------------------------------------------------------------------

def _ledger_of(group: Any, since_now: bool = False) -> GroupLedger | None:
    """The ledger of `group` (made on first use: a group made while the ledger is on is
    recorded from its first collective; `since_now`: from its current position)."""
    ledger = _groups.get(id(group))
    if ledger is not None and ledger.group is group:
        return ledger
    from torch.distributed import distributed_c10d as c10d

    if group is None or group is c10d.GroupMember.NON_GROUP_MEMBER:
        return None
    try:
        if c10d._rank_not_in_group(group):
            return None
        name = str(getattr(group, "group_name", "") or c10d._get_process_group_name(group))
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(group))
    except Exception:
        return None
    ledger = GroupLedger(group, name, ranks)
    if ledger.seq() is None:
        ledger.comparable = False
    elif since_now:
        ledger.since = ledger.position() or 0
    with _lock:
        _groups[id(group)] = ledger
    return ledger


# the DDP bucket whose comm hook is running on this thread (`.bucket`, else -1), set by
# ddpviz's reducer and by watch()'s guard around torch's
_launch = comm.LAUNCH
# (id(code), line) of the call sites seen -> the op and raw arguments of their last call
_sites: set[tuple[int, int]] = set()  # (id(code), line) of the call sites seen
_site_codes: list[CodeType | None] = []  # their code objects, kept (their ids stay theirs)


# See [Note: the ring] (ledger_ring.py): this rank's ring, when the run has a trace folder
_ring: ledger_ring.Ring | None = None
_ring_tried = False
# (id(code), line, op, raw, group) -> (code, the record's text for the ring): made once per
# call site and arguments (the code kept alive, so its id stays its own)
_ring_texts: dict[tuple[Any, ...], tuple[CodeType | None, bytes]] = {}
MAX_RING_TEXTS = 4096
_mark_texts: dict[str, bytes] = {}  # a group's name -> a mark's text


def _open_ring() -> None:
    """Open this rank's ring once, when the run has a folder for it (the trace folder of
    `ddpviz record --out`, else the private one of `ddpviz record --connect` and `launch()`)
    and the default process group is up."""
    global _ring, _ring_tried
    folder = os.environ.get(ENV_TRACE_DIR) or os.environ.get(ENV_RING_DIR)
    if _ring_tried or not folder or not dist.is_initialized():
        return
    _ring_tried = True
    _ring = ledger_ring.open_ring(folder, dist.get_rank(), dist.get_world_size())


def _ring_aside(exc: BaseException) -> None:
    global _ring
    ring, _ring = _ring, None
    if ring is not None:
        ledger_ring.step_aside(f"{exc!r}")


def _record(ledger: GroupLedger, name: str, raw: tuple[Any, ...], asym: bool,
            frame: FrameType) -> tuple[GroupLedger, int, Call] | None:
    global _issued
    try:
        seq = ledger._seq()  # type: ignore[misc]  # (GroupLedger.seq, inline)
    except Exception:  # a backend without sequence numbers: nothing to compare by
        return None
    code, line = _user_frame(frame)
    bucket = _launch.bucket
    call = Call(seq - ledger.shift, -1, name, raw, code, line, _step, asym, bucket,
                _launch.forward)
    with _lock:
        ledger.entries.append(call)
        ledger.count += 1
        _issued += 1
        ring = _ring
        if ring is not None:  # See [Note: the ring] (ledger_ring.py)
            try:
                key: tuple[Any, ...] | None = (id(code), line, name, raw, ledger.name)
                try:
                    known = _ring_texts.get(key)  # type: ignore[arg-type]
                except Exception:  # an argument kept as given that does not hash: no cache
                    known, key = None, None
                if known is None or known[0] is not code:
                    known = (code, ring.text(ledger.name, name, _text(name, raw),
                                             site_text(code, line)))
                    if key is not None and len(_ring_texts) < MAX_RING_TEXTS:
                        _ring_texts[key] = known
                call.ring = ring.write(ledger.name, ledger.ranks, call.pos, _step, bucket,
                                       known[1], call.forward, asym)
            except Exception as exc:
                _ring_aside(exc)
    if asym:
        ledger.open_asym = call
    elif on_new_site is not None:
        site = (id(code), line)
        if site not in _sites:
            # See [Note: a new call site is posted first] (collective_check.py)
            _sites.add(site)
            _site_codes.append(code)
            on_new_site(ledger)
    return ledger, seq, call


def _end(ledger: GroupLedger, seq: int, call: Call) -> None:
    after = ledger.seq()
    call.span = max(0, (after if after is not None else seq) - seq)
    ring = _ring
    if call.ring >= 0 and ring is not None:
        ring.span(call.ring, call.span)
    if call.asym:
        ledger.shift += call.span
        if ledger.open_asym is call:
            ledger.open_asym = None


_world = dist.group  # its WORLD: the default group (None before there is one)
_FAR = 1 << 30  # the position of an argument the function does not take


def _issue(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           started: Any, name: str) -> Any:
    """Issue the job's collective `fn`, then close its ledger entry (`started`, if one was
    opened). Collectives it issues inside are not entries of their own."""
    local = _local
    local.depth += 1
    try:
        return fn(*args, **kwargs)
    finally:
        local.depth -= 1
        if started is not None:
            try:
                _end(*started)
            except Exception as exc:
                _step_aside(f"{name}: {exc!r}")


def _wrap(name: str, fn: Callable[..., Any], sig: _Sig, asym: bool) -> Callable[..., Any]:
    params = inspect.signature(fn).parameters
    order = list(params)
    defaults = {p: (None if v.default is inspect.Parameter.empty else v.default)
                for p, v in params.items()}

    def getter(arg: str, how: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
        return _getter(order.index(arg) if arg in order else _FAR, arg, defaults.get(arg), how)

    capture = _capture([getter(arg, how) for arg, how in sig.keep])
    group_of = getter("group", "")
    if name == "batch_isend_irecv":
        ops = getter("p2p_op_list", "")

        def group_of(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            first = (ops(a, k) or (None,))[0]
            return getattr(first, "group", None)
    local, frame_of = _local, sys._getframe

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _enabled or local.depth:
            return fn(*args, **kwargs)
        started = None
        try:  # (the group's ledger found inline: one Python call less a collective)
            group = group_of(args, kwargs)
            if group is None:
                group = _world.WORLD
            ledger = _groups.get(id(group))
            if ledger is None or ledger.group is not group:
                ledger = _ledger_of(group)
            if ledger is not None and ledger.comparable:
                started = _record(ledger, name, capture(args, kwargs), asym, frame_of(1))
        except Exception as exc:  # never break the job's collective: step aside
            _step_aside(f"{name}: {exc!r}")
        return _issue(fn, args, kwargs, started, name)

    wrapper.__ddpviz_original__ = fn  # type: ignore[attr-defined]
    return wrapper


# [Note: functional collectives]
# torch.distributed._functional_collectives (funcol) issues its collectives through torch ops
# (torch.ops._c10d_functional.*), not through torch.distributed's functions: they take
# positions, and the ledger records them at funcol's own functions, wrapped like the others
# (`_FUNCTIONAL`; the aliases, `_autograd` forms and torch's internal callers reach these
# through the module, so they are recorded too, once: a nested call is not an entry). In eager
# mode the op runs its collective when called (gloo) or enqueues it (NCCL) and returns an
# AsyncCollectiveTensor whose wait comes at its first use: the wrapper reads only the input's
# dtype and size and the sequence number before and after the call, never the result, so it
# neither waits nor changes what the job computes. Inside torch.compile the wrapper is the
# original function (`torch.compiler.is_compiling()` first): dynamo traces funcol as without
# ddpviz, and what the compiled graph issues is not recorded (See docs/collectives.md).


def _functional_ledger(group: Any, tag: Any) -> GroupLedger | None:
    """The ledger of a functional collective's `group` (a ProcessGroup, a group name, a
    DeviceMesh, (DeviceMesh, dim) or a list of ranks); None when it cannot be resolved (funcol
    then says what was wrong with it, not the ledger)."""
    if not isinstance(group, dist.ProcessGroup):
        try:
            from torch.distributed import _functional_collectives as funcol
            from torch.distributed import distributed_c10d as c10d

            resolved: Any
            if isinstance(group, list):  # (funcol's own resolution warns: not a second time)
                resolved = c10d._resolve_group_name_by_ranks_and_tag(group, tag or "")
            else:
                resolved = funcol._resolve_group(group, tag or "")
            group = (resolved if isinstance(resolved, dist.ProcessGroup)
                     else c10d._resolve_process_group(resolved))
        except Exception:
            return None
    ledger = _groups.get(id(group))
    if ledger is None or ledger.group is not group:
        ledger = _ledger_of(group)
    if ledger is None or not ledger.comparable:
        return None
    return ledger


def _wrap_functional(fn: Callable[..., Any], op: str, keep: str) -> Callable[..., Any]:
    """`fn`, a functional collective, recording what it issues as `op` (See [Note: functional
    collectives])."""
    params = inspect.signature(fn).parameters
    order = list(params)
    defaults = {p: (None if v.default is inspect.Parameter.empty else v.default)
                for p, v in params.items()}

    def getter(arg: str, how: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
        return _getter(order.index(arg) if arg in order else _FAR, arg, defaults.get(arg), how)

    capture = _capture([getter(*k.split(":")) if ":" in k else getter(k, "")
                        for k in keep.split()])
    group_of, tag_of = getter("group", ""), getter("tag", "")
    broadcast = op == "broadcast"
    local, frame_of, compiling = _local, sys._getframe, torch.compiler.is_compiling

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling() or not _enabled or local.depth:
            return fn(*args, **kwargs)
        started = None
        try:
            group = group_of(args, kwargs)
            ledger = _groups.get(id(group))  # a ProcessGroup seen before: no resolving
            if ledger is None or ledger.group is not group or not ledger.comparable:
                ledger = _functional_ledger(group, tag_of(args, kwargs))
            if ledger is not None:
                raw = capture(args, kwargs)
                if broadcast:  # funcol's src is the group's rank: kept as dist.broadcast's
                    src = raw[1]
                    ranks = ledger.ranks
                    raw = (raw[0], ranks[src] if isinstance(src, int) and 0 <= src < len(ranks)
                           else src, None)
                started = _record(ledger, op, raw, False, frame_of(1))
        except Exception as exc:  # never break the job's collective: step aside
            _step_aside(f"{op}: {exc!r}")
        return _issue(fn, args, kwargs, started, op)

    wrapper.__ddpviz_original__ = fn  # type: ignore[attr-defined]
    return wrapper


def _wrap_functionals(module: Any) -> None:
    """Wrap `_FUNCTIONAL`'s functions in torch.distributed._functional_collectives (once)."""
    for name, (op, keep) in _FUNCTIONAL.items():
        original = getattr(module, name, None)
        if original is None or hasattr(original, "__ddpviz_original__"):
            continue
        try:
            setattr(module, name, _wrap_functional(original, op, keep))
        except (TypeError, ValueError):  # a signature it cannot read: left as it is
            continue


def _step_aside(why: str) -> None:
    global _enabled
    _enabled = 0
    if not _failed:
        _failed.append(why)
        print(f"ddpviz: stopped recording the job's own collectives after an error in its "
              f"ledger ({why}); the job runs on unaffected, but collective mismatches are no "
              "longer named.", file=sys.stderr)


def install() -> bool:
    """Turn the ledger on in this process (idempotent; one `release()` per call). The functions
    of torch.distributed are wrapped once, for the life of the process; while no watch uses
    the ledger a wrapper only calls the function it wraps."""
    global _installed, _enabled
    from torch.distributed import distributed_c10d as c10d

    with _lock:
        if _failed:
            return False
        resume = _enabled == 0
        _enabled += 1
    if resume and not _resume(c10d):
        release()
        return False
    with _lock:
        if _installed:
            return True
        _installed = True

    wrapped: dict[Any, Any] = {}
    for table, asym in ((_SIGS, False), (_ASYM, True)):
        for name, sig in table.items():
            original = getattr(c10d, name, None)
            if original is None or hasattr(original, "__ddpviz_original__"):
                continue
            wrapper = _wrap(name, original, sig, asym)
            wrapped[original] = wrapper
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapper)
    _keep_traceable(wrapped)
    return True


def _resume(c10d: Any) -> bool:
    """Recording (re)starts: every existing group is compared from its current position on,
    since what came before was not recorded (on this rank, or on a rank that started later:
    every rank posts where it started, and the comparison starts after the latest)."""
    try:
        existing = list(c10d._world.pg_map)
    except Exception as exc:
        _step_aside(f"cannot list the process groups: {exc!r}")
        return False
    try:
        _open_ring()
    except Exception as exc:
        ledger_ring.step_aside(f"cannot make it: {exc!r}")
    for group in existing:
        ledger = _ledger_of(group, since_now=True)
        if ledger is not None and ledger.comparable:
            position = ledger.position()
            with _lock:
                ledger.since = max(ledger.since, position or 0)
    return True


def release() -> None:
    global _enabled
    with _lock:
        _enabled = max(0, _enabled - 1)


def _keep_traceable(wrapped: dict[Any, Any]) -> None:
    """torch.compile traces torch.distributed's collectives inside compiled code by looking
    them up in a table of functional rewrites; the wrappers join that table under the
    original's rewrite, so compiled code that calls them compiles as without ddpviz. The
    functional collectives are wrapped there too (one hook per module: `after_import` keeps
    the first)."""
    from ddpviz_autowatch import after_import  # stdlib only, installed with ddpviz

    def add(module: Any) -> None:
        remaps = getattr(module, "traceable_collective_remaps", None)
        if isinstance(remaps, dict):
            for original, wrapper in wrapped.items():
                if original in remaps:
                    remaps[wrapper] = remaps[original]
        _wrap_functionals(module)

    after_import("torch.distributed._functional_collectives", add)


def now_ns() -> int:
    return time.monotonic_ns()
