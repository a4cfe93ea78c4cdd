"""Dashboard bombs within the limits (issue #23): each field in range, but a view sized its
work by the product of two (a ChunkState per declared chunk per rank, a verification cell per
row per rank, an unused-parameter index per parameter per rank). Each opens in the dashboard,
and its model and verification matrix are built, in a child process under a 2 GiB
address-space cap (~0.7 GB is the interpreter with torch, plotly and ipywidgets) and a time
cap, and shows what the file says. (The panels are drawn in the browser: the broadcast's
declared chunks as a count is tests/model/test_broadcast_state.py.)"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import (
    MAX_DEPARTURES_LISTED,
    MAX_UNUSED_LISTED,
    IterationView,
    analyse,
)
from ddpviz.model.verification_matrix import build_matrix
from ddpviz.traces.trace import Trace
from tests.security.bombs import (
    broadcast_chunks,
    long_reference_order,
    unused_params,
    verification_world,
    write,
)

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 2 << 30
TIME_CAP_S = 300  # each opens in seconds on an idle machine

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from ddpviz.traces.trace import Trace
from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import analyse
from ddpviz.model.verification_matrix import build_matrix
trace = Trace.load(sys.argv[1])
d = trace.dashboard()
model = EventModel()
model.feed(trace)
states = model.construction()
matrix = build_matrix(states, model.world_size)
n_params = max((len(s.params.event.params) for s in states.values() if s.params), default=0)
for step in model.steps:
    analyse(step, model.step_records(step), n_params)
print(json.dumps({"chunks": sum(len(s.chunks_sent) for s in states.values()),
                  "verdict": matrix.verdict, "findings": len(d.findings)}))
"""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@pytest.mark.timeout(TIME_CAP_S + 60)
@pytest.mark.parametrize("make", [broadcast_chunks, verification_world, unused_params,
                                  long_reference_order],
                         ids=["chunks", "verification", "unused", "order"])
def test_the_dashboard_opens_a_product_bomb_within_the_caps(tmp_path: Path, make: object
                                                            ) -> None:
    path = write(tmp_path / "bomb.ddpviz", make())  # type: ignore[operator]
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          preexec_fn=_cap_memory, capture_output=True, text=True,
                          timeout=TIME_CAP_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout.strip().splitlines()[-1])
    if make is broadcast_chunks:
        assert shown["chunks"] == 0  # 65,536 chunks declared per rank, none held
    elif make is verification_world:
        assert shown["verdict"].startswith("✘ the model differs across 131072 ranks: "
                                           "parameter 0 'p0' shape differs; 299 more rows")


def test_the_verification_matrix_keeps_the_cells_the_file_names(tmp_path: Path) -> None:
    model = EventModel()
    model.feed(Trace.load(write(tmp_path / "v.ddpviz", verification_world(30))))
    m = build_matrix(model.construction(), model.world_size)
    assert len(m.ranks) == 1 << 17 and len(m.rows) == 30 and m.state == "failed"
    row = m.rows[0]
    assert len(row.known) == 2 and row.counts == {"same": 1, "differs": 1,
                                                   "pending": (1 << 17) - 2}
    assert row.cell(0) == "same" and row.cell(1) == "differs"
    assert row.cell(100_000) == "pending" and row.ranks_with("differs") == [1]
    # three groups on every row: rank 0, rank 1, and the 131,070 ranks not heard from
    for x in m.rows:
        assert x.ranks_with("same") == [0] and x.ranks_with("differs") == [1]
        assert x.counts["pending"] == (1 << 17) - 2


def test_unused_parameters_are_listed_up_to_a_bound_and_counted(tmp_path: Path) -> None:
    view = _iteration(write(tmp_path / "u.ddpviz", unused_params(5_000, 20)), 5_000)
    lane = view.lanes[7]
    assert lane.n_unused == 4_999 and len(lane.unused) == MAX_UNUSED_LISTED
    assert lane.unused == tuple(i for i in range(MAX_UNUSED_LISTED + 1) if i != 7)


def test_order_departures_are_listed_up_to_a_bound_and_counted(tmp_path: Path) -> None:
    view = _iteration(write(tmp_path / "o.ddpviz", long_reference_order(2_000, 5)), 2_000)
    order = view.order
    assert order.reference == tuple(range(2_000)) and order.reference_ranks == (0,)
    assert order.positions[0] == () and order.departures[0] == 0
    # rank 3 fired p3 first where the reference fires p0, then nothing: 2,000 departures
    assert order.departures[3] == 2_000
    assert order.positions[3] == tuple(range(MAX_DEPARTURES_LISTED))


def _iteration(path: Path, n_params: int) -> IterationView:
    return analyse(0, Trace.load(path).model().step_records(0), n_params)
