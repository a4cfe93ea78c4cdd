"""A rank-side install (`pip install ddpviz`, without the [lab] extra) runs the rank side:
import ddpviz, ddpviz's DDP, watch() on torch's DDP, the sender writing a trace, and
`ddpviz record`'s modules, with the notebook packages unimportable; the widgets then say
how to install them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RANK_SIDE = r'''
import importlib.abc, sys
LAB = ("ipywidgets", "anywidget", "plotly", "jupyterlab", "IPython", "ipykernel",
       "traitlets", "jupyter_server", "jupyter_client", "nbformat")

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in LAB:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())

import datetime, os, tempfile
import torch, torch.distributed as dist
from torch import nn
import ddpviz, ddpviz.record.autowatch, ddpviz.record.command, ddpviz.transport.sender
from ddpviz.session.connect import connect, disconnect

folder = tempfile.mkdtemp()
os.environ["DDPVIZ_TRACE_DIR"] = folder
connect(rank=0)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0,
                        world_size=1, timeout=datetime.timedelta(seconds=30))
torch.manual_seed(0)
ours = ddpviz.DistributedDataParallel(nn.Linear(4, 2))
ours(torch.randn(3, 4)).sum().backward()
theirs = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
w = ddpviz.watch(theirs)
theirs(torch.randn(3, 4)).sum().backward()
w.close()
dist.destroy_process_group()
disconnect()
trace = ddpviz.Trace.load(os.path.join(folder, "ddpviz-trace-rank0.ddpviz"))
print("events", sum(type(e).__name__ == "AllReduceDone" for e in trace))
print("lab modules", sorted(m for m in sys.modules if m.split(".")[0] in LAB))
for what in ("import ddpviz.widgets", "ddpviz.bucket_plan(nn.Linear(2, 2)).show()",
             "ddpviz.Trace.load(os.path.join(folder, 'ddpviz-trace-rank0.ddpviz')).dashboard()"):
    try:
        exec(what)
        print("no error:", what)
    except ImportError as exc:
        print("error:", str(exc).splitlines()[-1])
'''


def test_rank_side_runs_without_the_lab_packages() -> None:
    from tests.dist.harness import free_port

    done = subprocess.run([sys.executable, "-c", RANK_SIDE, str(free_port())], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "events 2"  # one bucket all-reduce from each DDP, in the trace
    assert lines[1] == "lab modules []"
    fix = "error: Install the notebook side with `pip install 'ddpviz[lab]'`."
    assert lines[2:] == [fix, fix, fix]
