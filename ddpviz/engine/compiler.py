"""What ddpviz does about `torch.compile`: its own frames run as torch's own do, never traced.

See [Note: ddpviz under torch.compile].
"""

from __future__ import annotations

import sys
import threading
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
    from ddpviz_autowatch import after_import  # stdlib only, installed with ddpviz

    after_import(_RULES, _skip)


def _skip(rules: ModuleType) -> None:
    try:
        rules.add("ddpviz")
    except Exception as exc:  # a torch whose rules differ: ddpviz's frames may be traced
        print(f"ddpviz: could not keep ddpviz's frames out of torch.compile ({exc!r}); under "
              "torch.compile a watched job may fail to compile.", file=sys.stderr)


def not_observable(ddp: Any) -> str:
    """Why ddpviz cannot watch this torch DistributedDataParallel ("" when it can)."""
    if getattr(ddp, "_use_python_reducer", False):
        return ("it was built with torch._dynamo.config.optimize_ddp = 'python_reducer', so "
                "it all-reduces each gradient from its own post-accumulate-grad hook (traced "
                "into the backward by compiled autograd), never through the buckets of torch's "
                "C++ reducer that ddpviz watches; 'ddp_optimizer' (the default) and "
                "'no_optimization' are observable")
    return ""
