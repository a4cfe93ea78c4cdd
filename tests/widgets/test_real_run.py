"""Widgets from the events of real 2-rank gloo runs of ddpviz's DDP (through ddpviz.launch):
the bucket maps they show equal torch's own DDP's on the same model, teaching mode really
spaces the events out, and a shape planted on rank 1 shows up in that cell."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.widgets import Dashboard, VerificationView
from tests.widgets import rank_fns

pytestmark = pytest.mark.dist

SLOW = 0.02  # seconds after each event: ~50 events per rank, ~1 s


@pytest.fixture(scope="module")
def run() -> Any:
    r = ddpviz.launch(rank_fns.torch_then_ddpviz, 2, slow_motion=SLOW, timeout=120)
    values = r.wait()
    return r, values


def test_slow_motion_spaces_every_ranks_events_by_at_least_its_pause(run: Any) -> None:
    r, _ = run
    for rank in (0, 1):
        events = r.trace.events(rank)
        assert len(events) > 40
        gaps = [b.t_ns - a.t_ns for a, b in pairwise(events)]
        assert min(gaps) >= SLOW * 1e9


def test_the_dashboard_shows_the_buckets_torchs_ddp_built(run: Any) -> None:
    r, values = run
    d = r.dashboard()
    assert d.source.kind == "run" and "run finished" in d.status_html.value
    obs = d.buckets.observed
    assert obs is not None and obs.rebuilt_step == 1
    for torch_facts in values:  # every rank's torch DDP agrees with what the events show
        assert [b.nbytes for b in obs.plan.initial] == torch_facts["bucket_sizes"]
        assert obs.plan.bucket_indices("rebuilt") == torch_facts["rebuilt_map"]
    assert obs.disagreements == ()
    assert d.verification.matrix.state == "passed"
    assert {p.state for p in d.broadcast.progress.values()} == {"done"}
    view = d.timeline.view
    assert view is not None and view.step == rank_fns.STEPS - 1
    for rank, lane in view.lanes.items():  # hook order: the engine's GradReady order
        fired = [e.param for e in r.trace.events(rank)
                 if isinstance(e, ev.GradReady) and e.step == view.step]
        assert list(lane.order) == fired == [5, 4, 3, 2, 1, 0]
        assert len(lane.allreduce) == len(obs.plan.rebuilt or ())
    d.close()


def test_a_shape_planted_on_rank_1_is_that_cell() -> None:
    with ddpviz.listen(show=False) as session:
        r = ddpviz.launch(rank_fns.rank_1_builds_another_head, 2, session=session, timeout=120)
        with pytest.raises(ddpviz.RankError):
            r.wait()
        v = VerificationView(session.trace)
    assert v.matrix.state == "failed"
    assert v.cell("4.weight", 0) == "same" and v.cell("4.weight", 1) == "differs"
    assert v.cell("4.bias", 1) == "differs" and v.cell("0.weight", 1) == "same"
    v.select("4.weight", rank=1)
    assert "rank 0: index=4 <span style='color:#b42318;font-weight:bold'>shape=(1, 16)" \
        in v.details_html.value
    assert "▶ rank 1: index=4 <span style='color:#b42318;font-weight:bold'>shape=(3, 16)" \
        in v.details_html.value
    assert Dashboard(session.trace).verification.matrix == v.matrix
