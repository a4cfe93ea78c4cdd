"""Loading stays linear in a frame of many ranks or many distinct strings (issue #37, M1 and M2):
the columns took each rank's events of a block with a pass over all the block's rare events
(1,500 ranks' EventsDropped, 86 KB: 7 s; a 1,024-rank session's start-up, 0.59 MiB: 23 s), and
the frame reader made a pass over a window per distinct dtype string (100,000 distinct in one
frame, 8.6 MiB: 12 s). Each file here, sized so that the quadratic code takes minutes, loads in
a child process under a memory and a time cap, to what msgspec's decoder loads from it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ddpviz import events as ev
from ddpviz.events import Event
from ddpviz.traces.fileformat import TraceWriter

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 2 << 30
TIME_CAP_S = 120  # each loads in seconds on a loaded machine; the quadratic code took minutes

# Loads the file through the columns (framecolumns.py) and again through msgspec alone, and
# says whether they agree (events, and each rank's interned strings in order).
CHILD = r"""
import json, sys
from ddpviz.traces import fileformat
from ddpviz.traces.trace import Trace
columns = Trace.load(sys.argv[1])
tables = columns.columns()
decode = fileformat.decode_frames
fileformat.decode_frames = lambda buf, frames, *a: [None] * len(frames)
objects = Trace.load(sys.argv[1])
fileformat.decode_frames = decode
strings = {r: t.strings for r, t in objects.columns().items()}
print(json.dumps({"events": len(columns), "ranks": len(tables), "equal": columns == objects,
                  "strings": all(t.strings == strings[r] for r, t in tables.items())}))
"""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def events_dropped(ranks: int) -> list[Event]:
    """Every rank reports dropped events, all in one frame (the issue's 1,500 and 5,000)."""
    return [ev.EventsDropped(r, 0, 1_000 + r, 0, 5) for r in range(ranks)]


def startup(ranks: int) -> list[Event]:
    """The constructor's 7 rare events of each rank (a small model), in the order a session's
    recording writes them: step by step, every rank's (the issue's 1,024 ranks: 0.69 MB)."""
    infos = tuple(ev.ParamInfo(i, f"p{i}", (4,), "float32", "cpu", False) for i in range(2))
    per_rank = [[ev.ParamsBuilt(r, -1, 1_000, 0, infos, (), ()),
                 ev.VerificationStarted(r, -1, 2_000, 1, ranks, 2, 0),
                 ev.VerificationPassed(r, -1, 3_000, 2, ranks, "digest"),
                 ev.BroadcastStarted(r, -1, 4_000, 3, 0, 2, 32, 1),
                 ev.BroadcastChunkDone(r, -1, 5_000, 4, 0, 32),
                 ev.BroadcastFinished(r, -1, 6_000, 5, 32, 0.001),
                 ev.BucketAssigned(r, -1, 7_000, 6, ((1, 0),), (1 << 20,), False)]
                for r in range(ranks)]
    return [events[i] for i in range(7) for events in per_rank]


def distinct_dtypes(n: int, ranks: int = 1_024) -> list[Event]:
    """n all-reduces, each with its own dtype string, over `ranks` ranks (the issue's 100,000
    on one rank: 8.6 MiB)."""
    return [ev.AllReduceLaunched(i % ranks, 0, 1_000 + i, i // ranks, 0, 4, f"d{i}")
            for i in range(n)]


CASES = {  # (events, ranks): before the fix each took minutes to load
    "20,000 ranks' EventsDropped": (lambda: events_dropped(20_000), 20_000),
    "4,096 ranks' start-up": (lambda: startup(4_096), 4_096),
    "400,000 distinct dtypes": (lambda: distinct_dtypes(400_000), 1_024),
}


@pytest.mark.timeout(TIME_CAP_S + 60)
@pytest.mark.parametrize("case", list(CASES))
def test_one_frame_of_many_ranks_or_strings_loads_in_linear_time(tmp_path: Path,
                                                                 case: str) -> None:
    make, ranks = CASES[case]
    events = make()
    path = tmp_path / "one-frame.ddpviz"
    with TraceWriter(path, chunk=len(events)) as w:  # one frame: one block for the columns
        w.write_many(events)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          preexec_fn=_cap_memory, capture_output=True, text=True,
                          timeout=TIME_CAP_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == {"events": len(events), "ranks": ranks, "equal": True, "strings": True}
