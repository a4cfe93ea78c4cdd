"""The advisor on real 2-rank gloo runs: the timeline it reads back, and its replay's bucket maps
against the maps torch's own DDP builds for the same settings."""

from __future__ import annotations

from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.advisor import Candidate, advise, build_timeline
from ddpviz.advisor.advisor import current_candidate, plan_for, steady_map
from ddpviz.traces.trace import Trace
from tests.advise import rank_fns
from tests.dist.harness import run_ranks

STEPS = 5
CAP_MB = 0.01  # ~10 KiB: the MLP's 8 parameters fall into several buckets


@pytest.fixture(scope="module")
def ddpviz_run() -> Trace:
    out = run_ranks(rank_fns.record_ddpviz, 2, STEPS, CAP_MB, timeout=300)
    return Trace([e for r in sorted(out) for e in out[r]["events"]])


def test_the_timeline_holds_every_rank_step_gradient_and_bucket(ddpviz_run: Trace) -> None:
    timeline = build_timeline(ddpviz_run)
    assert timeline.world_size == 2
    assert timeline.done_seen_at_finalize  # ddpviz's DDP: done seen as finalize waits
    rebuilt = [e for e in ddpviz_run.of_type(ev.BucketAssigned, rank=0) if e.rebuilt]
    assert len(rebuilt) == 1
    assert timeline.current_buckets() == tuple(tuple(b) for b in rebuilt[0].buckets)
    order = ddpviz_run.of_type(ev.BucketsRebuilt, rank=0)[0].grad_ready_order
    assert timeline.grad_ready_order == tuple(order)
    steady = timeline.steady_steps()
    assert steady == list(range(1, STEPS - 1))  # step 0 warms up; the last has no next forward
    n_params = len(timeline.params)
    for step in steady:
        for rank, rec in timeline.records[step].items():
            assert timeline.complete(step, rank)
            ready, buckets = timeline.ready(step, rank), timeline.buckets[step][rank]
            assert sorted(ready) == list(range(n_params))
            assert rec.backward is not None and rec.backward_end is not None
            assert rec.forward is not None and rec.forward <= rec.backward <= min(ready.values())
            assert list(rec.launched) == list(range(len(buckets)))
            # in-order launch, once the bucket's last gradient is in
            for b, (t, nbytes, _) in rec.launched.items():
                members = buckets[b]
                assert t >= max(ready[i] for i in members)
                assert rec.done[b] >= t
                assert nbytes == sum(timeline.params[i].nbytes for i in members)
            times = [t for t, _, _ in rec.launched.values()]
            assert times == sorted(times)
            next_forward = timeline.next_forward(step, rank)
            assert next_forward is not None
            assert max(rec.done.values()) <= rec.backward_end <= next_forward


def test_replaying_the_current_setting_gives_the_recorded_map(ddpviz_run: Trace) -> None:
    timeline = build_timeline(ddpviz_run)
    plan = plan_for(timeline, current_candidate(timeline))
    assert plan.settings.bucket_cap_mb == CAP_MB
    assert tuple(b.param_indices for b in steady_map(plan)) == timeline.current_buckets()
    advice = advise(ddpviz_run, candidates=[CAP_MB])
    assert advice.rows[0].current
    recorded = tuple(b.param_indices for b in advice.rows[0].buckets)
    assert tuple(b.param_indices for b in advice.rows[1].buckets) == recorded
    # replaying the recorded map with the recorded costs reproduces the recorded step time
    assert advice.rows[0].prediction.step_s == pytest.approx(advice.measured_step_s, rel=1e-9)
    assert advice.rows[1].prediction.step_s == pytest.approx(advice.measured_step_s, rel=1e-9)


@pytest.mark.parametrize(("candidate", "torch_args"), [
    (Candidate("cap 0.004", bucket_cap_mb=0.004), (0.004, None)),
    (Candidate("default"), (None, None)),
    (Candidate("list", bucket_cap_mb_list=(0.002, 0.02)), (None, [0.002, 0.02])),
])
def test_the_replay_plans_the_maps_torch_builds(ddpviz_run: Trace, candidate: Candidate,
                                                torch_args: tuple[Any, Any]) -> None:
    timeline = build_timeline(ddpviz_run)
    expected = run_ranks(rank_fns.torch_buckets, 2, *torch_args, timeout=300)[0]
    planned = [list(b.param_indices) for b in steady_map(plan_for(timeline, candidate))]
    assert planned == expected


def test_a_watched_torch_ddp_is_advised_on_its_own_maps() -> None:
    out = run_ranks(rank_fns.record_ddpviz, 2, STEPS, CAP_MB, True, timeout=300)
    trace = Trace([e for r in sorted(out) for e in out[r]["events"]])
    timeline = build_timeline(trace)
    assert [list(b) for b in timeline.current_buckets()] == out[0]["torch_rebuilt"]
    advice = advise(trace, candidates=[0.004, 1])
    assert [r.candidate.bucket_cap_mb for r in advice.rows[1:]] == [0.004, 1]
    assert advice.rows[0].prediction.step_s == pytest.approx(advice.measured_step_s, rel=1e-9)


def test_measure_fits_one_model_that_every_rank_agrees_on() -> None:
    out = run_ranks(rank_fns.measure_costs, 2, timeout=300)
    assert out[0] == out[1]  # the slowest rank's time per size, fitted alike on every rank
    assert out[0]["source"] == "measured" and out[0]["separable"]
    assert set(out[0]["lines"]) == {"float32", "bfloat16"}
    for latency, per_byte in out[0]["lines"].values():
        assert latency >= 0 and per_byte >= 0 and latency + (1 << 20) * per_byte > 0


def test_measure_needs_a_process_group() -> None:
    from ddpviz.advisor import AdviceError, measure

    with pytest.raises(AdviceError, match="needs an initialized process group"):
        measure()
