"""diagnose() of a run still going (See [Note: a run still going], _diagnose/diagnosis.py): the
same events judged live and once over. A live view (the TraceView following a Run, every few
seconds) reads events that stop mid-step, at a different step on each rank; judged as a run
that is over, a healthy run read that way has a rank "stopped" one step behind and "still
waiting in a collective"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.findings import Finding
from ddpviz.traces.fileformat import End
from ddpviz.traces.source import open_run
from ddpviz.traces.trace import Trace
from tests.diagnose.test_diagnose import clean_run


class LiveSession:
    """A live Session's shape (traces/source.py's LiveSession) over a Trace built by hand."""

    def __init__(self, trace: Trace, ended: dict[int, End] | None = None) -> None:
        self.trace = trace
        self.closed = False
        self.collector = type("Collector", (), {"ended": ended})()

    def subscribe(self, callback: Callable[[Any], None], *, batch: bool = False,
                  replay: bool = False, history: Callable[[Trace], None] | None = None
                  ) -> Callable[[], None]:
        return lambda: None


def mid_step() -> list[ev.Event]:
    """A healthy 2-rank run read in flight: steps 0-2 done on both ranks, rank 0 already
    inside step 3's all-reduce (rank 1's step 3 not yet in)."""
    run = clean_run(steps=3)
    run.iteration(0, 3, finish=False)
    return run.events


def _kinds(findings: list[Finding]) -> set[str]:
    return {f.kind for f in findings}


def test_a_run_still_going_is_judged_on_the_steps_every_rank_finished() -> None:
    session = LiveSession(Trace(mid_step()))
    assert open_run(session).running
    live = diagnose(session)
    assert not {"uneven_iterations", "rank_hang"} & _kinds(live), live
    session.closed = True  # the same events, the run over: rank 1 stopped a step short
    over = diagnose(session)
    assert {"uneven_iterations", "rank_hang"} <= _kinds(over), over


def test_a_run_still_going_keeps_the_ranks_live_findings_of_any_step() -> None:
    events = mid_step()
    said = Finding(kind="rank_hang", severity="error", title="rank 1 did not reach step 3",
                   ranks=(1,), field="collective", step=3, world_size=2)
    events.append(ev.FindingReported(0, 3, 0, 999, said))  # at the step not finished by all
    events.append(ev.EventsDropped(0, 3, 0, 1000, 7))
    found = diagnose(LiveSession(Trace(events)))
    assert said in found
    assert any(f.kind == "events_dropped" for f in found), found


def test_a_session_whose_ranks_all_ended_is_judged_as_over() -> None:
    """A followed folder whose job ended: every rank's trace has its end record, so how the
    ranks ended is judged although the session is still open."""
    ends = {r: End(r, 0, 0, "") for r in (0, 1)}
    session = LiveSession(Trace(mid_step()), ended=ends)
    assert "uneven_iterations" in _kinds(diagnose(session))
