"""What `ddpviz record` does in every rank: watch each torch DistributedDataParallel the
unmodified script constructs (the startup hook `ddpviz_autowatch` calls `construct`).

Per DDP: before torch's constructor (whose first collectives would block on a missing rank
until the process group's timeout), every rank meets through the store with the hang
watchdog's deadline, so a rank that never comes is named; then torch's constructor runs; then
`ddpviz.watch()` attaches, at the first of: the script registering a comm hook (watch wraps
that hook: torch allows only one, so watch's own is the one registered) or the first forward.
Events go where `ddpviz.connect()` sends them: the session in $DDPVIZ_CONNECT, else per-rank
trace files in $DDPVIZ_TRACE_DIR.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import nn

from ddpviz import events as ev
from ddpviz.engine.watchdog import Watchdog, resolve_hang_timeout
from ddpviz.events import Tap
from ddpviz.session import connect
from ddpviz.watch import Watch, watch

DDP = nn.parallel.DistributedDataParallel
WHAT = "torch's DistributedDataParallel constructor"

_pending: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
watches: list[Watch] = []  # every Watch this process attached (tests, debugging)
_lock = threading.Lock()
_patched = False


def construct(original: Callable[..., None], ddp: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> None:
    """torch's DistributedDataParallel.__init__(ddp, *args, **kwargs), recorded."""
    _install_class_patches()
    connect()
    group = _group(original, ddp, args, kwargs)
    if group is not None:
        Watchdog(group, timeout=resolve_hang_timeout(None, group),
                 tap=Tap(ev.default_emitter(), rank=group.rank())).start(WHAT)
    original(ddp, *args, **kwargs)
    _pending[ddp] = True


def _group(original: Callable[..., None], ddp: Any, args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> dist.ProcessGroup | None:
    """The group torch's constructor will use (its `process_group`, the device mesh's, or the
    default group)."""
    try:
        bound = inspect.signature(original).bind(ddp, *args, **kwargs).arguments
    except TypeError:
        return None  # torch's constructor raises its own error for these arguments
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


def attach(ddp: Any, hook: Callable[..., Any] | None = None, state: Any = None) -> Watch | None:
    """Watch `ddp` now if it is still waiting for it (with the script's comm hook, if any)."""
    with _lock:
        if _pending.pop(ddp, None) is None:
            return None
    if getattr(ddp, "_comm_hooks", None):  # registered before we could see it
        _not_watched(ddp, "it already has a comm hook")
        return None
    w = watch(ddp, hook=hook, state=state)
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
    register = DDP.register_comm_hook

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self in _pending:
            attach(self)
        return call(self, *args, **kwargs)

    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        if self in _pending:
            if str(getattr(hook, "__module__", "")).startswith("ddpviz."):
                _pending.pop(self, None)  # the script calls ddpviz.watch() itself: let it
            else:
                attach(self, hook=hook, state=state)
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
        if _pending.pop(self, None) is not None:
            _not_watched(self, "the script registers a builtin comm hook (C++), which ddpviz "
                               "cannot wrap; use register_comm_hook with the Python hook")
        builtin(self, comm_hook_type)

    register_builtin_comm_hook.__doc__ = builtin.__doc__
    return register_builtin_comm_hook

def _not_watched(ddp: Any, why: str) -> None:
    print(f"ddpviz record: rank {ddp.process_group.rank()}: this DistributedDataParallel is not "
          f"watched: {why}.", file=sys.stderr)
