"""A "kernel" interrupted inside the first import behind a lazy `ddpviz` name, the moment the
import reaches `MODULE`, as Jupyter's interrupt button would; prints what it found as JSON.

Run: python -m tests.launch.interrupt_import NAME MODULE
"""

from __future__ import annotations

import json
import os
import signal
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

import ddpviz


class _InterruptAt:
    """A meta path finder that sends this process SIGINT when `module` is first looked for."""

    def __init__(self, module: str) -> None:
        self.module, self.fired = module, False

    def find_spec(self, name: str, path: object = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name == self.module and not self.fired:
            self.fired = True
            os.kill(os.getpid(), signal.SIGINT)
        return None  # the real finders import it


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as ipykernel's handler does
    name, module = sys.argv[1], sys.argv[2]
    finder = _InterruptAt(module)
    sys.meta_path.insert(0, finder)
    raised = "nothing"
    try:
        getattr(ddpviz, name)
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    sys.meta_path.remove(finder)
    owner = ddpviz._WHERE[name]
    print(json.dumps({"fired": finder.fired, "raised": raised,
                      "owner_loaded": owner in sys.modules,
                      "module_loaded": module in sys.modules,
                      "usable": callable(getattr(ddpviz, name))}), flush=True)


if __name__ == "__main__":
    main()
