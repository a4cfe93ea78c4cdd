"""The gradient-sync contract of one DDP on its rank: an optimizer step that updates the DDP's
parameters must use gradients that DDP all-reduced. When it does not (the loss computed on
`ddp.module`, `no_sync()` around the last micro-batch, a DDP built and never called) the step
is named as an `unsynced_gradients` finding, at the first step that does it, with the call
sites of the step, the backward and the forward. Shared by watch() (_watch/), `ddpviz record`
(record/autowatch.py: from the DDP's construction on) and ddpviz's DistributedDataParallel
(for_twin.py). See [Note: the gradient-sync contract].
"""

from __future__ import annotations

import itertools
import linecache
import sys
import threading
import warnings
import weakref
from collections.abc import Sequence
from types import FrameType
from typing import Any, Literal, NamedTuple

import torch
from torch.distributed import distributed_c10d as c10d
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from ddpviz import events as ev
from ddpviz.events import Tap
from ddpviz.findings import Finding, fix_for, format_ranks, warning_of
from ddpviz.probes import collectives as _ledger
from ddpviz.probes import step_aside
from ddpviz.probes.stack_text import Frame, clip, owner, user_frame, where

# [Note: the gradient-sync contract]
# torch's DDP averages gradients only in a backward whose forward ran through the DDP with
# grad enabled and `require_backward_grad_sync` True (outside `no_sync()`): that forward
# prepares the reducer (`_post_forward`), and that backward all-reduces each parameter's
# whole `.grad`, so what earlier backwards accumulated locally (the no_sync micro-batches) is
# averaged with it. What an optimizer step must never use is a gradient accumulated after the
# last such backward. Each rank follows three facts per DDP, each cheap:
# - the kind of its last grad-enabled forward since the last optimizer step: none, synced or
#   local (no_sync). watch()'s forward wrapper and the twin's `_pre_forward` tell it, reading
#   `require_backward_grad_sync` before the module runs (Lightning's manual optimization sets
#   it False inside the forward and drives the reducer from `manual_backward` itself);
# - gradients accumulated into its parameters: post-accumulate-grad hooks, which fire only
#   when a backward adds into `.grad` (not for `torch.autograd.grad`). The guarded watch has
#   one on every parameter and feeds the contract from them (once per backward); elsewhere
#   the contract puts its own on CANARIES "canary" parameters, the first and the last
#   trainable one (a backward reaches the last first and the first last), whatever the
#   recording: the hook-less watch's own hooks run on sampled steps only. Each canary costs
#   every backward: autograd calls it from C++, taking the GIL back inside the backward (where
#   another thread may hold it), so there are two, not more (4, spread over the list, caught
#   nothing more in the tests; benchmarks/bench_sync_contract.py). A canary
#   that accumulates while the last forward is not a synced one is *dirt*, whose cause is
#   that local forward ("no_sync") or no forward at all since the last step
#   ("module_forward"; "unused_ddp" when the DDP's forward never ran). A synced forward
#   clears the dirt: its backward reduces everything accumulated before it;
# - every optimizer step (torch's global step hooks, one for every contract of the process: See
#   [Note: the optimizer-step hooks]): an optimizer that holds the DDP's parameters steps while dirt
#   remains and some of those parameters have gradients -> `unsynced_gradients`, once per DDP and
#   cause, on this rank. Judged before the step; a step given a closure (LBFGS, Lightning's
#   automatic optimization, whose closure runs the forward and backward) after it, once the closure
#   ran. Exempt: any collective issued since the dirt's last backward (a manual all-reduce of the
#   gradients, composer's FORCED_SYNC; any other collective exempts too, conservatively), counted by
#   the job's collective ledger and by the process groups' own sequence numbers (which count what
#   bypasses Python too: functional collectives, C++ extensions); a step run inside a backward
#   (optimizers applied in backward); an optimizer whose parameters DDP steps itself
#   (`_apply_optimizer_in_backward`).
# It never reports what it did not see (a miss, never a false alarm): a backward after the
# synced one of the same step counts as part of it; a backward that accumulates only into
# parameters without a canary (neither the first nor the last trainable one, hook-less) is
# not seen; a job whose collectives cannot be counted is not judged.

CANARIES = 2  # parameters with a contract hook of their own: the first and the last trainable
_graph_task = torch._C._current_graph_task_id  # the running backward's id (-1 outside one)

State = Literal[0, 1, 2]
NONE: State = 0  # no grad-enabled forward since the last optimizer step
SYNCED: State = 1  # the last one all-reduces its backward
LOCAL: State = 2  # the last one ran under no_sync()

Cause = Literal["module_forward", "no_sync", "unused_ddp"]

_ids = itertools.count()  # DDPs in this process, in the order their contracts were made


class Dirt(NamedTuple):
    """Gradients accumulated after the last reduction: why, where, and the collectives count
    right after (a later count exempts the step)."""

    cause: Cause
    backward: Frame | None
    forward: Frame | None  # the local forward (no_sync), when there was one
    collectives: int | None  # None: they cannot be counted on this rank
    task: int  # the backward (autograd graph task) that last added to it


class _Holder:
    """What the contract knows of one optimizer: whether it holds the DDP's parameters (their
    ids), its step count, and how many param groups it had when that was decided."""

    __slots__ = ("groups", "held", "steps")

    def __init__(self, held: frozenset[int], groups: int) -> None:
        self.held, self.groups, self.steps = held, groups, 0


def adopt(owner: Any, tap: Tap, *, source: bool, canaries: bool) -> SyncContract | None:
    """The open contract made for `owner` before (by `ddpviz record`, at its construction), now
    reporting through `tap`; None when there is none. `canaries` False: its new owner feeds it
    from hooks on every parameter, so its own go."""
    with _lock:
        contract = _by_owner.get(owner)
    if contract is None or contract._closed:
        return None
    contract.tap, contract.source, contract.adopted = tap, source, True
    if not canaries:
        contract.drop_canaries()
    return contract


def contract_of(owner: Any) -> SyncContract | None:
    """The open contract of `owner`, if any."""
    with _lock:
        contract = _by_owner.get(owner)
    return None if contract is None or contract._closed else contract


class SyncContract:
    """The gradient-sync contract of one DDP on this rank (See [Note: the gradient-sync
    contract]). `forward(synced)` at each grad-enabled forward of the DDP; `accumulated()`
    when a backward adds into its gradients (the contract's canary hooks call it, or the
    owner's per-parameter hooks); optimizer steps are seen through torch's global hook."""

    def __init__(self, owner: Any, params: Sequence[torch.Tensor], names: Sequence[str],
                 tap: Tap, *, world_size: int, canaries: bool = True, source: bool = True,
                 built_at: Frame | None = None) -> None:
        """`owner`: the DDP (kept weakly; its `_lazy_init_ran` tells whether its forward ever
        ran, and the contract closes when it is collected); `canaries`: put hooks on a few
        parameters (False: the owner calls `accumulated()` from hooks of its own); `source`:
        show source lines in the finding (`Recording.stack_source`); `built_at`: where the
        DDP was constructed, when known."""
        self.tap = tap
        self.params = list(params)
        self.names = list(names)
        self.world_size = world_size
        self.source = source
        self.index = next(_ids)
        self.built_at = built_at
        self.last: State = NONE if not getattr(owner, "_lazy_init_ran", False) else SYNCED
        self.dirt: Dirt | None = None
        self.local_at: Frame | None = None  # the last local forward's call site
        self.reported: list[Finding] = []  # what this contract reported (tests, debugging)
        self.error: BaseException | None = None  # what made it step aside, if anything
        self.adopted = False  # a Watch took it over (adopt)
        self._said: set[Cause] = set()
        self._owner = weakref.ref(owner)
        self._ids = frozenset(id(p) for p in self.params)
        self._holders: dict[int, _Holder] = {}  # id(optimizer) -> (dropped when it goes)
        self._hooks: list[Any] = []
        self._closed = False
        if canaries:
            self.add_canaries()
        _open(self, owner)
        weakref.finalize(owner, self.close)

    # --- what the DDP's side calls -------------------------------------------------------

    def forward(self, synced: bool) -> None:
        """A grad-enabled forward of the DDP begins; `synced`: its `require_backward_grad_sync`
        before the module ran (False under no_sync())."""
        if synced:
            self.last = SYNCED
            self.dirt = None  # its backward reduces everything accumulated so far
        elif self.last != LOCAL:  # (the first of a run of them: they share a line)
            self.last = LOCAL
            self.local_at = first_user_frame(sys._getframe(1))

    def accumulated(self, _param: Any = None) -> None:
        """A backward added into the gradient of one of the DDP's parameters (the hook body:
        nothing to do after a synced forward)."""
        if self.last != SYNCED and not self._closed:
            dirt = self.dirt
            if dirt is not None and dirt.task == _graph_task():
                return  # this backward is known already
            try:
                self._dirty()
            except Exception as exc:  # (never into the job)
                self._stop(exc)

    def add_canaries(self) -> None:
        """Post-accumulate-grad hooks on up to CANARIES trainable parameters spread over the
        list (the first and the last among them; See the Note)."""
        if self._hooks:
            return
        trainable = [p for p in self.params if p.requires_grad]
        count = min(len(trainable), CANARIES)
        if count == 0:
            return
        step = (len(trainable) - 1) / max(count - 1, 1)
        chosen = {round(i * step) for i in range(count)}
        self._hooks = [trainable[i].register_post_accumulate_grad_hook(self.accumulated)
                       for i in sorted(chosen)]

    def drop_canaries(self) -> None:
        """Remove the canary hooks (an owner with hooks on every parameter feeds the contract
        from them instead)."""
        hooks, self._hooks = self._hooks, []
        for h in hooks:
            h.remove()

    def close(self) -> None:
        """Remove the hooks; the contract judges no more steps."""
        self._closed = True
        self.drop_canaries()
        _close(self)

    # --- the backward --------------------------------------------------------------------

    def _dirty(self) -> None:
        task = _graph_task()
        dirt = self.dirt
        if self.last == LOCAL:
            cause: Cause = "no_sync"
        else:
            owner = self._owner()
            cause = "module_forward" if getattr(owner, "_lazy_init_ran", True) else "unused_ddp"
        backward = _backward_site() if dirt is None or dirt.cause != cause else dirt.backward
        self.dirt = Dirt(cause, backward, self.local_at if cause == "no_sync" else None,
                         collectives_issued(), task)

    # --- the optimizer step --------------------------------------------------------------

    def stepped(self, optimizer: Any) -> None:
        """`optimizer.step()` is about to run (torch's global pre-hook, on every step), or ran
        its closure (the post-hook of a step given one)."""
        holder = self._holders.get(id(optimizer))
        if holder is None or holder.groups != len(optimizer.param_groups):
            holder = self._hold(optimizer)
        if not holder.held:
            return
        if self.dirt is not None and not self._closed:
            try:
                self._judge(optimizer, holder)
            except Exception as exc:  # (never into the job)
                self._stop(exc)
        holder.steps += 1
        self.last = NONE
        self.dirt = None

    def _hold(self, optimizer: Any) -> _Holder:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        held = frozenset(id(p) for p in params if id(p) in self._ids)
        if any(hasattr(p, "_in_backward_optimizers") for p in params):
            held = frozenset()  # applied in backward by DDP itself: not the training step's
        holder = _Holder(held, len(optimizer.param_groups))
        old = self._holders.get(id(optimizer))
        if old is not None:
            holder.steps = old.steps
        else:  # (a dict by id, not a WeakKeyDictionary: its lookups cost a weakref each)
            weakref.finalize(optimizer, self._holders.pop, id(optimizer), None)
        self._holders[id(optimizer)] = holder
        return holder

    def _judge(self, optimizer: Any, holder: _Holder) -> None:
        dirt = self.dirt
        assert dirt is not None
        if dirt.cause in self._said:
            return
        now = collectives_issued()
        if dirt.collectives is None or now is None or now != dirt.collectives:
            return  # a collective since that backward (a manual all-reduce?), or no count
        with_grads = [i for i, p in enumerate(self.params)
                      if id(p) in holder.held and p.grad is not None]
        if not with_grads:
            return
        self._said.add(dirt.cause)
        finding = self._finding(dirt, holder.steps, with_grads, type(optimizer).__name__,
                                first_user_frame(sys._getframe()))
        self.reported.append(finding)
        if self.tap.enabled:
            self.tap.emit(ev.FindingReported, finding)
        warnings.warn(warning_of(finding), stacklevel=_user_level())

    # --- the finding ---------------------------------------------------------------------

    def _finding(self, dirt: Dirt, step: int, with_grads: list[int], optimizer: str,
                 step_at: Frame | None) -> Finding:
        rank = self.tap.rank
        label = self._label()
        why = {"module_forward": "its forward did not run since the last step (loss computed "
                                 "on ddp.module?)",
               "no_sync": "the last backward ran under no_sync()",
               "unused_ddp": "the DDP's forward never ran: its module was trained directly"}
        sites = [f"backward at {self._site(dirt.backward)}"]
        if dirt.forward is not None:
            sites.append(f"after the forward under no_sync() at {self._site(dirt.forward)}")
        sites.append(f"{optimizer}.step() at {self._site(step_at)}")
        shown = ", ".join(repr(self.names[i]) for i in with_grads[:4])
        more = f", ... ({len(with_grads)} in all)" if len(with_grads) > 4 else ""
        explain = {
            "module_forward": "DDP all-reduces gradients only in a backward whose forward ran "
                              "through the DDP itself (ddp(x)); these flowed into its "
                              "parameters around it (ddp.module(x), or the model it wraps)",
            "no_sync": "a forward under no_sync() (require_backward_grad_sync=False) makes its "
                       "backward accumulate locally; only a later backward through a forward "
                       "outside no_sync() averages what accumulated, and none came before "
                       "this step",
            "unused_ddp": "DistributedDataParallel averages gradients only when it is called "
                          "(ddp(x)); the training step calls the module it wraps instead, so "
                          "nothing is ever all-reduced",
        }
        alone = self.world_size == 1
        consequence = ("harmless in a world of one rank; with more, each rank would apply its "
                       "own gradients" if alone else "each rank applied its own gradients: the "
                       "replicas now train different models")
        return Finding(
            kind="unsynced_gradients", severity="warning" if alone else "error",
            title=f"{format_ranks((rank,))}: optimizer step {step} used gradients of DDP "
                  f"{label} that were never all-reduced: {why[dirt.cause]}",
            ranks=(rank,), param=with_grads[0], name=self.names[with_grads[0]],
            field=dirt.cause, step=step, values=(("; ".join(sites), (rank,)),),
            detail=(f"{len(with_grads)} of the {len(self.params)} parameters of DDP {label} "
                    f"had local gradients at the step: {shown}{more}",
                    explain[dirt.cause], consequence),
            fix=fix_for("unsynced_gradients", dirt.cause), world_size=self.world_size)

    def _label(self) -> str:
        owner = self._owner()
        module = getattr(owner, "module", None)
        what = type(module).__name__ if module is not None else "?"
        built = f", built at {where(self.built_at)}" if self.built_at is not None else ""
        return f"#{self.index} ({what}{built})"

    def _site(self, frame: Frame | None) -> str:
        if frame is None:
            return "an unknown place"
        text = linecache.getline(frame.file, frame.line).strip() if self.source else ""
        return clip(f"{where(frame)} ({text})" if text else where(frame), 160)

    def _stop(self, exc: BaseException) -> None:
        """Step aside for good, saying so once; the job goes on."""
        if self.error is not None:
            return
        self.error = exc
        self._closed = True
        step_aside.say(self.tap.rank, "the gradient-sync check", exc,
                        "optimizer steps are no longer checked for all-reduced gradients")


# --- the one global optimizer-step hook ---------------------------------------------------

# [Note: the optimizer-step hooks]
# Every optimizer step of the process calls torch's global pre-hook: one Python call a step,
# which meets the training thread cold (each line ~1-2 us there). So the pre-hook does the
# common case itself (no closure, an optimizer known as it was, no dirt: count the step, the
# last forward consumed; anything else goes through `stepped`), walks a tuple of the open
# contracts kept at open/close, and the post-hook, which only a step given a closure needs,
# is registered the first time the pre-hook sees one (it stays, like the pre-hook, while
# contracts are open).
# Neither is removed while torch walks its hook tables (`_stepping`: it would raise there);
# left in place, they return at once until a contract needs them again.

_lock = threading.Lock()
_contracts: list[SyncContract] = []
_open_now: tuple[SyncContract, ...] = ()  # `_contracts` as the hooks walk it
_by_owner: weakref.WeakKeyDictionary[Any, SyncContract] = weakref.WeakKeyDictionary()
_pre: Any = None  # torch's global step pre-hook's handle: one for all contracts
_post: Any = None  # ... and its post-hook's, once a step with a closure was seen
_stepping = 0  # our hooks running now (torch is walking its hook tables)


def _open(contract: SyncContract, owner: Any) -> None:
    global _pre, _open_now
    with _lock:
        _contracts.append(contract)
        _open_now = tuple(_contracts)
        _by_owner[owner] = contract
        if _pre is None:
            _pre = register_optimizer_step_pre_hook(_before_step)


def _close(contract: SyncContract) -> None:
    global _pre, _post, _open_now
    with _lock:
        if contract in _contracts:
            _contracts.remove(contract)
            _open_now = tuple(_contracts)
        if _contracts or _stepping:
            return  # (See [Note: the optimizer-step hooks])
        handles = (_pre, _post)
        _pre = _post = None
    for h in handles:
        if h is not None:
            h.remove()


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if (len(args) > 1 and args[1] is not None) or (kwargs and
                                                   kwargs.get("closure") is not None):
        if _post is None:  # (`_closure`, written out: this runs at every step)
            _with_closure()  # judged after its closure ran
        return
    if not _open_now or _graph_task() != -1:
        return  # nothing open, or a step applied inside a backward
    for contract in _open_now:
        # the usual step, inline (an optimizer known as it was, nothing to judge): See
        # [Note: the optimizer-step hooks]; else `stepped`, the only path that can close a
        # contract (and so would remove the hooks while torch walks them: `_stepped`)
        holder = contract._holders.get(id(optimizer))
        if holder is None or contract.dirt is not None or \
                holder.groups != len(optimizer.param_groups):
            _stepped(contract, optimizer)
        elif holder.held:
            holder.steps += 1
            contract.last = NONE


def _stepped(contract: SyncContract, optimizer: Any) -> None:
    """`contract.stepped(optimizer)`, counted in `_stepping` while it runs."""
    global _stepping
    _stepping += 1
    try:
        contract.stepped(optimizer)
    finally:
        _stepping -= 1


def _with_closure() -> None:
    """A step given a closure: make sure the post-hook that judges it is there."""
    global _post
    with _lock:
        if _post is None and _pre is not None:
            _post = register_optimizer_step_post_hook(_after_step)


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _closure(args, kwargs):  # judged now, its closure run, as a step without one before it
        _before_step(optimizer, (), {})


def _closure(args: Any, kwargs: Any) -> bool:
    """Was `step()` given a closure (which computes the loss and gradients inside it)?"""
    return (len(args) > 1 and args[1] is not None) or kwargs.get("closure") is not None


def open_contracts() -> list[SyncContract]:
    """The contracts open in this process (tests, debugging)."""
    with _lock:
        return list(_contracts)


# --- collectives since a backward ---------------------------------------------------------


def collectives_issued() -> int | None:
    """A number that grows with every collective this process issues: the ledger's count of
    the job's collectives plus every process group's sequence number (which torch advances
    for collectives that bypass Python too); None when neither can be read here."""
    ledger = _ledger._issued if _ledger._enabled else None  # (job_collectives_issued())
    try:
        sequences = 0
        for group in list(c10d._world.pg_map):  # the process groups of this process
            sequences += group._get_sequence_number_for_group()  # type: ignore[attr-defined]
    except Exception:  # a backend without sequence numbers
        return ledger
    return (ledger or 0) + sequences


# --- call sites -----------------------------------------------------------------------------

# id(code) -> (code, whether it is torch's, ddpviz's or the standard library's), decided once
# per code object (kept here, so its id stays its own; a code's own hash reads its bytecode)
_DEPTH = 64


def first_user_frame(frame: FrameType | None) -> Frame | None:
    """The first frame from `frame` outward that is the user's (not torch's, ddpviz's or the
    standard library's; a framework's counts as the user's); None past _DEPTH frames."""
    f = user_frame(frame, _DEPTH)
    if f is None:
        return None
    code = f.f_code
    return Frame(code.co_filename, f.f_lineno or code.co_firstlineno, code.co_name)


def _backward_site() -> Frame | None:
    """Where backward() was called: this thread's first user frame (CPU: the caller runs the
    backward), else that of the thread blocked in torch's autograd engine (CUDA: device
    threads run the hooks)."""
    here = first_user_frame(sys._getframe(1))
    if here is not None:
        return here
    for frame in sys._current_frames().values():
        f: FrameType | None = frame
        for _ in range(_DEPTH):
            if f is None:
                break
            if f.f_code.co_name == "_engine_run_backward":
                return first_user_frame(f)
            f = f.f_back
    return None


def _user_level() -> int:
    """warnings.warn's stacklevel that names the user's frame calling optimizer.step()."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and level < _DEPTH:
        if owner(frame.f_code.co_filename) is None:
            return level
        frame = frame.f_back
        level += 1
    return 2
