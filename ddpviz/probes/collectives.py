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
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from ddpviz.engine import comm
from ddpviz.probes.stack_text import owner

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


class Entry(msgspec.Struct, array_like=True):
    """One collective as this rank issued it (what ranks compare). `span` is set once, when
    the call returns (by the thread that issued it)."""

    pos: int  # the group's sequence number before the call, less point-to-point shifts
    span: int  # how many sequence numbers it took (-1: still inside the call)
    op: str  # torch.distributed's function name ("all_reduce", "ddp:bucket 2")
    sig: str  # what must agree across ranks ("float32 x12 sum"); "" when nothing must
    site: str  # the user's call site: "train.py:54 in save_checkpoint"
    step: int  # the DDP step this rank was in (-1: before any)
    asym: bool = False  # point-to-point: not compared by position
    bucket: int = -1  # a DDP bucket's all-reduce (its comm hook ran it): the bucket


class Mark(msgspec.Struct, array_like=True, frozen=True):
    """Where a DDP's step began in a group's sequence: positions from here to the next mark
    that no Entry covers are DDP's (its forward's broadcasts, its backward's all-reduces)."""

    pos: int
    step: int
    bucket: int = -1  # the all-reduce of this bucket starts here (watch()'s guard knows)


class GroupLedger:
    """One process group's history on this rank."""

    def __init__(self, group: dist.ProcessGroup, name: str, ranks: tuple[int, ...]) -> None:
        self.group = group
        self.name = name
        self.ranks = ranks  # global ranks, in group-rank order
        self.entries: deque[Entry] = deque(maxlen=MAX_ENTRIES)
        self.marks: deque[Mark] = deque(maxlen=MAX_ENTRIES)
        self.count = 0  # entries ever appended
        self.marks_count = 0  # marks ever appended
        self.since = 0  # positions below this were not recorded (before the ledger was on)
        self.shift = 0  # sequence numbers taken by point-to-point calls
        self.open_asym: Entry | None = None  # a point-to-point call in progress
        self.comparable = True

    def seq(self) -> int | None:
        try:
            return int(self.group._get_sequence_number_for_group())  # type: ignore[attr-defined]
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
_sites: set[str] = set()  # call sites seen (a new one is posted before its collective runs)
# collective_check sets this: post `ledger` now, counting the entry being issued
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
    set_step(step)
    if _enabled:
        _mark(group, step, -1)


def mark_bucket(group: dist.ProcessGroup, step: int, bucket: int) -> None:
    """DDP's all-reduce of `bucket` is issued next on `group`."""
    if _enabled:
        _mark(group, step, bucket)


def _mark(group: dist.ProcessGroup, step: int, bucket: int) -> None:
    ledger = _ledger_of(group)
    if ledger is None or not ledger.comparable:
        return
    pos = ledger.position()
    if pos is not None:
        with _lock:
            ledger.marks.append(Mark(pos, step, bucket))
            ledger.marks_count += 1


# --- what must agree ------------------------------------------------------------------------

def _tensor(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')} x{t.numel()}"
    return type(t).__name__


def _tensors(ts: Any) -> str:
    if isinstance(ts, (list, tuple)):
        return f"{len(ts)} of " + (_tensor(ts[0]) if ts else "-")
    return _tensor(ts)


def _reduce_op(op: Any) -> str:
    if op is None:
        return "sum"
    name = getattr(op, "name", None) or str(op)
    return str(name).rsplit(".", 1)[-1].lower()


# per function: which arguments must agree across ranks, as text (`a`: the bound arguments)
_SIGS: dict[str, Callable[[dict[str, Any]], str]] = {
    "all_reduce": lambda a: f"{_tensor(a['tensor'])} {_reduce_op(a['op'])}",
    "all_reduce_coalesced": lambda a: f"{_tensors(a['tensors'])} {_reduce_op(a['op'])}",
    "all_gather": lambda a: f"{_tensor(a['tensor'])} into {len(a['tensor_list'] or ())}",
    "all_gather_into_tensor": lambda a: _tensor(a["input_tensor"]),
    "_all_gather_base": lambda a: _tensor(a["input_tensor"]),
    "all_gather_coalesced": lambda a: _tensors(a["input_tensor_list"]),
    "reduce_scatter": lambda a: f"{_tensor(a['output'])} {_reduce_op(a['op'])}",
    "reduce_scatter_tensor": lambda a: f"{_tensor(a['input'])} {_reduce_op(a['op'])}",
    "_reduce_scatter_base": lambda a: f"{_tensor(a['input'])} {_reduce_op(a['op'])}",
    "broadcast": lambda a: f"{_tensor(a['tensor'])} from {_src(a, 'src')}",
    "reduce": lambda a: f"{_tensor(a['tensor'])} {_reduce_op(a['op'])} to {_src(a, 'dst')}",
    "gather": lambda a: f"{_tensor(a['tensor'])} to {_src(a, 'dst')}",
    "scatter": lambda a: f"{_tensor(a['tensor'])} from {_src(a, 'src')}",
    "barrier": lambda a: "",
    # sizes may differ across ranks in these: only the dtype must agree
    "all_to_all": lambda a: _tensors(a["input_tensor_list"]).split(" x")[0],
    "all_to_all_single": lambda a: str(getattr(a["input"], "dtype", "")).removeprefix(
        "torch."),
    # objects differ in size across ranks by design
    "all_gather_object": lambda a: "",
    "broadcast_object_list": lambda a: f"{len(a['object_list'] or ())} from {_src(a, 'src')}",
    "gather_object": lambda a: f"to {_src(a, 'dst')}",
    "scatter_object_list": lambda a: f"from {_src(a, 'src')}",
}
# point-to-point: only the ranks involved take part (see [Note: positions])
_ASYM: dict[str, Callable[[dict[str, Any]], str]] = {
    "send": lambda a: f"{_tensor(a['tensor'])} to {_src(a, 'dst')}",
    "recv": lambda a: f"{_tensor(a['tensor'])} from {_src(a, 'src')}",
    "isend": lambda a: f"{_tensor(a['tensor'])} to {_src(a, 'dst')}",
    "irecv": lambda a: f"{_tensor(a['tensor'])} from {_src(a, 'src')}",
    "send_object_list": lambda a: f"to {_src(a, 'dst')}",
    "recv_object_list": lambda a: f"from {_src(a, 'src')}",
    "batch_isend_irecv": lambda a: f"{len(a['p2p_op_list'] or ())} ops",
    "monitored_barrier": lambda a: "",
}


def _src(a: dict[str, Any], name: str) -> str:
    value = a.get(name)
    if value is None:
        value = a.get(f"group_{name}")
        if value is None:
            return "?"
        return f"group rank {value}"
    return f"rank {value}"


# --- the call site ----------------------------------------------------------------------------

_site_cache: dict[tuple[Any, int], str] = {}


def call_site(frame: Any) -> str:
    """The first frame outside torch, ddpviz and the standard library: "file.py:54 in fn"."""
    f = frame
    while f is not None:
        code = f.f_code
        if owner(code.co_filename) is None:
            key = (code, f.f_lineno)
            site = _site_cache.get(key)
            if site is None:
                name = code.co_filename.rsplit("/", 1)[-1]
                site = f"{name}:{f.f_lineno} in {code.co_name}"[:MAX_SITE]
                if len(_site_cache) < 65536:
                    _site_cache[key] = site
            return site
        f = f.f_back
    return "?"


# --- recording --------------------------------------------------------------------------------

def _group_of(a: dict[str, Any], name: str) -> dist.ProcessGroup | None:
    if name == "batch_isend_irecv":
        ops = a.get("p2p_op_list") or ()
        group = getattr(ops[0], "group", None) if ops else None
    else:
        group = a.get("group")
    return group if group is not None else dist.group.WORLD


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


def _bucket() -> int:
    """The DDP bucket whose comm hook is running on this thread (engine/comm.py's LAUNCH, set
    by ddpviz's reducer and by watch()'s guard around torch's), else -1."""
    return comm.LAUNCH.bucket


def _begin(name: str, sigs: Callable[[dict[str, Any]], str], a: dict[str, Any],
           asym: bool, frame: Any) -> tuple[GroupLedger, int, Entry] | None:
    global _issued
    ledger = _ledger_of(_group_of(a, name))
    if ledger is None or not ledger.comparable:
        return None
    seq = ledger.seq()
    if seq is None:
        return None
    entry = Entry(seq - ledger.shift, -1, name, sigs(a), call_site(frame), _step, asym,
                  comm.LAUNCH.bucket)
    with _lock:
        ledger.entries.append(entry)
        ledger.count += 1
        _issued += 1
    if asym:
        ledger.open_asym = entry
    elif entry.site not in _sites and on_new_site is not None:
        # See [Note: a new call site is posted first] (collective_check.py)
        _sites.add(entry.site)
        on_new_site(ledger)
    return ledger, seq, entry


def _end(ledger: GroupLedger, seq: int, entry: Entry) -> None:
    after = ledger.seq()
    entry.span = max(0, (after if after is not None else seq) - seq)
    if entry.asym:
        ledger.shift += entry.span
        if ledger.open_asym is entry:
            ledger.open_asym = None


def _wrap(name: str, fn: Callable[..., Any], sigs: Callable[[dict[str, Any]], str],
          asym: bool) -> Callable[..., Any]:
    import inspect

    params = list(inspect.signature(fn).parameters.values())
    defaults = {p.name: (None if p.default is inspect.Parameter.empty else p.default)
                for p in params}
    order = [p.name for p in params]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _enabled or _local.depth:
            return fn(*args, **kwargs)
        started = None
        try:
            bound = defaults.copy()
            bound.update(zip(order, args, strict=False))
            if kwargs:
                bound.update(kwargs)
            started = _begin(name, sigs, bound, asym, sys._getframe(1))
        except Exception as exc:  # never break the job's collective: step aside
            _step_aside(f"{name}: {exc!r}")
        _local.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _local.depth -= 1
            if started is not None:
                try:
                    _end(*started)
                except Exception as exc:
                    _step_aside(f"{name}: {exc!r}")

    wrapper.__ddpviz_original__ = fn  # type: ignore[attr-defined]
    return wrapper


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
        for name, sigs in table.items():
            original = getattr(c10d, name, None)
            if original is None or hasattr(original, "__ddpviz_original__"):
                continue
            wrapper = _wrap(name, original, sigs, asym)
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
    original's rewrite, so compiled code that calls them compiles as without ddpviz."""
    from ddpviz_autowatch import after_import  # stdlib only, installed with ddpviz

    def add(module: Any) -> None:
        remaps = getattr(module, "traceable_collective_remaps", None)
        if isinstance(remaps, dict):
            for original, wrapper in wrapped.items():
                if original in remaps:
                    remaps[wrapper] = remaps[original]

    after_import("torch.distributed._functional_collectives", add)


def now_ns() -> int:
    return time.monotonic_ns()
