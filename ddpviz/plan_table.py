"""Plain-text rendering of a BucketPlan: the table `print(plan)` and `ddpviz buckets` show."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpviz.units import human_bytes

if TYPE_CHECKING:
    from ddpviz.plan import BucketPlan, PlannedBucket


def _settings_line(plan: BucketPlan) -> str:
    s = plan.settings
    parts = [f"bucket_cap_mb={s.bucket_cap_mb}"]
    if s.bucket_cap_mb_list:
        parts.append(f"bucket_cap_mb_list={list(s.bucket_cap_mb_list)}")
    parts.append(f"find_unused_parameters={s.find_unused_parameters}")
    parts.append(f"static_graph={s.static_graph}")
    if s.set_last_bucket_cap:
        parts.append("DDP_SET_LAST_BUCKET_CAP=1")
    return ", ".join(parts)


def _bucket_table(buckets: tuple[PlannedBucket, ...], max_params: int) -> list[str]:
    width = min(60, max((len(s.param.name) for b in buckets for s in b.slots), default=10))
    lines = [f"  {'bucket':>6}  {'params':>6}  {'dtype':<9} {'device':<7} {'numel':>11} "
             f"{'bytes':>10}  {'limit':>10}"]
    for b in buckets:
        lines.append(f"  {b.index:>6}  {len(b.slots):>6}  {b.dtype:<9} {b.device:<7} "
                     f"{b.numel:>11,} {human_bytes(b.nbytes):>10}  "
                     f"{'sparse' if b.sparse else human_bytes(b.limit):>10}")
        shown = b.slots if len(b.slots) <= max_params else b.slots[: max_params - 1]
        for s in shown:
            shape = "x".join(map(str, s.param.shape)) or "scalar"
            lines.append(f"  {'':>6}    [{s.param.index:>4}] {s.param.name:<{width}} {shape:<14} "
                         f"@{s.offset:,}")
        if len(shown) < len(b.slots):
            lines.append(f"  {'':>6}    ... {len(b.slots) - len(shown)} more")
    return lines


def format_plan(plan: BucketPlan, max_params_per_bucket: int = 12) -> str:
    """The plan as a table: settings, limits, then each map in reduction order."""
    total = sum(p.nbytes for p in plan.params)
    lim = plan.limits
    out = [
        f"BucketPlan for {plan.model}: {len(plan.params)} parameters, {human_bytes(total)}",
        f"  settings: {_settings_line(plan)}",
        f"  limits:   initial {[human_bytes(x) for x in lim.initial]}; rebuild "
        + (str([human_bytes(x) for x in lim.rebuild]) if lim.rebuild else "never"),
        "",
        f"Initial buckets (iteration 0), in reduction order: {len(plan.initial)}",
        *_bucket_table(plan.initial, max_params_per_bucket),
    ]
    if plan.rebuilt is not None:
        out += [
            "",
            f"Rebuilt buckets (iteration 1 on; gradient-ready order {plan.order_source}), "
            f"in reduction order: {len(plan.rebuilt)}",
            *_bucket_table(plan.rebuilt, max_params_per_bucket),
        ]
    if plan.notes:
        out += ["", *[f"note: {n}" for n in plan.notes]]
    return "\n".join(out)
