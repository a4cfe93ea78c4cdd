"""The startup hook of `ddpviz record` (stdlib only, imported by `ddpviz_autowatch.pth`).

`ddpviz_autowatch.pth`, installed into site-packages with ddpviz, runs one line at every
interpreter start: `os.environ.get("DDPVIZ_RECORD")`. Only when that variable is set does it
import this module (if that fails, a leftover hook of an uninstalled ddpviz, it says so once,
never with a traceback), and `install()` arms only for the value "1" that `ddpviz record` sets
(another value is said once and ignored) and only adds a meta path finder: nothing of torch or
ddpviz is imported here. When torch later imports `torch.nn.parallel.distributed`,
the finder wraps `DistributedDataParallel.__init__`; the first DDP constructed imports
`ddpviz.autowatch`, which watches it (and every later one).
"""

from __future__ import annotations

import sys

# Only `sys` at start-up (this runs in every process of the job, torchrun's agent included):
# annotations are strings (never evaluated), so typing is not imported.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

ENV = "DDPVIZ_RECORD"
_SAID = "DDPVIZ_RECORD_SAID"  # set once a process of the job said why it does not record
_TARGET = "torch.nn.parallel.distributed"


class _Loader:
    """torch's own loader for the DDP module, then the patch."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module.DistributedDataParallel)


class _Finder:
    """Finds nothing itself: when torch's DDP module is imported, hands torch's own spec back
    with a loader that patches the class right after the module ran."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None, /) -> ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # one module, once
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def patch(cls: type) -> None:
    """Wrap `cls.__init__` (torch's DistributedDataParallel) so that each instance is watched;
    the work is done by `ddpviz.autowatch`, imported at the first construction (torch is
    fully imported by then)."""
    original = cls.__init__  # type: ignore[misc]
    if getattr(original, "__ddpviz_autowatch__", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            from ddpviz.autowatch import construct
        except ImportError as exc:  # ddpviz gone, its hook left: the job runs unwatched
            say_once(f"ddpviz: {ENV} is set but ddpviz cannot be imported ({exc}), so this "
                     "job runs unwatched.\nReinstall ddpviz, or remove the leftover "
                     "ddpviz_autowatch.pth and ddpviz_autowatch.py from site-packages.")
            original(self, *args, **kwargs)
            return
        construct(original, self, args, kwargs)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(__init__, name, getattr(original, name, None))
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__ddpviz_autowatch__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def say_once(message: str) -> None:
    """Print `message` to stderr once per job: the first process says it and marks the
    environment, which the job's later processes (torchrun's ranks) inherit."""
    import os

    if not os.environ.get(_SAID):
        os.environ[_SAID] = "1"
        print(message, file=sys.stderr)


def install() -> None:
    """Watch every torch DDP this process constructs (called by the .pth when $DDPVIZ_RECORD
    is set). Only the documented value "1" arms it (what `ddpviz record` sets); any other
    value is said once and ignored, as a `DDPVIZ_RECORD=0` meaning "off" must not record."""
    import os

    value = os.environ.get(ENV, "")
    if value != "1":
        if value:
            say_once(f"ddpviz: ignoring {ENV}={value[:40]!r}: only {ENV}=1 (what `ddpviz "
                     "record` sets) turns recording on, so this job is not recorded.\nUnset "
                     f"{ENV} to silence this, or run the job under `ddpviz record`.")
        return
    module = sys.modules.get(_TARGET)
    if module is not None:  # torch came first (an unusual .pth order): patch right away
        patch(module.DistributedDataParallel)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
