"""Dashboard bombs within the limits (issue #23): each field in range, but a widget sized its
work by the product of two (a ChunkState per declared chunk per rank, a verification cell per
row per rank, an unused-parameter index per parameter per rank). Each opens in a child process
under a 2 GiB address-space cap (~0.7 GB is the interpreter with torch, plotly and ipywidgets)
and a time cap, and shows what the file says."""

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
from ddpviz.traces.trace import Trace
from ddpviz.widgets import BroadcastProgress, VerificationView
from ddpviz.widgets.source import feed_model
from ddpviz.widgets.verification_view import MAX_COLUMNS
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
d = Trace.load(sys.argv[1]).dashboard()
for s in d.model.steps:
    d.controls.show_step(s) if d.controls else None
print(json.dumps({"broadcast": d.broadcast.chunks_html.value,
                  "matrix": d.verification.matrix_html.value,
                  "verdict": d.verification.matrix.verdict}))
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
        assert "… chunks 3-65532: the same state on every rank" in shown["broadcast"]
    elif make is verification_world:
        assert shown["verdict"].startswith("✘ the model differs across 131072 ranks: "
                                           "parameter 0 'p0' shape differs; 299 more rows")


def test_broadcast_chunks_are_a_count_and_the_chunks_with_events(tmp_path: Path) -> None:
    b = BroadcastProgress(Trace.load(write(tmp_path / "b.ddpviz", broadcast_chunks(40))))
    assert b.grouped and len(b.progress) == 40
    p = b.progress[3]
    assert p.n_chunks == p.extent == 65_536 and p.chunks == {} and p.chunks_done == 0
    assert b.shown_chunks() == [0, 1, 2, 65_533, 65_534, 65_535]
    assert "0/65536 chunks" in b.group_labels[0].value


def test_the_verification_matrix_keeps_the_cells_the_file_names(tmp_path: Path) -> None:
    v = VerificationView(Trace.load(write(tmp_path / "v.ddpviz", verification_world(30))))
    m = v.matrix
    assert len(m.ranks) == 1 << 17 and len(m.rows) == 30 and m.state == "failed"
    row = m.rows[0]
    assert len(row.known) == 2 and row.counts == {"same": 1, "differs": 1,
                                                   "pending": (1 << 17) - 2}
    assert v.cell("p0", 0) == "same" and v.cell("p0", 1) == "differs"
    assert v.cell("p0", 100_000) == "pending" and row.ranks_with("differs") == [1]
    # grouped: rank 0, rank 1, and the 131,070 ranks not heard from
    assert v.columns() == [(0,), (1,), tuple(range(2, 1 << 17))]
    v.group_checkbox.value = False  # one column per rank: the first MAX_COLUMNS drawn
    assert v.matrix_html.value.count("<th") == 2 + MAX_COLUMNS
    assert f"… and {(1 << 17) - MAX_COLUMNS:,} more columns" in v.matrix_html.value
    assert len(v.rank_select.options) <= 1 + 1024
    v.select("p0", rank=100_000)  # a rank beyond the listed ones can still be picked
    assert v.rank_select.value == 100_000


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
    model = EventModel()
    feed_model(Trace.load(path), model, lambda: None)
    return analyse(0, model.step_records(0), n_params)
