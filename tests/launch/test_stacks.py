"""Reading a rank's faulthandler dump: the launcher's own threads and frames are dropped, the
main thread comes first, frames read like a traceback (most recent call last), formatted as the
pulse thread's stacks are (probes/stack_text.py): torch's and the standard library's runs
folded, bounded."""

from __future__ import annotations

import linecache
import os
import threading

import torch

from ddpviz.launcher.stacks import format_stack, parse
from ddpviz.probes import stack_text

DUMP = '''Thread 0x00007f22d613e6c0 (most recent call first):
  File "/x/ddpviz/launcher/channel.py", line 43 in _read_exactly
  File "/x/ddpviz/launcher/rank.py", line 62 in pump
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f22d613e6c1 (most recent call first):
  File "/data/loader.py", line 9 in fetch
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f22f59d5b80 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "<notebook cell 4>", line 2 in train_step
  File "/x/ddpviz/launcher/rank.py", line 100 in _serve_call
  File "<frozen runpy>", line 88 in _run_code
'''


def test_parse_keeps_user_threads_main_first_outermost_frame_first() -> None:
    assert parse(DUMP) == [
        [("<notebook cell 4>", 2, "train_step"),
         ("/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce")],
        [("/data/loader.py", 9, "fetch")],
    ]


def test_format_stack_adds_source_lines_the_kernel_knows() -> None:
    source = "x = 1\ndist.all_reduce(t)  # waits\n"
    linecache.cache["<notebook cell 4>"] = (len(source), None, source.splitlines(True),
                                            "<notebook cell 4>")
    lines = format_stack(2, parse(DUMP))
    assert lines[:2] == [
        "[rank 2] Stack (most recent call last):",
        "[rank 2]   <notebook cell 4>:2 in train_step: dist.all_reduce(t)  # waits",
    ]
    assert "[rank 2] Another thread (most recent call last):" in lines


def test_a_rank_with_only_launcher_frames_says_so() -> None:
    assert format_stack(0, parse(DUMP.split("\n\n")[0])) == [
        "[rank 0] (no Python frames outside ddpviz: starting up, or exiting)"]


def test_torch_and_stdlib_frames_fold_into_one_line_each_and_the_stack_is_bounded() -> None:
    c10d = os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py")
    frames = [("<notebook cell 9>", 2, "train_step"), (c10d, 3252, "all_reduce"),
              (c10d, 80, "wrapper"), (threading.__file__, 320, "wait")]
    assert format_stack(1, [frames]) == [
        "[rank 1] Stack (most recent call last):",
        "[rank 1]   <notebook cell 9>:2 in train_step",
        "[rank 1]   ... 3 frames in stdlib, torch/distributed (innermost: wait)",
    ]
    deep = [("<notebook cell 9>", n, f"f{n}") for n in range(1, 41)]
    lines = format_stack(1, [deep])
    assert len(lines) == 1 + stack_text.MAX_SHOWN
    assert lines[-1] == "[rank 1]   <notebook cell 9>:40 in f40"  # the innermost kept
