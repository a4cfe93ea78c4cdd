"""ddpviz's DDP against torch's on the de facto API that code outside DDP relies on: pickling,
private helpers, the reducer's used map and graph-static flag, torch's error sentences and type,
has_error in the logging data, and the profiler ranges. 2 gloo ranks, both engines, same inputs.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch import nn

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

RANGES = ("search_unused_parameters", "mul_out", "copy_bucket_to_grad", "_DDPSink",
          "DistributedDataParallel.forward")


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        return self.b(self.a(x)) if use_b else self.a(x)


def _facts(cls: type, rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # pickling: a DDP saved with torch.save loads and trains to the same parameters
    ddp = cls(_Branchy())
    buf = io.BytesIO()
    torch.save(ddp, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for m in (ddp, loaded):
        m(torch.full((2, 4), float(rank + 1))).sum().backward()
    out["pickled_grads_equal"] = all(torch.equal(p.grad, q.grad) for p, q in
                                     zip(ddp.parameters(), loaded.parameters(), strict=True))
    params, sparse = ddp._build_params_for_reducer()
    out["params_for_reducer"] = ([tuple(p.shape) for p in params], sparse)
    out["name_mapping"] = ddp._build_debug_param_to_name_mapping(params)
    model = _Branchy()
    cls._set_params_and_buffers_to_ignore_for_model(model, ["a.bias"])
    out["ignored"] = [n for n, p in model.named_parameters() if getattr(p, "_ddp_ignored", 0)]
    # used map and graph-static flag under find_unused_parameters
    ddp = cls(_Branchy(), find_unused_parameters=True)
    maps, static = [], []
    for i in range(4):
        ddp(torch.ones(2, 4), use_b=i % 2 == 0).sum().backward()
        maps.append(ddp.reducer._get_local_used_map().tolist())
        static.append(bool(ddp.reducer._ddp_graph_static()))
    out["used_maps"], out["graph_static"] = maps, static
    # the unfinished-reduction error: torch's type and sentence, and has_error in logging data
    ddp = cls(_Branchy())
    try:
        for _ in range(2):
            ddp(torch.ones(2, 4), use_b=False).sum().backward()
        out["error"] = None
    except RuntimeError as e:
        out["error"] = str(e)
    data = ddp._get_ddp_logging_data()
    out["has_error"], out["logged"] = data.get("has_error"), data.get("error", "")
    # profiler ranges
    ddp = cls(_Branchy(), find_unused_parameters=True)
    with torch.profiler.profile() as prof:
        ddp(torch.ones(2, 4)).sum().backward()
    names = {e.name for e in prof.events()}
    out["ranges"] = sorted(r for r in RANGES if any(n.endswith(r) for n in names))
    return out


def _both(rank: int, world_size: int) -> dict[str, Any]:
    import ddpviz

    return {"torch": _facts(nn.parallel.DistributedDataParallel, rank),
            "ddpviz": _facts(ddpviz.DistributedDataParallel, rank)}


@pytest.fixture(scope="module")
def facts() -> dict[int, dict[str, Any]]:
    return run_ranks(_both, 2, timeout=240)


@pytest.mark.parametrize("key", ["pickled_grads_equal", "params_for_reducer", "name_mapping",
                                 "ignored", "used_maps", "graph_static", "has_error", "ranges"])
def test_same_as_torch(facts: dict[int, Any], key: str) -> None:
    for rank in (0, 1):
        assert facts[rank]["ddpviz"][key] == facts[rank]["torch"][key], (rank, key)


def test_facts_are_not_trivial(facts: dict[int, Any]) -> None:
    t = facts[0]["torch"]
    assert t["pickled_grads_equal"] and t["ignored"] == ["a.bias"]
    assert t["used_maps"][1] == [2, 2, 0, 0] and t["graph_static"][-1] is False
    assert set(t["ranges"]) == set(RANGES) and t["has_error"] == 1


def test_unfinished_reduction_keeps_ddpviz_diagnosis_and_torchs_sentence(
        facts: dict[int, Any]) -> None:
    for rank in (0, 1):
        ours, theirs = facts[rank]["ddpviz"]["error"], facts[rank]["torch"]["error"]
        assert theirs.startswith("Expected to have finished reduction in the prior iteration")
        assert ours.startswith("ddpviz: 2 of 4 parameters got no gradient")
        assert "'b.weight'" in ours
        sentence = theirs.split("\n")[0]
        assert sentence in ours
        assert f"Parameter indices which did not receive grad for rank {rank}: 2 3" in ours
        assert "find_unused_parameters=True" in ours.splitlines()[-1]  # ddpviz's fix stays last
        assert facts[rank]["ddpviz"]["logged"] == ours
