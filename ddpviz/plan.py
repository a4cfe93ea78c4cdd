"""The bucket planner: the buckets torch 2.13's DDP will build for a module, without processes.

`bucket_plan(module, ...)` collects parameters exactly as DDP does, applies torch's capacity
rules and returns a `BucketPlan`: the constructor's map and, where torch rebuilds, the map after
the first iteration. A plan keeps only descriptions of the parameters (never the module), so it
can be re-planned with other settings at once (`with_settings`), which the BucketMap widget does.

The bucket primitives live here too (implemented in ddpviz.engine.buckets, which the engine
uses): `compute_bucket_assignment_by_size(tensors, limits)` is torch's C++ function of that
name in Python, `replay_bucket_assignment` the same with every step recorded, `TensorSpec` the
tensor description both accept.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ddpviz import events as ev
from ddpviz.engine.buckets import (
    BucketAssignment,
    BucketCapacity,
    Limits,
    TensorSpec,
    compute_bucket_assignment_by_size,
    initial_buckets,
    rebuilt_buckets,
    replay_bucket_assignment,
)
from ddpviz.units import human_bytes

# torch only where a module is planned (bucket_plan, measure_grad_ready_order): a plan from a
# recorded run's events (observed_plan, with_settings) works on names and sizes, without torch.

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ddpviz.model.event_model import Timed
    from ddpviz.widgets.bucket_map import BucketMap

__all__ = ["BucketPlan", "BucketSlot", "PlanSettings", "PlannedBucket", "PlannedParam",
           "TensorSpec", "bucket_plan", "compute_bucket_assignment_by_size",
           "measure_grad_ready_order", "observed_plan", "replay_bucket_assignment"]

OrderSource = Literal["given", "measured", "predicted"]


@dataclass(frozen=True)
class PlannedParam:
    """A parameter as the reducer sees it."""

    index: int  # position in DDP's parameter list
    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    numel: int
    element_size: int
    nbytes: int
    sparse_grad: bool

    def spec(self) -> TensorSpec:
        """What bucket assignment reads of this parameter (size, element size, dtype, device).

        Returns:
            The `TensorSpec` to pass to `compute_bucket_assignment_by_size`.
        """
        return TensorSpec(self.numel, self.element_size, self.dtype, self.device)


@dataclass(frozen=True)
class BucketSlot:
    """A parameter's place inside one bucket's flat buffer."""

    param: PlannedParam
    offset: int  # element offset in the flat bucket buffer (torch's bucket offsets)
    byte_offset: int


@dataclass(frozen=True)
class PlannedBucket:
    """One bucket, in reduction order (bucket 0's all-reduce is launched first)."""

    index: int
    slots: tuple[BucketSlot, ...]
    dtype: str
    device: str
    numel: int
    nbytes: int
    limit: int  # the size limit in bytes it was filled against (0 for a sparse bucket)
    sparse: bool

    @property
    def names(self) -> tuple[str, ...]:
        """The dotted names of the bucket's parameters, in their order in its flat buffer."""
        return tuple(s.param.name for s in self.slots)

    @property
    def param_indices(self) -> tuple[int, ...]:
        """The indices (in DDP's parameter list) of the bucket's parameters, in their order in
        its flat buffer."""
        return tuple(s.param.index for s in self.slots)


@dataclass(frozen=True)
class PlanSettings:
    """DDP constructor arguments that shape buckets (torch's names and defaults)."""

    bucket_cap_mb: float | None = None
    bucket_cap_mb_list: tuple[float, ...] | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    set_last_bucket_cap: bool = False  # env DDP_SET_LAST_BUCKET_CAP=1


@dataclass(frozen=True)
class BucketPlan:
    """The buckets DDP builds for a module: initial (iteration 0) and rebuilt (iteration 1 on).

    Print it for a table, `to_records()` for plain rows, `show()` for the BucketMap widget.
    """

    model: str
    params: tuple[PlannedParam, ...]
    settings: PlanSettings
    limits: Limits
    initial: tuple[PlannedBucket, ...]
    rebuilt: tuple[PlannedBucket, ...] | None  # None where torch never rebuilds
    grad_ready_order: tuple[int, ...]
    order_source: OrderSource
    notes: tuple[str, ...] = ()
    _initial_replay: BucketAssignment | None = field(default=None, repr=False, compare=False)
    _rebuilt_replay: BucketAssignment | None = field(default=None, repr=False, compare=False)

    # --- derived views ---------------------------------------------------------------------

    @property
    def rebuilds(self) -> bool:
        """Whether DDP rebuilds the buckets after iteration 0 (`rebuilt` is then a map); torch
        does not with find_unused_parameters=True and static_graph=False."""
        return self.rebuilt is not None

    def buckets(self, which: Literal["initial", "rebuilt"] = "initial"
                ) -> tuple[PlannedBucket, ...]:
        """One of the two maps.

        Args:
            which: "initial" (default): the map of iteration 0; "rebuilt": the map from
                iteration 1 on.

        Returns:
            Its buckets, in reduction order.

        Raises:
            ValueError: "rebuilt" asked of a plan where torch does not rebuild (`rebuilds`).
        """
        if which == "rebuilt":
            if self.rebuilt is None:
                raise ValueError("ddpviz: this plan has no rebuilt map (torch does not rebuild "
                                 "with find_unused_parameters=True and static_graph=False).")
            return self.rebuilt
        return self.initial

    def bucket_indices(self, which: Literal["initial", "rebuilt"] = "initial") -> list[list[int]]:
        """Parameter indices per bucket, in reduction order: what a comm hook sees (and what
        `DistributedDataParallel.bucket_indices()` returns on a live run).

        Args:
            which: "initial" (default) or "rebuilt", as for `buckets`.

        Returns:
            For each bucket, bucket 0 first, the indices of its parameters in DDP's
            parameter list, in their order in the bucket.

        Raises:
            ValueError: "rebuilt" asked of a plan where torch does not rebuild.
        """
        return [list(b.param_indices) for b in self.buckets(which)]

    def replay(self, which: Literal["initial", "rebuilt"] = "initial") -> BucketAssignment:
        """Every decision of the assignment, tensor by tensor (see `replay_bucket_assignment`).

        Args:
            which: "initial" (default) or "rebuilt", as for `buckets`.

        Returns:
            The assignment with its steps (for each tensor, the bucket it joined and why a
            bucket was closed).

        Raises:
            ValueError: the plan has no such map to replay.
        """
        r = self._initial_replay if which == "initial" else self._rebuilt_replay
        if r is None:
            raise ValueError(f"ddpviz: this plan has no {which} map to replay.")
        return r

    def with_settings(self, **changes: Any) -> BucketPlan:
        """The same model planned with other settings; the gradient-ready order is kept
        (no forward or backward runs again).

        Args:
            changes: `PlanSettings` fields to change (`bucket_cap_mb=5`,
                `find_unused_parameters=True`, ...); the others keep this plan's values.

        Returns:
            A new `BucketPlan`.

        Raises:
            TypeError: a name that is not a `PlanSettings` field.
        """
        if "bucket_cap_mb_list" in changes and changes["bucket_cap_mb_list"] is not None:
            changes["bucket_cap_mb_list"] = tuple(changes["bucket_cap_mb_list"])
        settings = replace(self.settings, **changes)
        specs = [p.spec() for p in self.params]
        return _make_plan(self.model, self.params, specs, settings, self.grad_ready_order,
                          self.order_source, self.notes)

    # --- output ----------------------------------------------------------------------------

    def to_records(self) -> list[dict[str, Any]]:
        """The plan as plain rows, e.g. for a DataFrame.

        Returns:
            One JSON-ready dict per (map, bucket, parameter), initial map first, with "map"
            ("initial" or "rebuilt"), "bucket", "bucket_limit" and "bucket_bytes", the
            parameter's "param_index", "name", "shape", "dtype", "device", "numel", "nbytes",
            "sparse_grad", and its place in the flat buffer, "offset" (elements) and
            "byte_offset".
        """
        rows: list[dict[str, Any]] = []
        maps = [("initial", self.initial)] + ([("rebuilt", self.rebuilt)] if self.rebuilt else [])
        for which, buckets in maps:
            for b in buckets:
                for s in b.slots:
                    rows.append({
                        "map": which, "bucket": b.index, "bucket_limit": b.limit,
                        "bucket_bytes": b.nbytes, "param_index": s.param.index,
                        "name": s.param.name, "shape": list(s.param.shape),
                        "dtype": s.param.dtype, "device": s.param.device,
                        "numel": s.param.numel, "nbytes": s.param.nbytes, "offset": s.offset,
                        "byte_offset": s.byte_offset, "sparse_grad": s.param.sparse_grad,
                    })
        return rows

    def to_json(self) -> str:
        """The plan as one JSON document.

        Returns:
            JSON text of an object with "model", "settings", "limits" (initial and rebuild
            byte limits), "grad_ready_order", "order_source", "notes" and "buckets" (the rows
            of `to_records()`).
        """
        return json.dumps({
            "model": self.model,
            "settings": {k: v if not isinstance(v, tuple) else list(v)
                         for k, v in self.settings.__dict__.items()},
            "limits": {"initial": self.limits.initial, "rebuild": self.limits.rebuild},
            "grad_ready_order": list(self.grad_ready_order),
            "order_source": self.order_source,
            "notes": list(self.notes),
            "buckets": self.to_records(),
        }, indent=1)

    def __str__(self) -> str:
        return _format_plan(self)

    def show(self) -> BucketMap:
        """The BucketMap widget for this plan (needs ipywidgets and plotly).

        Returns:
            The widget (display it as a notebook cell's last value).
        """
        from ddpviz.widgets.bucket_map import BucketMap

        return BucketMap(self)


def _describe(entries: Sequence[Any]) -> tuple[tuple[PlannedParam, ...], list[TensorSpec]]:
    params, specs = [], []
    for e in entries:
        p = e.param
        spec = TensorSpec.of(p)
        specs.append(spec)
        params.append(PlannedParam(e.index, e.name, tuple(p.shape), str(p.dtype).removeprefix(
            "torch."), str(p.device), p.numel(), spec.element_size, spec.nbytes, e.sparse_grad))
    return tuple(params), specs


def planned_buckets(params: Sequence[PlannedParam], buckets: Sequence[Sequence[int]],
                    limits: Sequence[int]) -> tuple[PlannedBucket, ...]:
    """PlannedBuckets (with flat-buffer offsets) for a map: parameter indices per bucket, in
    reduction order, and each bucket's limit. Used for planned and for observed maps."""
    by_index = {p.index: p for p in params}
    out = []
    for bi, (indices, limit) in enumerate(zip(buckets, limits, strict=True)):
        slots, offset, byte_offset = [], 0, 0
        for i in indices:
            p = by_index[i]
            slots.append(BucketSlot(p, offset, byte_offset))
            offset += p.numel
            byte_offset += p.nbytes
        first = by_index[indices[0]]
        out.append(PlannedBucket(bi, tuple(slots), first.dtype, first.device, offset,
                                 byte_offset, limit, first.sparse_grad))
    return tuple(out)


def _make_plan(model: str, params: tuple[PlannedParam, ...], specs: list[TensorSpec],
               settings: PlanSettings, order: Sequence[int], source: OrderSource,
               base_notes: Sequence[str]) -> BucketPlan:
    capacity = BucketCapacity.create(
        settings.bucket_cap_mb,
        list(settings.bucket_cap_mb_list) if settings.bucket_cap_mb_list else None)
    limits = capacity.limits(
        find_unused_parameters=settings.find_unused_parameters,
        static_graph=settings.static_graph,
        env={"DDP_SET_LAST_BUCKET_CAP": "1" if settings.set_last_bucket_cap else "0"})
    flags = [p.sparse_grad for p in params]
    init_replay, init_b, init_l = initial_buckets(specs, limits.initial, flags)
    notes = [n for n in base_notes if not n.startswith("torch never rebuilds")]
    rebuilt, rebuilt_replay = None, None
    if limits.rebuild is None:
        notes.append("torch never rebuilds buckets with find_unused_parameters=True and "
                     "static_graph=False: the initial map is used in every iteration.")
    elif len(order) == len(params):
        rebuilt_replay, rb, rl = rebuilt_buckets(specs, order, limits.rebuild, flags,
                                                 limits.set_last_bucket_cap)
        rebuilt = planned_buckets(params, rb, rl)
    return BucketPlan(model, params, settings, limits, planned_buckets(params, init_b, init_l),
                      rebuilt, tuple(order), source, tuple(notes), init_replay, rebuilt_replay)


def measure_grad_ready_order(module: nn.Module, example_inputs: Any) -> tuple[list[int], list[str]]:
    """Run one forward/backward on a copy of `module` and record the order in which DDP's
    parameters' gradients become ready (the order the reducer's hooks would fire in).

    Returns (order of parameter indices, names of parameters that got no gradient).
    """
    from ddpviz.engine.params import build_params_for_reducer

    replica = copy.deepcopy(module)
    entries = build_params_for_reducer(replica)
    order: list[int] = []
    handles = [e.param.register_post_accumulate_grad_hook(
        lambda _p, i=e.index: order.append(i)) for e in entries]
    try:
        if isinstance(example_inputs, dict):
            out = replica(**example_inputs)
        elif isinstance(example_inputs, (tuple, list)):
            out = replica(*example_inputs)
        else:
            out = replica(example_inputs)
        loss = _scalar_from_output(out)
        if loss is None:
            raise ValueError(
                "ddpviz: the model's output holds no tensor that requires grad, so no backward "
                "pass can record the gradient-ready order. Pass grad_ready_order=... instead.")
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    seen = set(order)
    unused = [e.name for e in entries if e.index not in seen]
    return order, unused


def _scalar_from_output(out: Any) -> torch.Tensor | None:
    import torch

    tensors: list[torch.Tensor] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            if x.requires_grad and (x.is_floating_point() or x.is_complex()):
                tensors.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif hasattr(x, "__dataclass_fields__"):
            for name in x.__dataclass_fields__:
                walk(getattr(x, name))

    walk(out)
    if not tensors:
        return None
    return sum((t.float().sum() if not t.is_complex() else t.abs().sum() for t in tensors),
               torch.zeros(()))


def bucket_plan(
    module: nn.Module,
    *,
    bucket_cap_mb: float | None = None,
    bucket_cap_mb_list: Sequence[float] | None = None,
    find_unused_parameters: bool = False,
    static_graph: bool = False,
    grad_ready_order: Sequence[int] | Sequence[str] | None = None,
    example_inputs: Any = None,
    set_last_bucket_cap: bool | None = None,
) -> BucketPlan:
    """Plan the buckets torch 2.13's DistributedDataParallel builds for `module`.

    Args:
        module: any nn.Module (meta-device modules work: only shapes are read).
        bucket_cap_mb, bucket_cap_mb_list, find_unused_parameters, static_graph: as for DDP.
        grad_ready_order: the order in which gradients become ready, as parameter indices or
            dotted names; used for the rebuilt map.
        example_inputs: if no order is given, one local forward/backward on a copy of the
            module with these inputs (a tensor, a tuple of args or a dict of kwargs) records it.
            Without either, the rebuilt map is predicted from reverse registration order.
        set_last_bucket_cap: emulate DDP_SET_LAST_BUCKET_CAP=1 (default: read the environment).

    Returns:
        A `BucketPlan`.

    Example:
        >>> plan = ddpviz.bucket_plan(model, example_inputs=torch.randn(8, 512))
        >>> print(plan)          # buckets in reduction order: names, shapes, offsets, limits
        >>> plan.show()          # the BucketMap widget
        >>> plan.with_settings(bucket_cap_mb=5).rebuilt   # the rebuilt map with another cap
    """
    import os

    from ddpviz.engine.params import build_params_for_reducer

    entries = build_params_for_reducer(module)
    params, specs = _describe(entries)
    notes: list[str] = []
    names = {p.name: p.index for p in params}
    source: OrderSource
    if grad_ready_order is not None:
        named = [names.get(x, x) if isinstance(x, str) else x for x in grad_ready_order]
        bad = [x for x in named if not isinstance(x, int)]
        if bad:
            raise ValueError(f"ddpviz: grad_ready_order names unknown parameter {bad[0]!r}; "
                             f"known names start with {list(names)[:5]}.")
        order = [int(x) for x in named]
        if sorted(order) != list(range(len(params))):
            raise ValueError(f"ddpviz: grad_ready_order must list each of the {len(params)} "
                             f"parameters exactly once; got {len(order)} entries.")
        source = "given"
    elif example_inputs is not None:
        order, unused = measure_grad_ready_order(module, example_inputs)
        source = "measured"
        if unused:
            notes.append(
                f"{len(unused)} parameter(s) got no gradient in the example backward "
                f"({', '.join(unused[:5])}{', ...' if len(unused) > 5 else ''}): with "
                "static_graph=True torch marks them ready at the end of backward in registration "
                "order, and the rebuilt map below puts them there too; with "
                "find_unused_parameters=False (and no static_graph) torch raises at iteration "
                "1's forward instead of rebuilding.")
            seen = set(order)
            order = order + [i for i in range(len(params)) if i not in seen]
    else:
        order = list(reversed(range(len(params))))
        source = "predicted"
        notes.append("rebuilt map predicted from reverse registration order; pass example_inputs "
                     "or grad_ready_order for the order your model really produces gradients in.")
    if set_last_bucket_cap is None:
        set_last_bucket_cap = os.environ.get("DDP_SET_LAST_BUCKET_CAP") == "1"
    settings = PlanSettings(bucket_cap_mb,
                            tuple(bucket_cap_mb_list) if bucket_cap_mb_list else None,
                            find_unused_parameters, static_graph, set_last_bucket_cap)
    return _make_plan(type(module).__name__, params, specs, settings,
                      [int(i) for i in order], source, notes)


# --- the plan of a run's observed maps --------------------------------------------------------
# `observed_plan` turns a rank's ParamsBuilt and BucketAssigned events into a `BucketPlan` whose
# initial and rebuilt maps are the ones DDP actually used (a map not observed yet, e.g. the
# rebuild during iteration 0, is predicted by the planner from settings inferred from the
# observed limits, and says so in the plan's notes).

MB = 1024 * 1024
_DEFAULT_FIRST, _DEFAULT_CAP = 1 * MB, 25 * MB  # torch's default first bucket and cap
NOT_RECORDED = -1  # PlannedBucket.limit of a recorded map whose caps the recording did not know


class ObservedMaps(NamedTuple):
    """A plan built from events, and when its rebuilt map took over."""

    plan: BucketPlan
    rank: int  # whose events it was built from
    rebuilt_step: int | None  # first iteration using the rebuilt map (None: not observed)
    disagreements: tuple[str, ...]  # other ranks whose maps differ from this rank's


def _itemsize(p: ev.ParamInfo) -> int:
    size = ev.element_size_of(p)
    if not size:
        raise ValueError(f"ddpviz: ParamsBuilt names an unknown dtype {p.dtype!r} without its "
                         "element size.\nRecord the trace with a ddpviz that records it.")
    return size


def planned_params(built: ev.ParamsBuilt) -> tuple[PlannedParam, ...]:
    """The planner's description of each parameter a rank reported."""
    out = []
    for p in built.params:
        numel = math.prod(p.shape)
        size = _itemsize(p)
        out.append(PlannedParam(p.index, p.name, tuple(p.shape), p.dtype, p.device, numel, size,
                                numel * size, p.sparse_grad))
    return tuple(out)


def _cap_of(limits: Sequence[int]) -> float | None:
    """bucket_cap_mb from a map's per-bucket limits: None for torch's 1 MiB + 25 MiB default."""
    caps = [x for x in limits if 0 < x < sys.maxsize]
    if not caps:
        return None
    if caps[0] == _DEFAULT_FIRST and set(caps) <= {_DEFAULT_FIRST, _DEFAULT_CAP}:
        return None
    cap = max(caps)
    for digits in range(1, 10):  # the shortest decimal torch turns into this byte count
        mb = round(cap / MB, digits)
        if int(mb * MB) == cap:
            return mb
    return cap / MB


def recorded_limits(assigned: ev.BucketAssigned) -> tuple[int, ...]:
    """A recorded map's per-bucket caps; `NOT_RECORDED` for each where the recording did not
    know them (watch() records none where it cannot tell torch's caps: never guessed)."""
    if len(assigned.limits) == len(assigned.buckets):
        return tuple(assigned.limits)
    return (NOT_RECORDED,) * len(assigned.buckets)


def infer_settings(initial: ev.BucketAssigned, rebuilt: ev.BucketAssigned | None,
                   rebuilt_step: int | None) -> PlanSettings:
    """The DDP settings that explain the observed limits (bucket_cap_mb_list and
    DDP_SET_LAST_BUCKET_CAP are not told apart from bucket_cap_mb)."""
    unlimited = all(x in (0, sys.maxsize) for x in initial.limits)
    if rebuilt is not None:
        return PlanSettings(_cap_of(rebuilt.limits), None, False,
                            rebuilt_step is not None and rebuilt_step >= 2)
    if not unlimited:
        return PlanSettings(_cap_of(initial.limits), None, True, False)
    return PlanSettings(None, None, False, False)


def observed_plan(built: ev.ParamsBuilt, maps: Sequence[Timed], *, rank: int = 0,
                  model: str = "observed run",
                  grad_ready_order: Sequence[int] | None = None) -> ObservedMaps:
    """A BucketPlan of the maps one rank used (BucketAssigned events in order).

    Args:
        built: the rank's ParamsBuilt.
        maps: its BucketAssigned events with times (EventModel.maps()).
        grad_ready_order: iteration 0's hook order, used to predict a rebuild not seen yet.
    """
    assigned = [m.event for m in maps if isinstance(m.event, ev.BucketAssigned)]
    initial = next((a for a in assigned if not a.rebuilt), None)
    rebuilt = next((a for a in assigned if a.rebuilt), None)
    if initial is None:
        raise ValueError(f"ddpviz: rank {rank} reported no constructor BucketAssigned event.\n"
                         "Wait for the constructor to finish, or record the whole run.")
    params = planned_params(built)
    rebuilt_step = rebuilt.step if rebuilt is not None else None
    settings = infer_settings(initial, rebuilt, rebuilt_step)
    order: tuple[int, ...] = tuple(reversed(range(len(params))))
    source: Any = "predicted"
    if grad_ready_order is not None and sorted(grad_ready_order) == list(range(len(params))):
        order, source = tuple(grad_ready_order), "measured"
    # with_settings re-plans both maps (and the limits) from the settings: the seed's own
    # limits and maps are placeholders it never reads
    seed = BucketPlan(model, params, settings, Limits([sys.maxsize], None, False), (), None,
                      order, source)
    predicted = seed.with_settings()
    notes = [f"initial map observed on rank {rank} (BucketAssigned in the constructor)"]
    rebuilt_buckets = predicted.rebuilt
    if rebuilt is not None:
        rebuilt_buckets = planned_buckets(params, rebuilt.buckets, recorded_limits(rebuilt))
        notes.append(f"rebuilt map observed on rank {rank} (iteration {rebuilt_step} on)")
    elif predicted.rebuilt is not None:
        notes.append("rebuilt map predicted by the planner: not rebuilt yet in this run")
    plan = replace(
        predicted, initial=planned_buckets(params, initial.buckets, recorded_limits(initial)),
        rebuilt=rebuilt_buckets, notes=tuple(notes) + tuple(
            n for n in predicted.notes if n.startswith("torch never rebuilds")))
    return ObservedMaps(plan, rank, rebuilt_step, ())


# --- the plan as text: `print(plan)` and `ddpviz buckets` ----------------------------------
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


def limit_text(b: PlannedBucket) -> str:
    """A bucket's cap in words: 'sparse', 'not recorded', 'unlimited' or bytes."""
    if b.sparse:
        return "sparse"
    return "not recorded" if b.limit == NOT_RECORDED else human_bytes(b.limit)


def _bucket_table(buckets: tuple[PlannedBucket, ...], max_params: int) -> list[str]:
    width = min(60, max((len(s.param.name) for b in buckets for s in b.slots), default=10))
    lines = [f"  {'bucket':>6}  {'params':>6}  {'dtype':<9} {'device':<7} {'numel':>11} "
             f"{'bytes':>10}  {'limit':>10}"]
    for b in buckets:
        lines.append(f"  {b.index:>6}  {len(b.slots):>6}  {b.dtype:<9} {b.device:<7} "
                     f"{b.numel:>11,} {human_bytes(b.nbytes):>10}  "
                     f"{limit_text(b):>10}")
        shown = b.slots if len(b.slots) <= max_params else b.slots[: max_params - 1]
        for s in shown:
            shape = "x".join(map(str, s.param.shape)) or "scalar"
            lines.append(f"  {'':>6}    [{s.param.index:>4}] {s.param.name:<{width}} {shape:<14} "
                         f"@{s.offset:,}")
        if len(shown) < len(b.slots):
            lines.append(f"  {'':>6}    ... {len(b.slots) - len(shown)} more")
    return lines


def _format_plan(plan: BucketPlan, max_params_per_bucket: int = 12) -> str:
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
