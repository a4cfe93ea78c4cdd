"""BucketMap: the figure kernel-side must show exactly the planner's buckets, and every control
must re-plan to what a fresh `bucket_plan(...)` with the same settings gives."""

from __future__ import annotations

import sys
import time
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go
import pytest
import torch
from torch import nn

from ddpviz.plan import BucketPlan, PlannedBucket, bucket_plan
from ddpviz.units import human_bytes
from ddpviz.widgets import BucketMap
from ddpviz.widgets.bucket_figure import PALETTE, bar_traces, limit_trace
from ddpviz.widgets.bucket_segments import bucket_label

CAPS = (None, 0.005, 0.01, 25)  # small caps so the small test models get several buckets


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.LayerNorm(64),
                         nn.Linear(64, 10))


def mixed() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8))
    m[1].to(torch.bfloat16)
    return m


def wide() -> nn.Module:
    """2 MiB of fp32: the default settings give one bucket, rebuilt to 1 MiB + 25 MiB."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512))


def fig_data(m: BucketMap) -> dict[str, Any]:
    """What the figure draws, kernel-side: bars from every bar trace in row/offset order."""
    rows = list(m.figure.layout.yaxis.categoryarray or [])
    row_of = {r: i for i, r in enumerate(rows)}
    bars = [seg for t in bar_traces(m.figure)
            for seg in zip(t.y, t.base, t.x, t.hovertext, strict=True)]
    bars.sort(key=lambda b: (row_of[b[0]], b[1], b[2]))
    limits = limit_trace(m.figure)
    return {
        "x": [int(b[2]) for b in bars], "base": [int(b[1]) for b in bars],
        "y": [b[0] for b in bars], "hovertext": [b[3] for b in bars],
        "limit_x": list(limits.x), "limit_y": list(limits.y), "rows": rows,
    }


def check_figure_shows(m: BucketMap, buckets: tuple[PlannedBucket, ...]) -> None:
    """The kernel-side figure against the plan's buckets, independently of the widget code."""
    slots = [(b, s) for b in buckets for s in b.slots]
    d = fig_data(m)
    assert len(d["x"]) == len(slots)
    assert d["x"] == [s.param.nbytes for _, s in slots]
    assert d["base"] == [s.byte_offset for _, s in slots]
    assert d["y"] == [bucket_label(b) for b, _ in slots]
    assert d["rows"] == [bucket_label(b) for b in buckets]  # top to bottom = reduction order
    for text, (b, s) in zip(d["hovertext"], slots, strict=True):
        p = s.param
        assert p.name in text
        assert "(" + ", ".join(map(str, p.shape)) in text
        assert p.dtype in text
        assert f"{p.nbytes:,} bytes" in text
        assert f"byte offset {s.byte_offset:,}" in text
        assert f"bucket {b.index}" in text
    drawn = [b for b in buckets if not b.sparse and b.limit < 2**62]
    assert d["limit_x"] == [b.limit for b in drawn]
    assert d["limit_y"] == [bucket_label(b) for b in drawn]


@pytest.mark.parametrize("factory", [mlp, mixed, wide])
@pytest.mark.parametrize("cap", [None, 0.005])
@pytest.mark.parametrize("which", ["initial", "rebuilt"])
def test_figure_draws_every_parameter_at_its_offset(factory: Any, cap: float | None,
                                                    which: str) -> None:
    plan = bucket_plan(factory(), bucket_cap_mb=cap)
    m = BucketMap(plan, which=which, cap_choices=CAPS)  # type: ignore[arg-type]
    buckets = plan.buckets(which)  # type: ignore[arg-type]
    check_figure_shows(m, buckets)
    segs = m.segments()
    assert sorted(s["param_index"] for s in segs) == list(range(len(plan.params)))
    per_bucket: dict[int, list[int]] = {}
    for s in segs:
        per_bucket.setdefault(s["bucket"], []).append(s["param_index"])
    assert [per_bucket[i] for i in sorted(per_bucket)] == plan.bucket_indices(which)  # type: ignore[arg-type]
    assert sorted(s["nbytes"] for s in segs) == sorted(fig_data(m)["x"])


def test_default_cap_is_one_bucket_then_1mib_and_25mib() -> None:
    m = BucketMap(bucket_plan(wide()))
    assert m.cap_dropdown.value == "None"
    assert len(m.figure.layout.yaxis.categoryarray) == 1
    assert list(limit_trace(m.figure).x) == []  # the initial limit is sys.maxsize: nothing to mark
    assert "unlimited" in m.figure.layout.yaxis.categoryarray[0]
    m.map_toggle.value = "rebuilt"
    assert list(limit_trace(m.figure).x) == [2**20, 25 * 2**20]
    assert len(m.figure.layout.yaxis.categoryarray) == 2
    # an explicit 25 is not the default: no 1 MiB bucket, one bucket holds everything
    m.cap_dropdown.value = 25.0
    assert list(limit_trace(m.figure).x) == [25 * 2**20]
    assert m.plan == bucket_plan(wide(), bucket_cap_mb=25)


SETTINGS = [
    {"bucket_cap_mb": 0.005},
    {"bucket_cap_mb": 0.01, "find_unused_parameters": True},
    {"find_unused_parameters": True},
    {"static_graph": True},
    {"bucket_cap_mb": 0.005, "find_unused_parameters": True, "static_graph": True},
]


def apply(m: BucketMap, settings: dict[str, Any]) -> None:
    if "bucket_cap_mb" in settings:
        m.cap_dropdown.value = settings["bucket_cap_mb"]
    if "find_unused_parameters" in settings:
        m.find_unused_checkbox.value = settings["find_unused_parameters"]
    if "static_graph" in settings:
        m.static_graph_checkbox.value = settings["static_graph"]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in
                                                                      s.items()))
@pytest.mark.parametrize("which", ["initial", "rebuilt"])
def test_each_control_replans_like_a_fresh_bucket_plan(settings: dict[str, Any],
                                                       which: str) -> None:
    model = mlp()
    example = torch.randn(4, 32)
    m = BucketMap(bucket_plan(model, example_inputs=example), which=which,  # type: ignore[arg-type]
                  cap_choices=CAPS)
    before = fig_data(m)
    apply(m, settings)
    fresh = bucket_plan(model, example_inputs=example, **settings)
    assert m.plan == fresh
    assert m.plan.order_source == "measured"
    assert fig_data(m) == fig_data(BucketMap(fresh, which=which, cap_choices=CAPS))  # type: ignore[arg-type]
    if fresh.rebuilt is not None or which == "initial":
        check_figure_shows(m, fresh.buckets(which))  # type: ignore[arg-type]
    # and back to torch's defaults
    m.cap_dropdown.value = "None"
    m.find_unused_checkbox.value = False
    m.static_graph_checkbox.value = False
    assert m.plan == bucket_plan(model, example_inputs=example)
    assert fig_data(m) == before


def test_toggle_switches_between_initial_and_rebuilt_map() -> None:
    plan = bucket_plan(mlp(), bucket_cap_mb=0.005)
    assert plan.rebuilt is not None and plan.bucket_indices("rebuilt") != plan.bucket_indices()
    m = BucketMap(plan, cap_choices=CAPS)
    assert m.which == "initial"
    check_figure_shows(m, plan.initial)
    assert "▶ initial map" in m.summary_html.value
    m.map_toggle.value = "rebuilt"
    check_figure_shows(m, plan.rebuilt)
    assert "▶ rebuilt map" in m.summary_html.value
    assert "rebuilt map" in m.figure.layout.title.text
    m.map_toggle.value = "initial"
    check_figure_shows(m, plan.initial)


def test_without_a_rebuild_the_toggle_and_picture_say_so() -> None:
    m = BucketMap(bucket_plan(mlp(), bucket_cap_mb=0.005), which="rebuilt", cap_choices=CAPS)
    assert len(fig_data(m)["x"]) == len(m.plan.params)
    m.find_unused_checkbox.value = True
    assert m.plan.rebuilt is None
    assert m.which == "rebuilt"  # the choice stays; the map is not silently swapped
    assert dict(m.map_toggle.options) == {"initial (every iteration)": "initial",
                                          "rebuilt: never (torch does not rebuild)": "rebuilt"}
    assert fig_data(m)["x"] == [] and list(limit_trace(m.figure).x) == []
    assert m.segments() == []
    assert "never rebuilds" in m.figure.layout.annotations[0].text
    assert "rebuilt map: none" in m.summary_html.value
    assert "torch never rebuilds buckets" in m.summary_html.value  # the plan's note
    m.map_toggle.value = "initial"
    check_figure_shows(m, m.plan.initial)
    m.static_graph_checkbox.value = True  # static_graph rebuilds again, one iteration later
    m.map_toggle.value = "rebuilt"
    assert m.plan.rebuilt is not None
    check_figure_shows(m, m.plan.rebuilt)
    assert m.figure.layout.annotations == ()
    assert dict(m.map_toggle.options) == {"initial (iterations 0-1)": "initial",
                                          "rebuilt (iteration 2 on)": "rebuilt"}
    assert "initial map (iterations 0-1)" in m.summary_html.value


def test_summary_shows_settings_counts_and_notes() -> None:
    plan = bucket_plan(wide())
    m = BucketMap(plan)
    html = m.summary_html.value
    total = sum(p.nbytes for p in plan.params)
    assert "bucket_cap_mb=None, find_unused_parameters=False, static_graph=False" in html
    assert f"4 parameters, {human_bytes(total)}" in html
    assert "initial map (iteration 0): 1 bucket," in html
    assert "2 buckets" in html and "limits 1.0 MiB, 25.0 MiB" in html
    assert "predicted from reverse registration order" in html
    m.cap_dropdown.value = 0.25
    assert "bucket_cap_mb=0.25" in m.summary_html.value


def test_mixed_dtypes_and_sparse_buckets() -> None:
    plan = bucket_plan(mixed(), bucket_cap_mb=0.005)
    m = BucketMap(plan, which="rebuilt", cap_choices=CAPS)
    check_figure_shows(m, plan.rebuilt)  # type: ignore[arg-type]
    assert {s["dtype"] for s in m.segments()} == {"float32", "bfloat16"}
    assert any("bfloat16" in label for label in m.figure.layout.yaxis.categoryarray)

    class WithSparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 8, sparse=True)
            self.out = nn.Linear(8, 2)

    sparse_plan = bucket_plan(WithSparse(), bucket_cap_mb=0.005)
    m = BucketMap(sparse_plan, cap_choices=CAPS)
    check_figure_shows(m, sparse_plan.initial)
    sparse_rows = [r for r in m.figure.layout.yaxis.categoryarray if "sparse" in r]
    assert len(sparse_rows) == 1
    assert sparse_rows[0] not in limit_trace(m.figure).y  # a sparse bucket has no size limit


def test_one_figure_widget_with_two_traces_however_many_buckets() -> None:
    m = BucketMap(bucket_plan(mlp(), bucket_cap_mb=0.005), which="rebuilt", cap_choices=CAPS)

    def figures(x: Any) -> int:
        own = isinstance(x, go.FigureWidget)
        kids = x.children if isinstance(x, w.Box) else ()
        return own + sum(figures(k) for k in kids)

    assert figures(m) == 1
    assert len(m.figure.layout.yaxis.categoryarray) > 1
    # a fixed set of traces: one bar trace per palette colour, one for the limit markers
    assert [t.type for t in m.figure.data] == ["bar"] * len(PALETTE) + ["scatter"]
    assert sum(len(t.x) for t in bar_traces(m.figure)) == len(m.plan.params)
    used = [t for t in bar_traces(m.figure) if len(t.x)]
    assert len(used) == 2  # all fp32: two alternating shades
    assert {t.marker.color for t in used} == set(PALETTE[:2])


def test_bucket_cap_mb_list_plan_is_offered_and_replaced_by_a_cap() -> None:
    plan = bucket_plan(mlp(), bucket_cap_mb_list=[0.005, 0.01])
    m = BucketMap(plan, cap_choices=CAPS)
    assert m.cap_dropdown.value == (0.005, 0.01)
    check_figure_shows(m, plan.initial)
    m.cap_dropdown.value = 0.01
    assert m.plan == bucket_plan(mlp(), bucket_cap_mb=0.01)
    m.cap_dropdown.value = (0.005, 0.01)
    assert m.plan == bucket_plan(mlp(), bucket_cap_mb=0.01, bucket_cap_mb_list=[0.005, 0.01])


def test_set_plan_moves_the_controls() -> None:
    m = BucketMap(bucket_plan(mlp()), cap_choices=CAPS)
    other = bucket_plan(mixed(), bucket_cap_mb=0.3, find_unused_parameters=True)
    m.set_plan(other)
    assert m.plan is other
    assert (m.cap_dropdown.value, m.find_unused_checkbox.value) == (0.3, True)
    check_figure_shows(m, other.initial)
    m.static_graph_checkbox.value = True
    assert m.plan == bucket_plan(mixed(), bucket_cap_mb=0.3, find_unused_parameters=True,
                                 static_graph=True)


def test_show_returns_a_bucket_map_and_bad_input_is_named() -> None:
    plan = bucket_plan(mlp())
    assert isinstance(plan.show(), BucketMap)
    with pytest.raises(TypeError, match=r"^ddpviz: BucketMap takes a BucketPlan, got Sequential"):
        BucketMap(mlp())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="which='latest'"):
        BucketMap(plan, which="latest")  # type: ignore[arg-type]


def test_widgets_hold_no_module() -> None:
    model = mlp()
    m = BucketMap(bucket_plan(model))
    seen: set[int] = set()

    def walk(x: Any, depth: int = 0) -> None:
        if id(x) in seen or depth > 6:
            return
        seen.add(id(x))
        assert not isinstance(x, (nn.Module, torch.Tensor))
        if isinstance(x, BucketPlan):
            for v in x.__dict__.values():
                walk(v, depth + 1)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v, depth + 1)
        elif hasattr(x, "__dataclass_fields__"):
            for k in x.__dataclass_fields__:
                walk(getattr(x, k), depth + 1)

    walk(m.plan)
    assert "ddpviz.engine" not in type(m).__module__


def test_ten_thousand_parameters_build_and_update() -> None:
    model = nn.ModuleList([nn.Linear(1, 1) for _ in range(5000)])
    caps = (None, 0.001, 0.01)
    t0 = time.perf_counter()
    m = BucketMap(bucket_plan(model), cap_choices=caps)
    t1 = time.perf_counter()
    assert len(fig_data(m)["x"]) == 10_000
    m.cap_dropdown.value = 0.001
    t2 = time.perf_counter()
    m.map_toggle.value = "rebuilt"
    t3 = time.perf_counter()
    fresh = bucket_plan(model, bucket_cap_mb=0.001)
    assert m.plan == fresh
    assert len(fresh.rebuilt) > 30  # type: ignore[arg-type]
    check_figure_shows(m, fresh.rebuilt)  # type: ignore[arg-type]
    print(f"\n10k params: plan + build {t1 - t0:.3f} s, cap change {t2 - t1:.3f} s, "
          f"toggle {t3 - t2:.3f} s", file=sys.stderr)
