"""The dashboard's numbers from the events of real 2-rank gloo runs of ddpviz's DDP (through
ddpviz.launch): the bucket maps observed equal torch's own DDP's on the same model, teaching
mode really spaces the events out, and a shape planted on rank 1 shows up in that cell of the
verification matrix."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import analyse
from tests.model.test_observed_plan import observed
from tests.model.test_verification_matrix import grouped_values, matrix_of, row
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
    assert d.events_sent == len(r.trace)  # the whole run went to the browser
    d.close()
    model = EventModel()
    model.feed(r.trace)
    obs = observed(model)
    assert obs is not None and obs.rebuilt_step == 1
    for torch_facts in values:  # every rank's torch DDP agrees with what the events show
        assert [b.nbytes for b in obs.plan.initial] == torch_facts["bucket_sizes"]
        assert obs.plan.bucket_indices("rebuilt") == torch_facts["rebuilt_map"]
    maps = {r: [(m.event.rebuilt, m.event.buckets) for m in lst]  # type: ignore[attr-defined]
            for r, lst in model.maps().items()}
    assert maps[0] == maps[1]  # the ranks agree on the maps
    assert matrix_of(model).state == "passed"
    assert all(s.broadcast_finished is not None for s in model.construction().values())
    step = model.steps[-1]
    view = analyse(step, model.step_records(step), 6)
    assert step == rank_fns.STEPS - 1
    for rank, lane in view.lanes.items():  # hook order: the engine's GradReady order
        fired = [e.param for e in r.trace.events(rank)
                 if isinstance(e, ev.GradReady) and e.step == view.step]
        assert list(lane.order) == fired == [5, 4, 3, 2, 1, 0]
        assert len(lane.allreduce) == len(obs.plan.rebuilt or ())


def test_a_shape_planted_on_rank_1_is_that_cell() -> None:
    with ddpviz.listen(show=False) as session:
        r = ddpviz.launch(rank_fns.rank_1_builds_another_head, 2, session=session, timeout=120)
        with pytest.raises(ddpviz.RankError):
            r.wait()
        m = matrix_of(list(session.trace))
    assert m.state == "failed"
    assert row(m, "4.weight").cell(0) == "same" and row(m, "4.weight").cell(1) == "differs"
    assert row(m, "4.bias").cell(1) == "differs" and row(m, "0.weight").cell(1) == "same"
    shown = dict((ranks, text.split(" dtype")[0]) for ranks, text in
                 grouped_values(row(m, "4.weight")))
    assert shown == {"rank 0": "index=4 shape=(1, 16)", "rank 1": "index=4 shape=(3, 16)"}
