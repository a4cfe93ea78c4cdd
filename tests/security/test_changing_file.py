"""A trace file that shrinks or is rewritten while `Trace.load` reads it (a new `ddpviz record`
truncating a file being opened, a file on NFS rewritten by another node) gives a TraceError or
a consistent prefix of its events, never a crash. The load runs in a child process, so a
SIGBUS (what a mapped file does when it shrinks under the parse) shows as a signal exit. The
file is truncated for real, by another process, at a deterministic moment: when the loader
decodes its second event frame (a wrapper around `tracefile.decode_frames`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, subprocess, sys
from ddpviz import events as ev
from ddpviz.traces import fileformat as tracefile
from ddpviz.traces.trace import Trace, TraceError
from ddpviz.traces.fileformat import TraceWriter

path, how = sys.argv[1], sys.argv[2]
events = [ev.GradReady(0, s // 100, 10**9 + s, s, s % 100, 0) for s in range(20_000)]
with TraceWriter(path, chunk=1000) as w:  # 20 event frames
    w.write_many(events)
size = os.path.getsize(path)
tracefile.WHOLE_BELOW = 0  # read from the file as it goes, as files of 64 MiB and more are
tracefile.WINDOW = 0  # and frame by frame (not a window of many frames at once)
calls = 0
decode = tracefile.decode_frames

def truncating(*args):
    global calls
    calls += 1
    if calls == 2:  # another process changes the file under the load
        code = {"shrink": f"os.truncate({path!r}, {size // 3})",
                "empty": f"os.truncate({path!r}, 0)",
                "rewrite": f"open({path!r}, 'r+b').write(b'x' * {size})",
                "rewrite-shorter": f"f = open({path!r}, 'wb'); f.write(b'x' * {size // 2})"}[how]
        subprocess.run([sys.executable, "-c", "import os; " + code], check=True)
    return decode(*args)

tracefile.decode_frames = truncating
try:
    loaded = Trace.load(path)
except TraceError as e:
    print(json.dumps(["TraceError", str(e)]))
else:
    got = loaded.events(0)
    print(json.dumps(["loaded", len(got), got == events[:len(got)]]))
"""


@pytest.mark.parametrize("how", ["shrink", "empty", "rewrite", "rewrite-shorter"])
def test_a_file_changing_under_the_load_is_a_trace_error_or_a_prefix(
        tmp_path: Path, how: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "t.ddpviz"), how],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])  # < 0: killed by a signal
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    if outcome[0] == "TraceError":
        assert outcome[1].startswith("ddpviz: ")
        if how in ("shrink", "empty", "rewrite-shorter"):
            assert "changed while it was being read" in outcome[1]
        else:  # garbage in place of frames: a bad checksum, or a length past the end
            assert "is corrupt" in outcome[1] or "the rest of the file cannot be read" in \
                outcome[1], outcome[1]
    else:
        assert outcome[0] == "loaded" and outcome[2], outcome  # a prefix of what was written
