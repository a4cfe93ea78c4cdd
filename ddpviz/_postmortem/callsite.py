"""Where a recorded collective came from, read from the Python stack a Flight Recorder entry
carries (the pickle form has one per entry; the JSON form has none): the user's call site, the
first frame outside torch, ddpviz and the standard library, folded by the rules of
probes/stack_text.py (a framework in site-packages counts as the user's: it runs the loop), and
whether DDP launched the collective (its constructor, forward or reducer) or the job did.

A dump is often read on another machine than the one that wrote it, so torch, ddpviz and the
standard library are also recognized by their install paths there (`.../site-packages/torch/`,
`.../lib/python3.11/`), not only by this machine's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from itertools import pairwise
from typing import Literal

from ddpviz.probes.stack_text import Frame, clip, owner, where

MAX_PATH = 160  # characters of a call site's file shown
MAX_FUNC = 100  # characters of its function's name

Origin = Literal["ddp", "job", ""]  # "": the entry has no stack, so nobody can tell

_PACKAGES = ("site-packages", "dist-packages")
# torch's folders that appear on a collective's stack, for a torch run from a source tree
# elsewhere (no site-packages in its path)
_TORCH_TOP = frozenset({"distributed", "nn", "autograd", "_tensor.py", "utils", "optim",
                        "amp", "cuda", "_dynamo", "_functorch", "_compile.py", "_ops.py"})
_STDLIB = re.compile(r"^python\d+(\.\d+)?$")
# DDP's own launches: its module (constructor, forward, buffer sync, rebuild) and its comm hooks
_DDP_FILES = ("nn/parallel/distributed.py", "distributed/algorithms/ddp_comm_hooks/")


@lru_cache(maxsize=1024)  # a dump names few files, each on thousands of entries
def torch_path(file: str) -> str | None:
    """The path of a file inside torch ("distributed/distributed_c10d.py"), or None when the
    file is not torch's (here or on the machine that wrote the dump)."""
    parts = file.replace("\\", "/").split("/")
    here = (owner(file) or "").startswith("torch")  # this machine's torch, wherever it is
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "torch" and (here or parts[i + 1] in _TORCH_TOP
                                    or (i > 0 and parts[i - 1] in _PACKAGES)):
            return "/".join(parts[i + 1:])
    return None


@lru_cache(maxsize=1024)
def frame_owner(file: str) -> str | None:
    """Whose plumbing a frame is ("torch/distributed", "ddpviz", "stdlib"), or None for the
    user's code: stack_text's rules on this machine, then install paths of another machine."""
    mine = owner(file)
    if mine is not None:
        return mine
    inside = torch_path(file)
    if inside is not None:
        top = inside.split("/")[0]
        return "torch/" + top if "/" in inside else "torch"
    parts = file.replace("\\", "/").split("/")
    packages = [i for i, p in enumerate(parts[:-1]) if p in _PACKAGES]
    if packages:  # a framework's frames count as the user's: it runs the loop
        return "ddpviz" if parts[packages[-1] + 1] == "ddpviz" else None
    if any(p == "lib" and _STDLIB.match(q) for p, q in pairwise(parts)):
        return "stdlib"
    return None


def call_site(frames: Sequence[Frame]) -> Frame | None:
    """The user's frame nearest the collective (frames innermost first); None when the stack
    holds no frame of the user's (empty, or torch's and the standard library's only)."""
    return next((f for f in frames if frame_owner(f.file) is None), None)


def origin(frames: Sequence[Frame]) -> Origin:
    """"ddp" when DDP launched the collective: a frame of its module or comm hooks is on the
    stack, or the innermost Python frame is autograd's (the reducer launches its all-reduces
    from C++ inside backward, so no Python collective call is on the stack); "job" for any
    other Python stack; "" without one."""
    if not frames:
        return ""
    inner = torch_path(frames[0].file)
    if inner is not None and inner.startswith("autograd/"):
        return "ddp"
    for f in frames:
        inside = torch_path(f.file)
        if inside is not None and inside.startswith(_DDP_FILES):
            return "ddp"
    return "job"


def site_text(site: Frame) -> str:
    """'train.py:54 in save_checkpoint' (a path under the current folder relative to it;
    a long path keeps its end, a long function name its start: a dump's strings are
    untrusted and may be 4,096 characters each)."""
    tail = f":{site.line} in "
    path = where(Frame(site.file, site.line, ""))[:-len(tail)]
    if len(path) > MAX_PATH:
        path = "..." + path[-(MAX_PATH - 3):]
    return f"{path}{tail}{clip(site.func, MAX_FUNC)}"
