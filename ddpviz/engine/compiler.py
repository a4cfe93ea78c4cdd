"""What ddpviz does about `torch.compile`: its own frames run as torch's own do, never traced.

See [Note: ddpviz under torch.compile].
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

# [Note: ddpviz under torch.compile]
# Dynamo converts every Python frame that starts while a compiled callable runs, unless the
# frame's file is in one of its skip directories (torch's own files are: that is why DDP's
# forward runs eagerly under `torch.compile(DDP(model))` and only the module it calls is
# compiled, split at bucket boundaries by the DDPOptimizer). ddpviz's wrappers of a DDP's
# `__call__`/`forward` are not torch's files, so dynamo tried to trace them (and the watch
# they attach: locks, store reads), which crashed the job ("UnsafeScriptObjectError: Attempted
# to access unregistered member on an OpaqueObject"). So ddpviz's package directory joins
# dynamo's skip directories: each ddpviz frame runs eagerly, and the frames it calls (DDP's
# forward, the user's module) are handled exactly as without ddpviz. Importing dynamo costs
# about 2 s, so ddpviz never imports it: when dynamo is not imported yet, a one-shot import hook
# adds the directory the moment dynamo's trace rules are loaded (`torch.compile` imports them
# before it traces anything).

_RULES = "torch._dynamo.trace_rules"
_lock = threading.Lock()
_done = False


def keep_ddpviz_eager() -> None:
    """Make dynamo skip ddpviz's frames (now, or when dynamo is first imported)."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
    rules = sys.modules.get(_RULES)
    if rules is not None and hasattr(rules, "SKIP_DIRS_RE"):
        _skip(rules)
    else:
        sys.meta_path.insert(0, _AfterImport())


def _skip(rules: ModuleType) -> None:
    try:
        rules.add("ddpviz")
    except Exception as exc:  # a torch whose rules differ: ddpviz's frames may be traced
        print(f"ddpviz: could not keep ddpviz's frames out of torch.compile ({exc!r}); under "
              "torch.compile a watched job may fail to compile.", file=sys.stderr)


class _Loader(importlib.abc.Loader):
    """dynamo's own loader for its trace rules, then the skip directory."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _skip(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands back the trace rules' own spec with a loader that adds
    ddpviz's directory once the module ran."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _RULES:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def not_observable(ddp: Any) -> str:
    """Why ddpviz cannot watch this torch DistributedDataParallel ("" when it can)."""
    if getattr(ddp, "_use_python_reducer", False):
        return ("it was built with torch._dynamo.config.optimize_ddp = 'python_reducer', so "
                "it all-reduces each gradient from its own post-accumulate-grad hook (traced "
                "into the backward by compiled autograd), never through the buckets of torch's "
                "C++ reducer that ddpviz watches; 'ddp_optimizer' (the default) and "
                "'no_optimization' are observable")
    return ""
