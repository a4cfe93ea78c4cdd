"""The cost model: fitted from a run's own all-reduces (synthetic runs with known costs)."""

from __future__ import annotations

import pytest
from torch import nn

from ddpviz.advisor import CostModel, Line, build_timeline, fit_cost_model
from ddpviz.advisor.measure import _fit
from tests.advise.synthetic import run_trace


def _widths() -> nn.Module:
    # four bias-free layers of different sizes; a tiny cap puts each in its own bucket
    return nn.Sequential(nn.Linear(256, 256, bias=False), nn.Linear(256, 384, bias=False),
                         nn.Linear(384, 512, bias=False), nn.Linear(512, 640, bias=False))


@pytest.mark.parametrize(("done_at_finalize", "gap_ms"), [(False, 12.0), (True, 1.0)])
@pytest.mark.parametrize(("latency", "per_byte"), [(2e-4, 5e-9), (1e-3, 1e-9)])
def test_the_fit_recovers_known_latency_and_bandwidth(latency: float, per_byte: float,
                                                       done_at_finalize: bool,
                                                       gap_ms: float) -> None:
    # torch-like (done reported as it happens): gradients far apart, each all-reduce alone;
    # ddpviz-like (done seen at finalize): gradients 1 ms apart, so the queue is still busy
    # when the backward ends and every done time seen is the queue's finish
    trace = run_trace(_widths(), bucket_cap_mb=0.01, latency_s=latency,
                      seconds_per_byte=per_byte, grad_gap_ms=gap_ms, steps=8,
                      done_at_finalize=done_at_finalize)
    timeline = build_timeline(trace)
    assert timeline.done_seen_at_finalize is done_at_finalize
    model = fit_cost_model(timeline)
    assert model.separable and model.distinct_sizes == {"float32": 4}
    line = model.lines["float32"]
    assert line.latency_s == pytest.approx(latency, rel=0.15, abs=2e-5)
    assert line.seconds_per_byte == pytest.approx(per_byte, rel=0.1)
    assert "distinct size" not in " ".join(model.notes)


def test_too_few_sizes_is_said_and_a_measured_latency_fills_in() -> None:
    eight = nn.Sequential(*[nn.Linear(512, 512, bias=False) for _ in range(8)])
    trace = run_trace(eight, bucket_cap_mb=256, latency_s=2e-4, seconds_per_byte=5e-9)
    timeline = build_timeline(trace)
    alone = fit_cost_model(timeline)
    assert not alone.separable
    assert alone.distinct_sizes == {"float32": 1}
    assert "only 1 distinct size(s)" in " ".join(alone.notes)
    assert "ddpviz.advisor.measure(process_group)" in " ".join(alone.notes)
    helped = fit_cost_model(timeline, CostModel({"float32": Line(2e-4, 0.0)}, "measured"))
    assert helped.separable and helped.lines["float32"].latency_s == 2e-4
    assert helped.lines["float32"].seconds_per_byte == pytest.approx(5e-9, rel=0.05)


def test_measure_fits_a_line_through_points() -> None:
    line = _fit([(1000, 1e-4 + 1000 * 2e-9), (10**6, 1e-4 + 10**6 * 2e-9),
                 (10**7, 1e-4 + 10**7 * 2e-9)])
    assert line.latency_s == pytest.approx(1e-4) and line.seconds_per_byte == pytest.approx(2e-9)
    assert line.bandwidth == pytest.approx(5e8)
