"""ddpviz.bucket_plan without processes: parameter collection, capacity rules, plan views.

Parameter collection is compared with torch's own `DistributedDataParallel.
_build_params_for_reducer`, called on a stand-in `self` (it reads only `module`,
`parameters_to_ignore` and calls `_assign_modules_buffers`), so no process group is needed.
The multi-rank proof that the maps equal what the reducer really uses is in
tests/dist/test_plan_vs_torch.py.
"""

from __future__ import annotations

import itertools
import json
import sys
import types

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddpviz.engine.params import build_buffers, build_params_for_reducer
from ddpviz.plan import bucket_plan, compute_bucket_assignment_by_size

MiB = 1024 * 1024


def torch_params_for_reducer(module: nn.Module) -> tuple[list[nn.Parameter], list[bool]]:
    """torch's own `_build_params_for_reducer`, run on a stand-in for the DDP object."""
    ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
    fake_ddp = types.SimpleNamespace(module=module, parameters_to_ignore=ignore,
                                     _assign_modules_buffers=lambda: None)
    params, sparse = DistributedDataParallel._build_params_for_reducer(fake_ddp)  # type: ignore[arg-type]
    return list(params), [bool(s) for s in sparse]


def first_names(module: nn.Module) -> dict[int, str]:
    """Dotted name of each parameter's first occurrence (named_modules x recurse=False)."""
    names: dict[int, str] = {}
    for mname, sub in module.named_modules():
        for pname, p in sub.named_parameters(recurse=False):
            names.setdefault(id(p), f"{mname}.{pname}" if mname else pname)
    return names


class MLP(nn.Module):
    def __init__(self, sizes=(6, 16, 16, 4)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight
        self.shared = self.block  # the same submodule under a second name

    def forward(self, tokens):
        return self.head(self.shared(self.embed(tokens)))


class SparseModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense_in = nn.Linear(4, 4)
        self.emb = nn.Embedding(30, 4, sparse=True)
        self.bag = nn.EmbeddingBag(30, 4, sparse=True, mode="sum")
        self.plain = nn.Embedding(30, 4, sparse=False)
        self.out = nn.Linear(4, 2)

    def forward(self, tokens):
        h = self.emb(tokens).sum(1) + self.bag(tokens) + self.plain(tokens).sum(1)
        return self.out(h + self.dense_in(h))


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.c = nn.Linear(3, 3)
        self.b.weight.requires_grad_(False)
        self.root_scale = nn.Parameter(torch.ones(3))
        self.register_buffer("steps", torch.zeros(()))
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.c(self.bn(self.b(self.a(x)))) * self.root_scale


def mixed_model() -> nn.Module:
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    m[1].to(torch.bfloat16)
    m[3].to(torch.float64)
    return m


MODELS = {
    "mlp": lambda: MLP(),
    "tied": Tied,
    "sparse": SparseModel,
    "frozen": Frozen,
    "mixed": mixed_model,
    "conv": lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.Conv2d(4, 4, 3, bias=False), nn.Flatten(), nn.Linear(4, 3)),
}


# --- parameter collection ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_params_match_torch_build_params_for_reducer(name):
    model = MODELS[name]()
    expected, expected_sparse = torch_params_for_reducer(model)
    entries = build_params_for_reducer(model)
    assert [id(e.param) for e in entries] == [id(p) for p in expected]
    assert [e.sparse_grad for e in entries] == expected_sparse
    assert [e.index for e in entries] == list(range(len(entries)))
    names = first_names(model)
    plan = bucket_plan(model)
    assert [p.name for p in plan.params] == [names[id(p)] for p in expected]
    assert [p.shape for p in plan.params] == [tuple(p.shape) for p in expected]
    assert [p.sparse_grad for p in plan.params] == expected_sparse


def test_ignore_list_applied_like_torch():
    model = MLP()
    model._ddp_params_and_buffers_to_ignore = ["layers.1.weight", "layers.2.bias"]  # type: ignore[assignment]
    expected, _ = torch_params_for_reducer(model)
    plan = bucket_plan(model)
    names = [p.name for p in plan.params]
    assert "layers.1.weight" not in names and "layers.2.bias" not in names
    assert [p.name for p in plan.params] == [first_names(model)[id(p)] for p in expected]
    assert len(plan.params) == 4


def test_root_level_name_in_ignore_list_is_not_ignored_by_reducer():
    # torch builds f"{module_name}.{param_name}" = ".root_scale" for the root's own parameters,
    # so "root_scale" in the ignore list does not remove it from the reducer.
    model = Frozen()
    model._ddp_params_and_buffers_to_ignore = ["root_scale", "steps"]  # type: ignore[assignment]
    expected, _ = torch_params_for_reducer(model)
    assert any(p is model.root_scale for p in expected)
    assert [e.param for e in build_params_for_reducer(model)] == expected
    assert "steps" not in [n for n, _ in build_buffers(model)]


def test_tied_and_shared_parameters_once():
    model = Tied()
    plan = bucket_plan(model)
    names = [p.name for p in plan.params]
    assert names == ["embed.weight", "block.0.weight", "block.0.bias"]
    assert sum(1 for _ in model.named_parameters(remove_duplicate=False)) == 6


def test_requires_grad_false_skipped():
    plan = bucket_plan(Frozen())
    names = [p.name for p in plan.params]
    assert "b.weight" not in names
    assert names == ["root_scale", "a.weight", "a.bias", "b.bias", "c.weight", "c.bias",
                     "bn.weight", "bn.bias"]


def test_sparse_embedding_flags_and_own_buckets():
    plan = bucket_plan(SparseModel())
    flagged = [p.name for p in plan.params if p.sparse_grad]
    assert flagged == ["emb.weight", "bag.weight"]
    for which in ("initial", "rebuilt"):
        sparse_buckets = [b for b in plan.buckets(which) if b.sparse]
        assert sorted(b.names for b in sparse_buckets) == [("bag.weight",), ("emb.weight",)]
        assert all(b.limit == 0 for b in sparse_buckets)
        assert all(not p.sparse_grad for b in plan.buckets(which) if not b.sparse
                   for p in (s.param for s in b.slots))


def test_meta_device_model_plans_like_cpu_model():
    cpu = MLP(sizes=(512, 1024, 1024, 8))
    with torch.device("meta"):
        meta = MLP(sizes=(512, 1024, 1024, 8))
    assert next(meta.parameters()).is_meta
    for kwargs in ({}, {"bucket_cap_mb": 1}, {"find_unused_parameters": True}):
        a, b = bucket_plan(cpu, **kwargs), bucket_plan(meta, **kwargs)
        assert a.bucket_indices("initial") == b.bucket_indices("initial")
        assert b.params[0].device == "meta"
    measured = bucket_plan(meta, example_inputs=torch.empty(2, 512, device="meta"))
    assert measured.order_source == "measured"
    assert measured.grad_ready_order == bucket_plan(
        cpu, example_inputs=torch.randn(2, 512)).grad_ready_order


def test_nothing_requires_grad_raises():
    model = MLP()
    model.requires_grad_(False)
    with pytest.raises(ValueError, match=r"^ddpviz: DistributedDataParallel is not needed"):
        bucket_plan(model)
    model = MLP()
    model._ddp_params_and_buffers_to_ignore = [n for n, _ in model.named_parameters()]  # type: ignore[assignment]
    with pytest.raises(ValueError, match="none trainable and not ignored"):
        bucket_plan(model)


def test_uninitialized_parameter_raises():
    model = nn.Sequential(nn.LazyLinear(3))
    with pytest.raises(ValueError, match="uninitialized"):
        bucket_plan(model)


# --- capacity rules ---------------------------------------------------------------------------


class Cast(nn.Module):
    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype)


def big_model() -> nn.Module:
    # ~3.4 MiB of fp32 in 6 tensors plus a bf16 layer: splits under every cap below
    m = nn.Sequential(nn.Linear(256, 1024), nn.Linear(1024, 512), nn.Linear(512, 256),
                      Cast(torch.bfloat16), nn.Linear(256, 64))
    m[4].to(torch.bfloat16)
    return m


def test_default_capacity_one_bucket_per_dtype_then_1_and_25_mib():
    plan = bucket_plan(big_model())
    assert plan.limits.initial == [sys.maxsize]
    assert plan.limits.rebuild == [MiB, 25 * MiB]
    assert sorted(b.dtype for b in plan.initial) == ["bfloat16", "float32"]
    assert plan.rebuilds
    assert [b.limit for b in plan.buckets("rebuilt") if b.dtype == "float32"] == [MiB, 25 * MiB]
    # reduction order: reversed registration order; bucket 0 holds the last layer
    assert plan.initial[0].dtype == "bfloat16"


def test_explicit_cap_uses_same_cap_first():
    plan = bucket_plan(big_model(), bucket_cap_mb=1)
    assert plan.limits.initial == [sys.maxsize]
    assert plan.limits.rebuild == [MiB, MiB]
    plan = bucket_plan(big_model(), bucket_cap_mb=25)
    assert plan.limits.rebuild == [25 * MiB, 25 * MiB]  # not the default's [1 MiB, 25 MiB]
    plan = bucket_plan(big_model(), bucket_cap_mb=0.5)
    assert plan.limits.rebuild == [MiB // 2, MiB // 2]
    assert all(b.nbytes >= MiB // 2 for b in plan.buckets("rebuilt")[:-2])


def test_bucket_cap_mb_list_used_for_both_maps():
    plan = bucket_plan(big_model(), bucket_cap_mb_list=[0.25, 1, 2])
    expected = [MiB // 4, MiB, 2 * MiB]
    assert plan.limits.initial == expected
    assert plan.limits.rebuild == expected
    assert plan.settings.bucket_cap_mb_list == (0.25, 1, 2)
    fp32 = [b for b in plan.initial if b.dtype == "float32"]
    assert len(fp32) > 1


def test_find_unused_initial_1_and_25_mib_never_rebuilt():
    plan = bucket_plan(big_model(), find_unused_parameters=True)
    assert plan.limits.initial == [MiB, 25 * MiB]
    assert plan.limits.rebuild is None
    assert plan.rebuilt is None and not plan.rebuilds
    assert any("never rebuilds" in n for n in plan.notes)
    with pytest.raises(ValueError, match="no rebuilt map"):
        plan.buckets("rebuilt")
    # the small bucket holds the first-registered parameters and is reduced last
    fp32 = [b for b in plan.initial if b.dtype == "float32"]
    assert fp32[-1].limit == MiB and 0 in fp32[-1].param_indices
    explicit = bucket_plan(big_model(), find_unused_parameters=True, bucket_cap_mb=2)
    assert explicit.limits.initial == [2 * MiB]


def test_static_graph_rebuilds_even_with_find_unused():
    for fu in (False, True):
        plan = bucket_plan(big_model(), static_graph=True, find_unused_parameters=fu)
        assert plan.limits.initial == [sys.maxsize]
        assert plan.limits.rebuild == [MiB, 25 * MiB]
        assert plan.rebuilt is not None


def test_set_last_bucket_cap_puts_small_bucket_last(monkeypatch):
    plan = bucket_plan(big_model(), set_last_bucket_cap=True)
    fp32 = [b for b in plan.buckets("rebuilt") if b.dtype == "float32"]
    assert fp32[-1].limit == MiB and fp32[0].limit == 25 * MiB
    monkeypatch.setenv("DDP_SET_LAST_BUCKET_CAP", "1")
    assert bucket_plan(big_model()).settings.set_last_bucket_cap
    monkeypatch.setenv("DDP_SET_LAST_BUCKET_CAP", "0")
    assert not bucket_plan(big_model()).settings.set_last_bucket_cap


def test_negative_caps_raise():
    with pytest.raises(ValueError, match="bucket_cap_mb must be >= 0"):
        bucket_plan(MLP(), bucket_cap_mb=-1)
    with pytest.raises(ValueError, match="bucket_cap_mb_list entries must be >= 0"):
        bucket_plan(MLP(), bucket_cap_mb_list=[1, -2])


# --- the maps themselves ----------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"bucket_cap_mb": 1}, {"bucket_cap_mb_list": [0.5, 3]},
                                    {"find_unused_parameters": True}, {"static_graph": True}])
def test_maps_equal_the_assignment_function(kwargs):
    model = big_model()
    plan = bucket_plan(model, **kwargs)
    params = [e.param for e in build_params_for_reducer(model)]
    buckets, limits = compute_bucket_assignment_by_size(params, plan.limits.initial)
    assert plan.bucket_indices("initial") == buckets[::-1]
    assert [b.limit for b in plan.initial] == limits[::-1]
    if plan.limits.rebuild is not None:
        order = list(plan.grad_ready_order)
        rb, rl = compute_bucket_assignment_by_size([params[i] for i in order],
                                                   plan.limits.rebuild, [], order)
        assert plan.bucket_indices("rebuilt") == rb
        assert [b.limit for b in plan.buckets("rebuilt")] == rl


@pytest.mark.parametrize("name", sorted(MODELS))
def test_offsets_contiguous_and_every_param_once(name):
    plan = bucket_plan(MODELS[name](), bucket_cap_mb=0.0005)
    for buckets in (plan.initial, plan.rebuilt):
        assert buckets is not None
        seen = sorted(i for b in buckets for i in b.param_indices)
        assert seen == list(range(len(plan.params)))
        assert [b.index for b in buckets] == list(range(len(buckets)))
        for b in buckets:
            offset = byte_offset = 0
            for s in b.slots:
                assert (s.offset, s.byte_offset) == (offset, byte_offset)
                assert s.param.dtype == b.dtype and s.param.device == b.device
                offset += s.param.numel
                byte_offset += s.param.numel * s.param.element_size
            assert (b.numel, b.nbytes) == (offset, byte_offset)


def test_with_settings_replans_like_a_fresh_plan():
    model = big_model()
    base = bucket_plan(model, example_inputs=torch.randn(2, 256))
    for changes in ({"bucket_cap_mb": 1}, {"bucket_cap_mb_list": [0.5, 2]},
                    {"find_unused_parameters": True}, {"static_graph": True},
                    {"set_last_bucket_cap": True}):
        replanned = base.with_settings(**changes)
        fresh = bucket_plan(model, grad_ready_order=list(base.grad_ready_order), **changes)
        assert replanned.bucket_indices("initial") == fresh.bucket_indices("initial")
        assert replanned.limits == fresh.limits
        assert replanned.rebuilt == fresh.rebuilt
        assert replanned.grad_ready_order == base.grad_ready_order
    assert base.with_settings(bucket_cap_mb_list=[1]).settings.bucket_cap_mb_list == (1,)


def test_to_records_and_to_json():
    plan = bucket_plan(Tied(), bucket_cap_mb=0.0001, example_inputs=torch.tensor([[1, 2, 3]]))
    records = plan.to_records()
    n = len(plan.params)
    assert [r["map"] for r in records] == ["initial"] * n + ["rebuilt"] * n
    first = records[0]
    b0 = plan.initial[0]
    assert first["bucket"] == 0 and first["param_index"] == b0.param_indices[0]
    assert first["name"] == b0.names[0] and first["offset"] == 0
    assert first["bucket_limit"] == b0.limit and first["bucket_bytes"] == b0.nbytes
    data = json.loads(plan.to_json())
    assert data["model"] == "Tied"
    assert data["limits"] == {"initial": plan.limits.initial, "rebuild": plan.limits.rebuild}
    assert data["grad_ready_order"] == list(plan.grad_ready_order)
    assert data["settings"]["bucket_cap_mb"] == 0.0001
    assert data["buckets"] == records


def test_str_table_shows_buckets_and_names():
    plan = bucket_plan(big_model(), example_inputs=torch.randn(2, 256))
    text = str(plan)
    assert text.startswith("BucketPlan for Sequential: 8 parameters")
    assert "Initial buckets (iteration 0), in reduction order: 2" in text
    assert f"in reduction order: {len(plan.buckets('rebuilt'))}" in text
    assert "gradient-ready order measured" in text
    for p in plan.params:
        assert p.name in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(2)) + list(range(len(plan.buckets("rebuilt"))))
    assert "unlimited" in text and "1.0 MiB" in text
    lone = str(bucket_plan(big_model(), find_unused_parameters=True))
    assert "rebuild never" in lone and "Rebuilt buckets" not in lone


# --- gradient-ready order ---------------------------------------------------------------------


def test_measured_order_on_mlp_is_last_layer_first_bias_before_weight():
    model = MLP()
    plan = bucket_plan(model, example_inputs=torch.randn(3, 6))
    assert plan.order_source == "measured"
    names = [plan.params[i].name for i in plan.grad_ready_order]
    assert names == ["layers.2.bias", "layers.2.weight", "layers.1.bias", "layers.1.weight",
                     "layers.0.bias", "layers.0.weight"]
    # the copy was measured, not the model
    assert all(p.grad is None for p in model.parameters())


def test_example_inputs_as_tuple_and_dict():
    class TwoIn(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x, y):
            return {"out": self.b(y) * self.a(x).sum()}

    order_t = bucket_plan(TwoIn(), example_inputs=(torch.ones(1, 2), torch.ones(1, 2)))
    order_d = bucket_plan(TwoIn(), example_inputs={"x": torch.ones(1, 2), "y": torch.ones(1, 2)})
    assert order_t.grad_ready_order == order_d.grad_ready_order
    assert sorted(order_t.grad_ready_order) == [0, 1, 2, 3]


def test_unused_parameter_noted_and_put_last():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused, self.out = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 1)

        def forward(self, x):
            return self.out(self.used(x))

    plan = bucket_plan(Branchy(), example_inputs=torch.ones(1, 2))
    assert list(plan.grad_ready_order[-2:]) == [2, 3]  # unused.weight, unused.bias
    assert any("2 parameter(s) got no gradient" in n and "unused.weight" in n
               for n in plan.notes)


def test_grad_ready_order_by_names_equals_by_indices():
    model = MLP()
    names = ["layers.0.weight", "layers.2.bias", "layers.1.weight", "layers.0.bias",
             "layers.2.weight", "layers.1.bias"]
    by_name = bucket_plan(model, grad_ready_order=names, bucket_cap_mb=0.0003)
    index = {p.name: p.index for p in by_name.params}
    by_index = bucket_plan(model, grad_ready_order=[index[n] for n in names],
                           bucket_cap_mb=0.0003)
    assert by_name.order_source == "given"
    assert by_name.grad_ready_order == tuple(index[n] for n in names)
    assert by_name.rebuilt == by_index.rebuilt
    assert by_name.buckets("rebuilt")[0].param_indices[0] == 0


def test_predicted_order_without_inputs_is_reverse_registration():
    plan = bucket_plan(MLP())
    assert plan.order_source == "predicted"
    assert plan.grad_ready_order == (5, 4, 3, 2, 1, 0)
    assert any("predicted" in n for n in plan.notes)


@pytest.mark.parametrize("order, message", [
    (["layers.0.weight", "nope"], "unknown parameter 'nope'"),
    ([0, 1, 2, 3, 4], "each of the 6 parameters exactly once; got 5"),
    ([0, 1, 2, 3, 4, 4], "exactly once; got 6"),
    ([0, 1, 2, 3, 4, 6], "exactly once"),
])
def test_bad_grad_ready_order_raises(order, message):
    with pytest.raises(ValueError, match=message):
        bucket_plan(MLP(), grad_ready_order=order)


def test_output_without_grad_raises():
    class NoGrad(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x):
            return self.a(x).argmax()

    with pytest.raises(ValueError, match="no tensor that requires grad"):
        bucket_plan(NoGrad(), example_inputs=torch.ones(1, 2))
