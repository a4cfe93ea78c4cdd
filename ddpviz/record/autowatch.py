"""What `ddpviz record` does in every rank: watch each torch DistributedDataParallel the
unmodified script constructs (the startup hook `ddpviz_autowatch` calls `construct`).

Per DDP: before torch's constructor (whose first collectives would block on a missing rank
until the process group's timeout), every rank meets through the store with the hang
watchdog's deadline, so a rank that never comes is named; then torch's constructor runs, and
right after it the gradient-sync contract attaches (probes/sync_contract.py: it needs no
forward, so it sees a DDP that is never called while its module trains); then
`ddpviz.watch()` attaches, at the first of: the script registering a comm hook (watch wraps
that hook: torch allows only one, so watch's own is the one registered) or the first forward.
See [Note: two attach points].
Events go where `ddpviz.connect()` sends them: the session in $DDPVIZ_CONNECT, else per-rank
trace files in $DDPVIZ_TRACE_DIR.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch.distributed as dist
from torch import nn

from ddpviz import events as ev
from ddpviz._watch import NotObservableError, Watch, new_watch
from ddpviz.debugger.controller import install_from_env
from ddpviz.engine.compiler import keep_ddpviz_eager, not_observable
from ddpviz.engine.params import build_params_for_reducer
from ddpviz.engine.verify import breaks_torch, compare_through_store
from ddpviz.errors import DiagnosisError
from ddpviz.events import Tap
from ddpviz.probes.sync_contract import SyncContract, contract_of, first_user_frame
from ddpviz.probes.watchdog import Watchdog, resolve_hang_timeout
from ddpviz.record import said
from ddpviz.recording import stack_source_from_env
from ddpviz.session.connect import connect

DDP = nn.parallel.DistributedDataParallel
_REGISTER = DDP.register_comm_hook  # torch's, before the class patch
WHAT = "torch's DistributedDataParallel constructor"
FIRST = "the first forward of torch's DistributedDataParallel"

# [Note: two attach points]
# Every DDP gets its gradient-sync contract at construction: a loss computed on ddp.module
# never calls the DDP, and the contract needs no forward to see it. Its Watch still attaches
# at the first forward or at the script's comm hook registration, whichever comes first, and
# then takes the contract over (sync_contract.adopt). Attaching the Watch at construction too
# would lose what that point gives: its meeting through the store names a rank that never
# reaches the first forward (stuck in setup or data loading) as missing there, before the
# process group's timeout; a script that calls ddpviz.watch() itself after construction is
# not refused as "watched already"; a DDP that is built and never called costs no watchdog
# meeting, heartbeat thread or forward wrapper, only the contract's few hooks; and every form
# tested with record (comm hooks, torch.compile, replicate(), the frameworks) keeps the attach
# point it was tested with.

_pending: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
watches: list[Watch] = []  # every Watch this process attached (tests, debugging)
_lock = threading.Lock()
_patched = False


def construct(original: Callable[..., None], ddp: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> None:
    """torch's DistributedDataParallel.__init__(ddp, *args, **kwargs), recorded."""
    keep_ddpviz_eager()  # See [Note: ddpviz under torch.compile]
    _install_class_patches()
    sender = connect()
    install_from_env(sender, sender.rank)  # `ddpviz record --debug`: the notebook's debugger
    try:
        bound = inspect.signature(original).bind(ddp, *args, **kwargs).arguments
    except TypeError:
        bound = None  # torch's constructor raises its own error for these arguments
    group = _group(bound)
    if group is not None:
        said.install(group)  # See [Note: one line per finding per job]
        tap = Tap(ev.default_emitter(), rank=group.rank())
        dog = Watchdog(group, timeout=resolve_hang_timeout(None, group), tap=tap,
                       stack_source=stack_source_from_env())
        dog.start(WHAT)
        if bound is not None and isinstance(bound.get("module"), nn.Module):
            _compare_models(dog, bound["module"], tap)
    names = _replicated_names(args, kwargs)
    built_at = first_user_frame(sys._getframe(2))  # (1: the startup hook's __init__)
    original(ddp, *args, **kwargs)
    _pending[ddp] = True
    _contract(ddp, names, built_at)
    if names is not None:
        _drive(ddp, names)


def _contract(ddp: Any, names: list[str] | None, built_at: Any) -> None:
    """The DDP's gradient-sync contract, from now on (See [Note: two attach points]); none for
    a DDP ddpviz cannot watch. Never fails the job: a contract that cannot be made is said
    once and the job goes on."""
    if not_observable(ddp) or getattr(ddp, "_delay_all_reduce_all_params", False):
        return
    try:
        entries = build_params_for_reducer(ddp.module, set(ddp.parameters_to_ignore))
        params = [e.param for e in entries]
        if names is None or len(names) != len(params):
            names = [e.name for e in entries]
        group = ddp.process_group
        SyncContract(ddp, params, names, Tap(ev.default_emitter(), rank=group.rank()),
                     world_size=group.size(), source=stack_source_from_env(),
                     built_at=built_at)
    except Exception as exc:  # (never into the job)
        print(f"ddpviz record: cannot check the gradient sync of this DistributedDataParallel "
              f"({exc!r}); the job runs on.", file=sys.stderr)


def _replicated_names(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str] | None:
    """The dotted names of the parameters when torch's composable replicate() (torchtitan's
    data parallelism) builds this DDP: over a ParameterList ("0", "1", ...) whose real names
    its state keeps. Read from the caller's frame, once per construction."""
    module = args[0] if args else kwargs.get("module")
    if not isinstance(module, nn.ParameterList):
        return None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        state = frame.f_locals.get("self")
        if getattr(state, "_param_list", None) is module:
            names = getattr(state, "_param_names", None)
            return [str(n) for n in names] if isinstance(names, list) else None
        frame = frame.f_back
    return None


def _drive(ddp: Any, names: list[str]) -> None:
    """replicate() calls the DDP's `_pre_forward` from a module hook, never its forward: the
    first call attaches the watch (which then wraps `_pre_forward` itself)."""
    def _pre_forward(*args: Any, **kwargs: Any) -> Any:
        ddp.__dict__.pop("_pre_forward", None)
        if ddp in _pending:
            watch_pending(ddp, names=names, driven=True)
        return ddp._pre_forward(*args, **kwargs)

    ddp._pre_forward = _pre_forward


def _compare_models(dog: Watchdog, module: nn.Module, tap: Tap) -> None:
    """Before torch's constructor: the ranks' models compared through the store. Where torch
    would fail (a count, shape, stride or dtype differs: it names at most a count or one index,
    on one rank, while the others hang in its broadcast), every rank raises the same
    RankMismatchError naming parameter, field and ranks; differences torch accepts (names,
    order) are warned about."""
    if dog.board is None:
        return
    report = compare_through_store(
        module, dog.rank, dog.world_size,
        lambda name, payload: dog.exchange(name, payload, f"the model comparison ({WHAT})"))
    if report.ok:  # recorded as the twin's check is: the report shows it as it happened
        if tap.enabled:
            tap.emit(ev.VerificationPassed, report.world_size, report.digest)
        return
    if tap.enabled:  # diagnosis turns it into one finding per difference
        tap.emit(ev.VerificationFailed, report.world_size, report.mismatches)
    if breaks_torch(report):
        report.raise_if_failed()
    if dog.rank == 0:
        text = report.message().removeprefix("ddpviz: ")
        print(f"ddpviz record: {text}\n(torch's DistributedDataParallel accepts this "
              "difference; the job goes on.)", file=sys.stderr)


def _group(bound: dict[str, Any] | None) -> dist.ProcessGroup | None:
    """The group torch's constructor will use (its `process_group`, the device mesh's, or the
    default group)."""
    if bound is None:
        return None
    mesh = bound.get("device_mesh")
    if mesh is not None:
        try:
            return mesh.get_group(mesh_dim=0)
        except Exception:  # not a 1-D mesh: torch raises its own error
            return None
    group = bound.get("process_group")
    if group is not None:
        return group
    return dist.group.WORLD if dist.is_initialized() else None


def watch_pending(ddp: Any, hook: Callable[..., Any] | None = None, state: Any = None, *,
                  names: list[str] | None = None, driven: bool = False) -> Watch | None:
    """Watch `ddp` now if it is still waiting for it (with the script's comm hook, if any)."""
    with _lock:
        if _pending.pop(ddp, None) is None:
            return None
    if getattr(ddp, "_comm_hooks", None):  # registered before we could see it
        _not_watched(ddp, "it already has a comm hook")
        return None
    try:
        w = new_watch(ddp, emitter=None, hook=hook, state=state, hang_timeout=None,
                      names=names, driven=driven, where=FIRST)
    except DiagnosisError:
        raise  # a diagnosis of the job, on every rank: the reason ddpviz is there
    except Exception as exc:  # ddpviz cannot watch it: the job goes on as without ddpviz
        why = str(exc).removeprefix("ddpviz: ").split("\n")[0].rstrip(".")
        _not_watched(ddp, why.removeprefix(NotObservableError.PREFIX),
                     everywhere=not isinstance(exc, NotObservableError))
        if hook is not None:  # the script's own registration, as torch would do it
            _REGISTER(ddp, state, hook)
        return None
    watches.append(w)
    return w


def _install_class_patches() -> None:
    """DDP.__call__ attaches a pending watch before the first forward runs its hooks;
    DDP.register_comm_hook hands the script's hook to watch() instead of registering it."""
    global _patched
    with _lock:
        if _patched:
            return
        _patched = True
    call = DDP.__call__
    register = _REGISTER

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self in _pending:
            watch_pending(self)
        return call(self, *args, **kwargs)

    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        if self in _pending:
            if str(getattr(hook, "__module__", "")).startswith("ddpviz."):
                _pending.pop(self, None)  # the script calls ddpviz.watch() itself: let it
            else:
                watch_pending(self, hook=hook, state=state)
                return
        register(self, state, hook)

    register_comm_hook.__doc__ = register.__doc__
    DDP.__call__ = __call__  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    for name in ("register_builtin_comm_hook", "_register_builtin_comm_hook"):
        builtin = getattr(DDP, name, None)
        if builtin is not None:
            setattr(DDP, name, _builtin_patch(builtin))


def _builtin_patch(builtin: Callable[..., None]) -> Callable[..., None]:
    def register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        if self in _pending:
            watch_pending(self)  # hook-less levels leave the registration to torch; guarded ones
        own = self.__dict__.get("_register_builtin_comm_hook")  # take it (in Python)
        if own is not None:
            own(comm_hook_type)
        else:
            builtin(self, comm_hook_type)

    register_builtin_comm_hook.__doc__ = builtin.__doc__
    return register_builtin_comm_hook

def _not_watched(ddp: Any, why: str, *, everywhere: bool = True) -> None:
    """Say once why `ddp` runs unwatched: on its rank 0 only when every rank has the same
    reason (how the DDP was built), else on each rank."""
    contract = contract_of(ddp)
    if contract is not None and not contract.adopted:  # unwatched: as without ddpviz
        contract.close()
    rank = ddp.process_group.rank()
    if everywhere or rank == 0:
        print(f"ddpviz record: rank {rank}: this DistributedDataParallel is not watched: {why}; "
              "the job runs as without ddpviz.", file=sys.stderr)
