"""A Dashboard of a 256-rank run: the run goes to the browser once, as its `.ddpviz` bytes and
the front end beside them, nothing else of size (no plotly, no markup: the TS front end draws
every panel; the kernel-drawn dashboard sent up to 6 MB of it), and the numbers its panels
show read at that scale: the hook timeline's distribution names the planted slow rank first,
the verification matrix is one group of ranks (tests/model/test_verification_matrix.py has the
failing case), the broadcast the sender and the receivers (tests/model/
test_broadcast_state.py)."""

from __future__ import annotations

from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import analyse
from ddpviz.model.hook_spread import iteration_spread
from ddpviz.widgets import Dashboard
from tests.widgets.streams import Plant, synthetic_run
from tests.widgets.wire import WireCounter


def test_a_256_rank_dashboard_sends_the_run_once_and_nothing_else_of_size() -> None:
    events = synthetic_run(256, 40, 3, plant=Plant(slow={100: 400}))
    with WireCounter() as wire:
        d = Dashboard(events)
    try:
        assert d.events_sent == len(events)
        assert sum(size > 100_000 for size in wire.largest(5)) == 1  # one message: the run
        assert wire.total - len(d.trace) <= 250_000  # (the front end: ~100 KB)
    finally:
        d.close()
    model = EventModel()
    model.feed(events)
    step = model.steps[-1]
    spread = iteration_spread(analyse(step, model.step_records(step), 40))
    assert spread.n_ranks == 256 and spread.slowest[0].rank == 100
