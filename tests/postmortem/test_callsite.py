"""Call sites and who launched a collective, from the stacks of Flight Recorder entries: the
folding rules of probes/stack_text.py, also for dumps written on another machine; what a
post-mortem says of the job's own collectives on crafted dumps (with stacks, and without)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import ddpviz
from ddpviz._postmortem.callsite import (
    MAX_FUNC,
    MAX_PATH,
    call_site,
    frame_owner,
    origin,
    torch_path,
)
from ddpviz.events import FindingReported
from ddpviz.limits import MAX_NAME
from ddpviz.probes.stack_text import Frame
from tests.postmortem.test_dumps import dump, entry

TORCH = os.path.dirname(torch.__file__)
ELSEWHERE = "/opt/conda/lib/python3.10/site-packages"  # another machine's install


def frames(*where: tuple[str, int, str]) -> tuple[Frame, ...]:
    return tuple(Frame(f, line, func) for f, line, func in where)


@pytest.mark.parametrize("file,owner", [
    (f"{TORCH}/distributed/distributed_c10d.py", "torch/distributed"),
    (f"{ELSEWHERE}/torch/distributed/distributed_c10d.py", "torch/distributed"),
    (f"{ELSEWHERE}/torch/_tensor.py", "torch"),
    ("/home/me/src/pytorch/torch/nn/parallel/distributed.py", "torch/nn"),  # a source tree
    (f"{ELSEWHERE}/ddpviz/_watch/base.py", "ddpviz"),
    ("/usr/lib/python3.10/threading.py", "stdlib"),
    ("<frozen runpy>", "stdlib"),
    (f"{ELSEWHERE}/lightning/pytorch/loops/fit_loop.py", None),  # a framework runs the loop
    ("/home/me/train.py", None),
    ("/home/me/torch_utils/torch/metrics.py", None),  # a folder named torch of the user's
])
def test_whose_frame(file: str, owner: str | None) -> None:
    assert frame_owner(file) == owner


def test_torch_path_is_inside_torch() -> None:
    assert torch_path(f"{ELSEWHERE}/torch/nn/parallel/distributed.py") == \
        "nn/parallel/distributed.py"
    assert torch_path(f"{TORCH}/autograd/graph.py") == "autograd/graph.py"
    assert torch_path("/home/me/train.py") is None


C10D = f"{ELSEWHERE}/torch/distributed/distributed_c10d.py"
LOGGER = f"{ELSEWHERE}/torch/distributed/c10d_logger.py"


def test_the_call_site_is_the_users_frame_nearest_the_collective() -> None:
    # all_gather_object calls all_gather twice through torch's wrappers
    stack = frames((C10D, 4280, "all_gather"), (LOGGER, 83, "wrapper"),
                   (C10D, 3513, "all_gather_object"), (LOGGER, 83, "wrapper"),
                   ("/home/me/train.py", 28, "log_metrics"), ("/home/me/train.py", 90, "main"),
                   ("/usr/lib/python3.10/runpy.py", 86, "_run_code"))
    assert call_site(stack) == Frame("/home/me/train.py", 28, "log_metrics")
    assert origin(stack) == "job"
    assert call_site(frames((C10D, 4280, "all_gather"))) is None
    assert call_site(()) is None and origin(()) == ""


def test_ddps_collectives_are_told_by_their_stack() -> None:
    user = ("/home/me/train.py", 15, "main")
    backward = frames((f"{ELSEWHERE}/torch/autograd/graph.py", 979, "_engine_run_backward"),
                      (f"{ELSEWHERE}/torch/_tensor.py", 623, "backward"), user)
    constructor = frames((f"{ELSEWHERE}/torch/distributed/utils.py", 286,
                          "_verify_param_shape_across_processes"),
                         (f"{ELSEWHERE}/torch/nn/parallel/distributed.py", 1064, "__init__"),
                         user)
    hook = frames((C10D, 3245, "all_reduce"),
                  (f"{ELSEWHERE}/torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py",
                   29, "_allreduce_fut"), (f"{ELSEWHERE}/torch/autograd/graph.py", 979,
                                           "_engine_run_backward"), user)
    for stack in (backward, constructor, hook):
        assert origin(stack) == "ddp"
        assert call_site(stack) == Frame(*user)
    # the user's own gradient hook, all-reducing inside backward: the job's
    mine = frames((C10D, 3245, "all_reduce"), ("/home/me/train.py", 40, "sync_grad"),
                  (f"{ELSEWHERE}/torch/autograd/graph.py", 979, "_engine_run_backward"), user)
    assert origin(mine) == "job" and call_site(mine) == Frame("/home/me/train.py", 40,
                                                              "sync_grad")


def site_entry(seq: int, line: int, func: str, op: str = "all_reduce", numel: int = 1,
               retired: bool = True) -> dict[str, Any]:
    e = entry(seq, op=op, numel=numel, retired=retired)
    if op == "barrier":  # a barrier carries no tensor
        e["input_sizes"] = e["output_sizes"] = e["input_dtypes"] = e["output_dtypes"] = []
    e["frames"] = [{"name": op, "filename": C10D, "line": 1},
                   {"name": func, "filename": "/home/me/train.py", "line": line}]
    return e


def test_a_collective_only_one_rank_issues_is_named_with_its_call_site() -> None:
    # both ranks log metrics (line 10) each step; rank 1 then all-reduces in debug_print
    # (line 20) while rank 0 goes on to log the next step's metrics: both wait
    r0 = dump([site_entry(1, 10, "log_metrics", op="all_gather"),
               site_entry(2, 10, "log_metrics", op="all_gather", retired=False)])
    r1 = dump([site_entry(1, 10, "log_metrics", op="all_gather"),
               site_entry(2, 20, "debug_print", retired=False)])
    pm = ddpviz.postmortem([r0, r1])
    assert [f.kind for f in pm.findings] == ["collective_mismatch"], str(pm)
    f = pm.findings[0]
    assert f.ranks == (1,) and f.field == "op"
    assert dict(f.values) == {"all_gather [1] float32 at /home/me/train.py:10 in log_metrics":
                              (0,),
                              "all_reduce [1] float32 at /home/me/train.py:20 in debug_print":
                              (1,)}
    rows = {(j["function"], tuple(j["ranks"])) for j in pm.job_collectives()}
    assert rows == {("log_metrics", (0, 1)), ("debug_print", (1,))}
    # the widget lists them too, escaped
    html = pm.show().html.value
    assert "/home/me/train.py:20 in debug_print" in html


def test_a_rank_that_never_launched_it_is_behind_when_it_launches_it_elsewhere() -> None:
    # rank 1's dump ends before #3; it launched the same line's collective before: behind, not
    # a collective only rank 0 issues
    r0 = dump([site_entry(1, 10, "step"), site_entry(2, 10, "step"),
               site_entry(3, 10, "step", retired=False)])
    r1 = dump([site_entry(1, 10, "step"), site_entry(2, 10, "step")])
    assert [f.kind for f in ddpviz.postmortem([r0, r1]).findings] == ["rank_hang"]
    # from a line rank 1 never reaches: rank 0's collective is its own as well
    r0["entries"][2] = site_entry(3, 30, "save_checkpoint", op="barrier", retired=False)
    found = ddpviz.postmortem([r0, r1]).findings
    assert [f.kind for f in found] == ["rank_hang", "collective_mismatch"]
    extra = found[1]
    assert extra.field == "extra" and extra.ranks == (0,)
    assert extra.title == ("rank 0 launched the job's barrier at /home/me/train.py:30 in "
                           "save_checkpoint (collective #3), which "
                           "rank 1 never launched")
    assert found[0].ranks == (1,) and "at /home/me/train.py:30 in save_checkpoint" in \
        found[0].title


def test_without_stacks_nobody_is_blamed_for_a_call_site() -> None:
    # the JSON form has no frames: the same dumps say only what the sequence ids say
    r0 = dump([entry(1), entry(2), entry(3, op="barrier", retired=False)])
    r1 = dump([entry(1), entry(2)])
    for d in (r0, r1):
        for e in d["entries"]:
            del e["frames"]
    pm = ddpviz.postmortem([r0, r1])
    assert [f.kind for f in pm.findings] == ["rank_hang"]
    assert pm.job_collectives() == []  # without a model and stacks nobody can tell
    assert {r["origin"] for r in pm.to_records()} == {""}


def test_long_strings_from_a_dump_keep_findings_within_bounds(tmp_path: Path) -> None:
    # a dump's strings are untrusted: 4,000-character paths and names, 4,096 tensors; the
    # findings still fit the trace format's bounds and the trace loads back
    long_file = "/x" * 2000 + "/train.py"
    r0 = dump([site_entry(1, 10, "f" * 4000, op="all_gather", retired=False)])
    r0["entries"][0]["frames"][1]["filename"] = long_file
    r0["entries"][0]["input_sizes"] = [[1] * 64] * 4096
    r0["entries"][0]["input_dtypes"] = ["Float"] * 4096
    r1 = dump([site_entry(1, 20, "g" * 4000, retired=False)])
    pm = ddpviz.postmortem([r0, r1])
    f = next(f for f in pm.findings if f.kind == "collective_mismatch")
    assert all(len(v) <= MAX_NAME for v, _ in f.values)
    assert any(v.endswith("(4,096 tensors) float32 at ..." + long_file[-(MAX_PATH - 3):]
                          + ":10 in " + "f" * (MAX_FUNC - 3) + "...") for v, _ in f.values)
    pm.to_trace().save(tmp_path / "pm.ddpviz")
    loaded = [e.finding for e in ddpviz.Trace.load(tmp_path / "pm.ddpviz").events()
              if isinstance(e, FindingReported)]
    assert f in loaded
