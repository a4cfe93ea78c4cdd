"""ddpviz under torch.compile (engine/compiler.py): ddpviz's frames are in dynamo's skip list
once dynamo is imported, and ddpviz never imports dynamo itself (about 2 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
import torch
from ddpviz.engine.compiler import keep_ddpviz_eager
import importlib
w = importlib.import_module("ddpviz._watch")
keep_ddpviz_eager()
print("dynamo imported by ddpviz:", "torch._dynamo" in sys.modules)
import torch._dynamo.trace_rules as rules
print("ddpviz skipped:", rules.check_file(w.__file__).skipped)
print("user code skipped:", rules.check_file("/x/train.py").skipped)
"""


def test_ddpviz_frames_join_dynamos_skip_list_when_dynamo_comes_later() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={"PYTHONPATH": str(ROOT),
                                                      "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == ["dynamo imported by ddpviz: False",
                                          "ddpviz skipped: True", "user code skipped: False"]


def test_a_python_reducer_ddp_is_not_observable_and_others_are() -> None:
    from ddpviz.engine.compiler import not_observable

    class Built:
        _use_python_reducer = True

    assert "optimize_ddp = 'python_reducer'" in not_observable(Built())
    assert not_observable(object()) == ""
