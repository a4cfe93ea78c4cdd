"""The view's replay (extension/src/replay.ts) reads a run at an instant as Python's EventModel
does at the same `as_of` (ddpviz/model/event_model.py, whose `as_of` the kernel-drawn
dashboard's sliders drove): each rank's phase and iteration (`status(as_of)`), the iteration
going on (`step_at`), each iteration's end (`step_bounds`), and, from the model of the events up
to the instant (replay.ts `modelAt`), broadcast progress, verification and the bucket maps in
force (`construction(as_of)`, `maps(as_of)`). On a real 2-rank gloo run, at instants over its
whole span, each iteration's end, and while a broadcast chunk was in flight; run in node."""

from __future__ import annotations

import base64
from typing import Any

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.traces.trace import Trace
from tests.browser import rank_fns
from tests.extension.mirror import run_typescript

pytestmark = [pytest.mark.dist]

TICKS = 1000  # replay.TIME_TICKS, replay_controls.TIME_TICKS

# per instant: what replay.ts says of the run then
OUT = """(() => {
  const trace = load('./trace');
  const em = load('./eventModel');
  const full = new em.TraceModel(trace.parseTrace(trace.base64ToBytes(cases.file), 'run'));
  const index = g.indexOf(full);
  const bounds = {};
  for (const [s, b] of index.bounds) bounds[s] = b;
  const at = cases.instants.map(t => {
    const m = g.modelAt(full, t);
    const { phases, steps } = g.phasesAt(full, t);
    const ranks = {};
    for (const r of full.ranks) {
      const b = m.broadcast.find(x => x.rank === r);
      ranks[r] = {
        phase: phases.get(r), step: steps.get(r), events: m.events(r).length,
        broadcast: b === undefined ? null : [b.chunksDone, b.nChunks, b.seconds !== null],
        verification: (m.verification.find(x => x.rank === r) || { status: 'absent' }).status,
        maps: m.bucketMaps.filter(x => x.ranks.includes(r)).length
      };
    }
    return { stepAt: index.stepAt(t), ranks };
  });
  const ticks = cases.ticks.map(k => index.timeOf(k));
  return { t0: index.t0, t1: index.t1, steps: index.steps, bounds, at, ticks };
})()"""


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, bytes]:
    """3 SGD steps of a small MLP under ddpviz's DDP on 2 gloo ranks, saved: the trace loaded
    and the file's bytes."""
    run = ddpviz.launch(rank_fns.train, 2, args=(3, 0.01), timeout=120)
    run.wait(timeout=150)
    path = tmp_path_factory.mktemp("replay") / "run.ddpviz"
    run.trace.save(path)
    return Trace.load(path), path.read_bytes()


def python_at(model: EventModel, trace: Trace, t: int) -> dict[str, Any]:
    """What EventModel says at `as_of` = t, in replay.ts's terms."""
    status = model.status(t)
    cons = model.construction(t)
    maps = model.maps(t)
    ranks: dict[str, Any] = {}
    for r in trace.ranks:
        s = cons[r]
        off = trace.clock.get(r, (0, 0))[0]
        broadcast = None
        if s.broadcast_started is not None:
            n = s.broadcast_started.event.n_chunks  # type: ignore[attr-defined]
            done = s.broadcast_finished is not None
            broadcast = [n if done else len(s.chunks_done), n, done]
        verification = "absent"
        if s.verify_result is not None:
            verification = ("passed" if isinstance(s.verify_result.event, ev.VerificationPassed)
                            else "failed")
        elif s.verify_started is not None:
            verification = "running"
        ranks[str(r)] = {
            "phase": status.phases[r], "step": status.steps[r],
            "events": sum(1 for e in trace.events() if e.rank == r and e.t_ns + off <= t),
            "broadcast": broadcast, "verification": verification, "maps": len(maps[r])}
    return {"stepAt": model.step_at(t), "ranks": ranks}


def test_replay_reads_each_instant_as_the_event_model(run_file: tuple[Trace, bytes]) -> None:
    trace, data = run_file
    model = EventModel(trace.clock)
    for table in trace.columns().values():
        model.feed_table(table)
    span = model.time_range()
    assert span is not None
    off = {r: trace.clock.get(r, (0, 0))[0] for r in trace.ranks}
    # a broadcast chunk in flight: sent (by the source), its ChunkDone on some rank later
    sent = [e for e in trace.events() if isinstance(e, ev.BroadcastChunkSent)]
    done = [e for e in trace.events() if isinstance(e, ev.BroadcastChunkDone)]
    assert sent and done, "the run broadcast its state in chunks"
    in_flight = [e.t_ns + off[e.rank] for e in sent]
    assert any(d.t_ns + off[d.rank] > t for d in done for t in in_flight)
    ends = [b[1] for s in [-1, *model.steps] if (b := model.step_bounds(s)) is not None]
    backward = [e.t_ns + off[e.rank] for e in trace.events()
                if isinstance(e, ev.BackwardStarted | ev.AllReduceDone)]
    construction = sorted(e.t_ns + off[e.rank] for e in trace.events() if e.step < 0)
    ticks = [0, 1, 5, 10, 50, 100, 250, 400, 500, 600, 750, 900, 999, 1000]
    from_ticks = [span[0] + (span[1] - span[0]) * k // TICKS for k in ticks]
    instants = sorted({*from_ticks, *in_flight, *(t - 1 for t in in_flight), *ends, *backward,
                       *construction[::max(1, len(construction) // 20)], span[0] - 1})
    got = run_typescript("replay", OUT, {
        "file": base64.b64encode(data).decode(),
        "instants": instants, "ticks": ticks})

    assert (got["t0"], got["t1"]) == span
    assert got["steps"] == model.steps
    assert got["ticks"] == from_ticks
    for s, b in got["bounds"].items():
        assert tuple(b) == model.step_bounds(int(s)), s
    for t, at in zip(instants, got["at"], strict=True):
        assert at == python_at(model, trace, t), t
    # the instants read differently: the constructor, a chunk in flight, each iteration
    flight = got["at"][instants.index(in_flight[0])]["ranks"]
    assert any(r["broadcast"] is not None and not r["broadcast"][2] for r in flight.values())
    assert {a["stepAt"] for a in got["at"]} >= {-1, *model.steps}
    assert {r["phase"] for a in got["at"] for r in a["ranks"].values()} >= {
        "waiting", "verifying", "broadcasting", "forward", "backward", "after backward"}

