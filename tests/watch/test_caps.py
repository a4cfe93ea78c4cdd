"""watch(ddp) records each bucket's byte cap as torch used it (bucket_cap_mb, DDP's first-bucket
cap, sys.maxsize for the constructor's one bucket per dtype and device), never the bucket's
size; where ddpviz's replay of torch's assignment does not give the map torch built, or the
buckets were learned from the comm hook (guard=True with sparse gradients), no caps are
recorded and the report says "not recorded".

Real gloo ranks. The oracle is torch's own assignment function with the limits torch's DDP
computes for itself (`_bucket_config.compute_bucket_size_limits`; the rebuild: the first-bucket
cap then bucket_cap_mb over the recorded gradient-ready order).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist.harness import run_ranks
from tests.recordings import recording

pytestmark = pytest.mark.dist


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 8))


def _torch_caps(ddp: Any, order: list[int] | None) -> dict[tuple[int, ...], int]:
    """Bucket -> cap, from torch's own assignment: the constructor's (order None) or the
    rebuild over `order` (the parameters in gradient-ready order)."""
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    config = ddp._bucket_config
    if order is None:
        limits, _ = config.compute_bucket_size_limits(
            static_graph=ddp.static_graph, find_unused_parameters=ddp.find_unused_parameters)
        buckets, caps = dist._compute_bucket_assignment_by_size(params, limits,
                                                                [False] * len(params))
    else:
        limits = [config.first_bucket_bytes_cap, config.bucket_bytes_cap]
        buckets, caps = dist._compute_bucket_assignment_by_size(
            [params[i] for i in order], limits, [False] * len(params), order)
    return {tuple(b): int(c) for b, c in zip(buckets, caps, strict=True)}


def _watched(ddp: Any, label: str, x: torch.Tensor) -> list[Any]:
    import ddpviz
    from ddpviz import events as ev

    got: list[Any] = []
    w = ddpviz.watch(ddp, emitter=got.append, hang_timeout=0, recording=recording(label))
    for _ in range(2):  # the map is rebuilt after step 0's backward, read at step 1's forward
        ddp(x).sum().backward()
    w.close()
    return [e for e in got if isinstance(e, ev.BucketAssigned | ev.GradReady)]


def caps_rank(rank: int, world_size: int) -> dict[str, Any]:
    from ddpviz import events as ev

    x = torch.randn(4, 64)
    out: dict[str, Any] = {}
    # the default; a small cap (one bucket at construction, several rebuilt); a small cap with
    # find_unused_parameters (torch buckets at construction, and never rebuilds)
    cases: tuple[tuple[str, dict[str, Any]], ...] = (
        ("default", {}), ("small cap", {"bucket_cap_mb": 0.1}),
        ("small cap, unused", {"bucket_cap_mb": 0.1, "find_unused_parameters": True}))
    for name, options in cases:
        ddp = nn.parallel.DistributedDataParallel(_model(), **options)
        expected = [(False, _torch_caps(ddp, None))]
        seen = _watched(ddp, "light", x)
        if not ddp.find_unused_parameters:  # torch rebuilds over step 0's gradient-ready order
            order = [e.param for e in seen if isinstance(e, ev.GradReady) and e.step == 0]
            expected.append((True, _torch_caps(ddp, order)))
        out[name] = {"recorded": [(e.rebuilt, dict(zip(e.buckets, e.limits, strict=True)))
                                  for e in seen if isinstance(e, ev.BucketAssigned)],
                     "torch": expected}
    # torch's settings changed after its constructor: where the replay gives another map than
    # torch built, no caps (the constructor's one bucket does not depend on them: kept)
    altered: tuple[tuple[str, dict[str, Any]], ...] = (
        ("replay differs", {}), ("replay differs, unused", {"find_unused_parameters": True}))
    for name, options in altered:
        ddp = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.1, **options)
        ddp._bucket_config = dataclasses.replace(ddp._bucket_config, bucket_bytes_cap=1,
                                                 first_bucket_bytes_cap=1)
        out[name] = [(e.rebuilt, e.limits) for e in _watched(ddp, "light", x)
                     if isinstance(e, ev.BucketAssigned)]
    # guard=True with a sparse gradient: the map is learned from the comm hook's buckets
    torch.manual_seed(0)
    sparse = nn.parallel.DistributedDataParallel(nn.EmbeddingBag(50, 8, sparse=True))
    idx = torch.tensor([[1, 2, 3]])
    import ddpviz

    got: list[Any] = []
    w = ddpviz.watch(sparse, emitter=got.append, hang_timeout=0, recording=recording("sampled"))
    for _ in range(2):
        sparse(idx).sum().backward()
    w.close()
    out["learned"] = [(e.buckets, e.limits) for e in got if isinstance(e, ev.BucketAssigned)]
    return out


def test_watch_records_torchs_caps_not_sizes_and_none_when_unsure() -> None:
    results = run_ranks(caps_rank, 2, timeout=300)  # five DDPs a rank: room on a busy host
    maxsize, cap = torch.iinfo(torch.int64).max, int(0.1 * 1024 * 1024)
    for rank, res in results.items():
        for name in ("default", "small cap", "small cap, unused"):
            assert res[name]["recorded"] == res[name]["torch"], (rank, name)
        default, small = res["default"]["recorded"], res["small cap"]["recorded"]
        unused = res["small cap, unused"]["recorded"]
        # the default: one bucket at construction without a cap, the rebuilt first one 1 MiB
        assert [r for r, _ in default] == [False, True]
        assert list(default[0][1].values()) == [maxsize]
        assert next(iter(default[1][1].values())) == 1024 * 1024
        # a cap of 0.1 MB: no cap at construction, then buckets of 0.1 MiB (the caps, not
        # the buckets' sizes: a parameter larger than the cap fills a bucket of its own)
        assert list(small[0][1].values()) == [maxsize] and len(small[1][1]) > 1
        assert set(small[1][1].values()) <= {cap, 1024 * 1024} and cap in small[1][1].values()
        assert [r for r, _ in unused] == [False] and len(unused[0][1]) > 1
        assert set(unused[0][1].values()) == {cap}
        assert res["replay differs"] == [(False, (maxsize,)), (True, ())], rank
        assert res["replay differs, unused"] == [(False, ())], rank
        assert res["learned"] and all(limits == () for _, limits in res["learned"]), rank
