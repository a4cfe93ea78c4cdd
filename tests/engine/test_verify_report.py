"""Verification without processes: describing a module, comparing ranks' metadata, grouping and
the error message. Multi-rank runs are in tests/dist/test_verify.py."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from ddpviz.engine.verify import (
    BufferMeta,
    ModelComparison,
    ParamMeta,
    RankMetadata,
    _canonical,
    compare_ranks,
    decode_metadata,
    describe_module,
    encode_metadata,
    format_mismatches,
    format_ranks,
    group_ranks,
)
from ddpviz.errors import RankMismatchError
from ddpviz.events import Mismatch

FIX = "All ranks must build the same model; look for rank-dependent construction."


def param(name: str, shape: tuple[int, ...], dtype: str = "float32", *,
          stride: tuple[int, ...] | None = None, device: str = "cpu",
          requires_grad: bool = True) -> ParamMeta:
    if stride is None:
        stride = tuple(int(torch.empty(shape, device="meta").stride()[i])
                       for i in range(len(shape)))
    return ParamMeta(name, shape, stride, dtype, device, requires_grad, False)


def rank(r: int, params: list[ParamMeta], buffers: tuple[BufferMeta, ...] = (),
         host: str = "node0", cuda_index: int = -1) -> RankMetadata:
    return RankMetadata(r, host, cuda_index, tuple(params), buffers)


def report(metadata: list[RankMetadata]) -> ModelComparison:
    return ModelComparison(len(metadata), 0, "0" * 16, compare_ranks(metadata),
                              tuple(metadata), 2)


MLP = [param("layer0.weight", (8, 4)), param("layer0.bias", (8,)),
       param("layer1.weight", (8, 8)), param("layer1.bias", (8,))]


# --- grouping ----------------------------------------------------------------------------------


def test_group_ranks_puts_the_most_common_value_first_then_the_lowest_rank() -> None:
    assert group_ranks({0: "b", 1: "a", 2: "a", 3: "c"}) == (
        ("a", (1, 2)), ("b", (0,)), ("c", (3,)))
    assert group_ranks({2: "x", 0: "y", 1: "x"}) == (("x", (1, 2)), ("y", (0,)))
    assert group_ranks({1: "z", 0: "y"}) == (("y", (0,)), ("z", (1,)))


def test_format_ranks_lists_short_runs_and_collapses_long_ones() -> None:
    assert format_ranks([3]) == "rank 3"
    assert format_ranks([2, 0, 1]) == "ranks 0,1,2"
    assert format_ranks([0, 1, 2, 3, 5, 7, 8, 9, 10, 11]) == "ranks 0-3,5,7-11"


# --- the house-style message -------------------------------------------------------------------


def test_one_parameter_differing_reads_exactly_like_the_house_style_example() -> None:
    params = [param(f"layer{i}.weight", (8, 8)) for i in range(7)]
    good = [*params, param("layer2.weight", (128, 64))]
    bad = [*params, param("layer2.weight", (64, 128))]
    # Names must be unique: rename the filler so that 'layer2.weight' sits at index 7.
    good[2] = bad[2] = param("layer2.bias", (8, 8))
    metadata = [rank(0, good), rank(1, good), rank(2, good), rank(3, bad)]
    r = report(metadata)
    assert r.mismatches == (Mismatch("param", 7, "layer2.weight", "shape",
                                     (("(128, 64)", (0, 1, 2)), ("(64, 128)", (3,)))),)
    assert r.message() == (
        "ddpviz: parameter 7 'layer2.weight' differs across ranks (world_size=4):\n"
        "  ranks 0,1,2: shape=(128, 64) dtype=float32\n"
        "  rank 3:      shape=(64, 128) dtype=float32\n"
        + FIX)


def test_several_differences_get_a_count_header_then_one_block_each() -> None:
    odd = [param("layer0.weight", (8, 4), "bfloat16"), *MLP[1:3], param("layer1.bias", (9,))]
    text = report([rank(0, MLP), rank(1, odd)]).message()
    assert text == "\n".join([
        "ddpviz: the model differs across ranks in 2 places (world_size=2):",
        "parameter 0 'layer0.weight' differs across ranks:",
        "  rank 0: shape=(8, 4) dtype=float32",
        "  rank 1: shape=(8, 4) dtype=bfloat16",
        "parameter 3 'layer1.bias' differs across ranks:",
        "  rank 0: shape=(8,) dtype=float32",
        "  rank 1: shape=(9,) dtype=float32",
        FIX,
    ])


def test_a_field_is_shown_next_to_the_shape_and_dtype_context() -> None:
    channels_last = param("layer0.weight", (8, 4), stride=(1, 8))
    text = report([rank(0, MLP), rank(1, [channels_last, *MLP[1:]])]).message()
    assert "  rank 1: shape=(8, 4) stride=(1, 8) dtype=float32" in text
    frozen = param("layer0.bias", (8,), requires_grad=False)
    text = report([rank(0, MLP), rank(1, [MLP[0], frozen, *MLP[2:]])]).message()
    assert "  rank 1: shape=(8,) dtype=float32 requires_grad=False" in text


# --- alignment by name -------------------------------------------------------------------------


def test_an_extra_parameter_is_reported_as_itself_not_as_a_cascade() -> None:
    extra = [*MLP[:2], param("mid.weight", (8, 8)), param("mid.bias", (8,)), *MLP[2:]]
    r = report([rank(0, MLP), rank(1, MLP), rank(2, extra)])
    assert r.mismatches == (
        Mismatch("count", -1, "parameters", "count", (("4", (0, 1)), ("6", (2,)))),
        Mismatch("param", 2, "mid.weight", "present", (("missing", (0, 1)), ("present", (2,)))),
        Mismatch("param", 3, "mid.bias", "present", (("missing", (0, 1)), ("present", (2,)))),
    )
    assert "  rank 2:    shape=(8, 8) dtype=float32" in r.message()
    assert "  ranks 0,1: missing" in r.message()


def test_a_parameter_missing_on_rank_0_is_indexed_on_the_first_rank_that_has_it() -> None:
    r = report([rank(0, MLP[:3]), rank(1, MLP)])
    assert r.mismatches[1] == Mismatch("param", 3, "layer1.bias", "present",
                                       (("missing", (0,)), ("present", (1,))))
    assert r.message().splitlines()[4] == "parameter 3 'layer1.bias' is missing on some ranks:"


def test_a_renamed_parameter_is_one_name_mismatch_and_other_fields_still_compared() -> None:
    renamed = [*MLP[:3], param("head.bias", (9,))]
    r = report([rank(0, MLP), rank(1, MLP), rank(2, renamed)])
    assert r.mismatches == (
        Mismatch("param", 3, "layer1.bias", "name",
                 (("'layer1.bias'", (0, 1)), ("'head.bias'", (2,)))),
        Mismatch("param", 3, "layer1.bias", "shape", (("(8,)", (0, 1)), ("(9,)", (2,)))),
    )
    assert r.message().splitlines()[1:3] == [
        "  ranks 0,1: name='layer1.bias' shape=(8,) dtype=float32",
        "  rank 2:    name='head.bias' shape=(9,) dtype=float32",
    ]


def test_registration_order_is_its_own_field() -> None:
    swapped = [MLP[2], MLP[3], MLP[0], MLP[1]]
    r = report([rank(0, MLP), rank(1, swapped)])
    assert [(m.name, m.field, m.values) for m in r.mismatches] == [
        ("layer0.weight", "order", (("0", (0,)), ("2", (1,)))),
        ("layer0.bias", "order", (("1", (0,)), ("3", (1,)))),
        ("layer1.weight", "order", (("2", (0,)), ("0", (1,)))),
        ("layer1.bias", "order", (("3", (0,)), ("1", (1,)))),
    ]
    assert "parameter 'layer0.weight' is registered at a different position on some ranks:" in (
        r.message())
    assert "  rank 1: index=2 shape=(8, 4) dtype=float32" in r.message()


def test_an_extra_parameter_does_not_count_as_a_reordering() -> None:
    extra = [param("first.weight", (2,)), *MLP]
    assert [m.field for m in compare_ranks([rank(0, MLP), rank(1, extra)])] == [
        "count", "present"]


def test_buffers_are_compared_by_shape_dtype_and_order() -> None:
    bufs = (BufferMeta("running_mean", (8,), "float32", "cpu"),
            BufferMeta("num_batches_tracked", (), "int64", "cpu"))
    odd = (BufferMeta("num_batches_tracked", (), "int32", "cpu"),
           BufferMeta("running_mean", (8,), "float32", "cpu"))
    r = report([rank(0, MLP, bufs), rank(1, MLP, odd)])
    assert [(m.kind, m.index, m.name, m.field) for m in r.mismatches] == [
        ("buffer", 0, "running_mean", "order"),
        ("buffer", 1, "num_batches_tracked", "order"),
        ("buffer", 1, "num_batches_tracked", "dtype"),
    ]
    assert "  rank 1: index=0 shape=() dtype=int32" in r.message()


# --- devices -----------------------------------------------------------------------------------


def test_cuda_index_differences_across_ranks_are_normal() -> None:
    r0 = rank(0, [param("w", (4,), device="cuda:0")], cuda_index=0)
    r1 = rank(1, [param("w", (4,), device="cuda:1")], cuda_index=1)
    assert compare_ranks([r0, r1]) == ()
    assert _canonical(r0) == _canonical(r1._replace(rank=0))  # same digest on the cheap path


def test_the_same_gpu_index_on_different_hosts_is_normal() -> None:
    r0 = rank(0, [param("w", (4,), device="cuda:0")], host="a", cuda_index=0)
    r1 = rank(1, [param("w", (4,), device="cuda:0")], host="b", cuda_index=0)
    assert compare_ranks([r0, r1]) == ()


def test_cpu_against_cuda_is_a_device_mismatch() -> None:
    r0 = rank(0, [param("w", (4,))])
    r1 = rank(1, [param("w", (4,), device="cuda:1")], cuda_index=1)
    assert compare_ranks([r0, r1]) == (
        Mismatch("param", 0, "w", "device", (("cpu", (0,)), ("cuda", (1,)))),)


def test_two_ranks_on_one_host_sharing_a_gpu_get_their_own_fix() -> None:
    ws = [rank(r, [param("w", (4,), device=f"cuda:{min(r, 1)}")], cuda_index=min(r, 1))
          for r in range(3)]
    r = report(ws)
    assert r.mismatches == (Mismatch("device", -1, "", "cuda_device",
                                     (("cuda:1 on node0", (1, 2)), ("cuda:0 on node0", (0,)))),)
    lines = r.message().splitlines()
    assert lines[0] == "ddpviz: ranks on one host use the same GPU (world_size=3):"
    assert lines[1:3] == ["  ranks 1,2: cuda:1 on node0", "  rank 0:    cuda:0 on node0"]
    assert lines[-1].startswith("Give each rank its own GPU: call torch.cuda.set_device")


# --- describing a real module ------------------------------------------------------------------


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.dec = nn.Linear(4, 10, bias=False)
        self.dec.weight = self.emb.weight  # tied: listed once, under its first name
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.bn = nn.BatchNorm1d(4)


def test_describe_module_lists_params_once_with_flags_and_applies_the_ignore_list() -> None:
    m = Tied()
    meta = describe_module(m, host="h")
    assert [(p.name, p.requires_grad, p.sparse_grad) for p in meta.params] == [
        ("scale", True, False), ("emb.weight", True, True), ("frozen.weight", False, False),
        ("frozen.bias", False, False), ("bn.weight", True, False), ("bn.bias", True, False)]
    assert [b.name for b in meta.buffers] == [
        "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert meta.params[0] == ParamMeta("scale", (2,), (1,), "float32", "cpu", True, False)
    assert meta.cuda_index == -1 and meta.host == "h"
    ignore = {"frozen.weight", "bn.running_var", "scale"}
    names = [p.name for p in describe_module(m, ignore).params]
    # Root-level "scale" stays: DDP's reducer matches ".scale" and still reduces it.
    assert names == ["scale", "emb.weight", "frozen.bias", "bn.weight", "bn.bias"]
    assert [b.name for b in describe_module(m, ignore).buffers] == [
        "bn.running_mean", "bn.num_batches_tracked"]


def test_describe_module_never_raises_on_a_lazy_module() -> None:
    meta = describe_module(nn.Sequential(nn.LazyLinear(3)))
    assert meta.params[0].shape is None and meta.params[0].stride is None
    good = describe_module(nn.Sequential(nn.Linear(2, 3)))
    text = report([good, meta._replace(rank=1)]).message()
    assert "  rank 1: shape=uninitialized dtype=float32" in text


def test_metadata_survives_the_json_round_trip() -> None:
    meta = describe_module(Tied(), host="node7")._replace(rank=3)
    assert decode_metadata(encode_metadata(meta)) == meta
    assert b"(" not in encode_metadata(meta)  # plain JSON, no pickle


# --- the report and the error ------------------------------------------------------------------


def test_an_ok_report_does_not_raise_and_says_so() -> None:
    r = report([rank(0, MLP), rank(1, MLP)])
    assert r.ok
    r.raise_if_failed()
    assert r.message() == "ddpviz: the model is the same on all 2 ranks (4 parameters, 0 buffers)."


def test_the_error_carries_the_report_and_survives_pickling() -> None:
    r = report([rank(0, MLP), rank(1, MLP[:3])])
    with pytest.raises(RankMismatchError) as info:
        r.raise_if_failed()
    assert isinstance(info.value, RuntimeError)
    assert info.value.report is r and str(info.value) == r.message()
    again = pickle.loads(pickle.dumps(info.value))
    assert again.report.mismatches == r.mismatches and str(again) == str(info.value)


def test_format_mismatches_works_without_metadata() -> None:
    m = Mismatch("param", 2, "fc.weight", "dtype", (("float32", (0, 1)), ("float16", (2,))))
    assert format_mismatches([m], 3) == (
        "ddpviz: parameter 2 'fc.weight' differs across ranks (world_size=3):\n"
        "  ranks 0,1: dtype=float32\n"
        "  rank 2:    dtype=float16\n" + FIX)
