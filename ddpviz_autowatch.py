"""The startup hook of `ddpviz record` (stdlib only, imported by `ddpviz_autowatch.pth`).

`ddpviz_autowatch.pth`, installed into site-packages with ddpviz, runs one line at every
interpreter start: `os.environ.get("DDPVIZ_RECORD")`. Only when that variable is set does it
import this module (if that fails, a leftover hook of an uninstalled ddpviz, it says so once,
never with a traceback), and `install()` arms only for the value "1" that `ddpviz record` sets
(another value is said once and ignored) and only adds a meta path finder: nothing of torch or
ddpviz is imported here. When torch later imports `torch.nn.parallel.distributed`,
the finder wraps `DistributedDataParallel.__init__`; the first DDP constructed imports
`ddpviz.record.autowatch`, which watches it (and every later one).
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
    """A module's own loader, then `then(module)` right after the module ran."""

    def __init__(self, loader: Any, then: Any) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then(module)


class _Finder:
    """Finds nothing itself: when `name` is imported, hands its own spec back with a loader
    that calls `then(module)` once the module ran. One module, once."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self._then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None, /) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self._then)
                return spec
        return None


def after_import(name: str, then: Any) -> None:
    """Call `then(module)` once module `name` is imported: now if it is already, else right
    after its import (ddpviz also uses it for dynamo's trace rules: engine/compiler.py)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    elif not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, then))


def _patch_module(module: ModuleType) -> None:
    patch(module.DistributedDataParallel)


def patch(cls: type) -> None:
    """Wrap `cls.__init__` (torch's DistributedDataParallel) so that each instance is watched;
    the work is done by `ddpviz.record.autowatch`, imported at the first construction (torch is
    fully imported by then)."""
    original = cls.__init__  # type: ignore[misc]
    if getattr(original, "__ddpviz_autowatch__", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            from ddpviz.record.autowatch import construct
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
    after_import(_TARGET, _patch_module)  # at once if torch came first (an unusual order)
