"""Quick gloo checks of ddpviz's DistributedDataParallel against torch's own.

Each spawn runs several settings back to back (process start-up dominates the cost). The
comparison runs on 3 ranks: with 2, scaling by 1/2 and dividing by 2 give the same bits, so only
an odd world size shows that the gradient scaling op is torch's. The broad model x setting x
world-size matrix lives in test_engine_fidelity.py.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from tests.dist.harness import run_ranks
from tests.recordings import recording

pytestmark = pytest.mark.dist

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "find_unused_parameters": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
    "no_sync": {},
}
STEPS = 5


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 4))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern, so NaNs compare equal and -0.0 differs from 0.0."""
    return t.detach().contiguous().view(torch.int32)


def _train(cls: Any, rank: int, name: str, **extra: Any) -> list[torch.Tensor]:
    ddp = cls(_mlp(), **SETTINGS[name], **extra)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS):
        if name == "no_sync":
            with ddp.no_sync():  # accumulate two micro-batches locally first
                for micro in range(2):
                    torch.manual_seed(1000 + 10 * rank + 3 * step + micro)
                    ddp(torch.randn(4, 8)).pow(2).sum().backward()
        torch.manual_seed(10 * rank + step)
        ddp(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return [_bits(p) for p in ddp.parameters()]


def _recording_hook(log: list[tuple[int, tuple[int, ...]]]) -> Any:
    """A comm hook that averages like torch's allreduce_hook and records each bucket."""
    import torch.distributed as dist

    def hook(ids, bucket):  # type: ignore[no-untyped-def]  # torch rejects non-GradBucket hints
        log.append((bucket.index(), tuple(ids[id(p)] for p in bucket.parameters())))
        buf = bucket.buffer().div_(dist.get_world_size())
        work = dist.all_reduce(buf, async_op=True)
        assert work is not None
        return work.get_future().then(lambda fut: fut.value()[0])

    return hook


def _bucket_maps(cls: Any, rank: int) -> list[list[tuple[int, tuple[int, ...]]]]:
    # Small caps so the rebuilt map has several buckets in gradient-ready order.
    ddp = cls(_mlp(), bucket_cap_mb=600 / 2**20)
    log: list[tuple[int, tuple[int, ...]]] = []
    ids = {id(p): i for i, p in enumerate(ddp.module.parameters())}
    ddp.register_comm_hook(ids, _recording_hook(log))
    maps = []
    for step in range(3):
        log.clear()
        torch.manual_seed(10 * rank + step)
        ddp(torch.randn(4, 8)).sum().backward()
        maps.append(sorted(log))
    return maps


def _compare_with_torch(rank: int, world_size: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import ddpviz.events
    from ddpviz import DistributedDataParallel

    built: list[str] = []
    original_emit = ddpviz.events.Tap.emit

    def counting_emit(self: Any, cls: Any, *fields: Any) -> None:
        built.append(cls.__name__)
        original_emit(self, cls, *fields)

    ddpviz.events.Tap.emit = counting_emit  # type: ignore[method-assign]
    out: dict[str, Any] = {}
    for name in SETTINGS:
        theirs = _train(TorchDDP, rank, name)
        ours = _train(DistributedDataParallel, rank, name)
        out[name] = [torch.equal(a, b) for a, b in zip(theirs, ours, strict=True)]
    out["emit_calls_without_emitter"] = list(built)
    events: list[Any] = []
    _train(DistributedDataParallel, rank, "default", emitter=events.append,
           recording=recording("full"))
    out["event_names"] = [type(e).__name__ for e in events]
    out["event_steps"] = sorted({e.step for e in events})
    out["maps_torch"] = _bucket_maps(TorchDDP, rank)
    out["maps_ours"] = _bucket_maps(DistributedDataParallel, rank)
    ddpviz.events.Tap.emit = original_emit  # type: ignore[method-assign]
    return out


class _WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Linear(8, 4)
        self.extra = nn.Sequential(nn.Linear(8, 8))  # never called in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _unused_parameter_error(rank: int, world_size: int) -> dict[str, Any]:
    from ddpviz import DistributedDataParallel
    from ddpviz.errors import UnusedParametersError

    events: list[Any] = []
    ddp = DistributedDataParallel(_WithUnused(), emitter=events.append)
    torch.manual_seed(rank)
    try:
        ddp(torch.randn(3, 8)).sum().backward()
    except UnusedParametersError as e:
        found = [e for e in events if type(e).__name__ == "UnusedParametersFound"]
        return {"raised_at": "backward", "message": str(e),
                "event_names": list(found[0].names) if found else [],
                "used_grad_defined": ddp.module.used.weight.grad is not None}
    return {"raised_at": None}


@pytest.fixture(scope="module")
def compared() -> dict[int, dict[str, Any]]:
    return run_ranks(_compare_with_torch, 3, timeout=150)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_params_bitwise_equal_to_torch_after_five_sgd_steps(compared: dict[int, Any],
                                                             setting: str) -> None:
    for rank in (0, 1, 2):
        assert compared[rank][setting] == [True] * 6, f"rank {rank}: {compared[rank][setting]}"


def test_bucket_maps_match_torch_in_iterations_0_to_2(compared: dict[int, Any]) -> None:
    maps = compared[0]["maps_ours"]
    assert maps == compared[0]["maps_torch"]
    assert maps == compared[1]["maps_ours"]
    # iteration 0: one bucket, registration order; then rebuilt in gradient-ready order (last
    # layer first, bias before weight) into several buckets
    assert maps[0] == [(0, (0, 1, 2, 3, 4, 5))]
    assert len(maps[1]) > 1 and maps[1] == maps[2]
    assert [i for _, b in maps[1] for i in b] == [5, 4, 3, 2, 1, 0]


def test_no_emitter_builds_no_events(compared: dict[int, Any]) -> None:
    assert compared[0]["emit_calls_without_emitter"] == []
    names = compared[0]["event_names"]
    assert names.count("BucketAssigned") == 2  # the constructor's map and the rebuilt one
    assert names.count("GradReady") == 6 * STEPS
    assert names.count("BackwardFinished") == STEPS
    assert compared[0]["event_steps"] == [-1, *range(STEPS)]


def test_unused_parameter_raises_at_iteration_0_backward_naming_it() -> None:
    results = run_ranks(_unused_parameter_error, 2, timeout=90)
    for rank, r in results.items():
        assert r["raised_at"] == "backward", f"rank {rank} did not raise"
        msg = r["message"]
        assert msg.startswith("ddpviz: 2 of 4 parameters got no gradient on rank")
        assert "'extra.0.weight'" in msg and "'extra.0.bias'" in msg
        assert "not used in forward" in msg
        assert "find_unused_parameters=True" in msg.splitlines()[-1]
        assert r["event_names"] == ["extra.0.weight", "extra.0.bias"]
        assert r["used_grad_defined"]


def _unused_error_at_forward(rank: int, world_size: int) -> dict[str, Any]:
    """Torch's DDP and ddpviz's under DDPVIZ_UNUSED_ERROR_AT=forward, same model and inputs:
    where each raises, and what."""
    import os

    from ddpviz import DistributedDataParallel
    from ddpviz.errors import UnusedParametersError

    os.environ["DDPVIZ_UNUSED_ERROR_AT"] = "forward"
    out: dict[str, Any] = {}
    for name, cls in (("torch", nn.parallel.DistributedDataParallel),
                      ("ours", DistributedDataParallel)):
        ddp = cls(_WithUnused())
        torch.manual_seed(rank)
        x = torch.randn(3, 8)
        ddp(x).sum().backward()  # iteration 0 returns on both
        try:
            ddp(x).sum().backward()
        except RuntimeError as e:
            out[name] = {"raised_at": "forward", "message": str(e),
                         "unused_error": isinstance(e, UnusedParametersError)}
        else:
            out[name] = {"raised_at": None}
    os.environ["DDPVIZ_UNUSED_ERROR_AT"] = "sideways"
    try:
        DistributedDataParallel(_WithUnused())
    except ValueError as e:
        out["bad_setting"] = str(e)
    return out


def test_unused_error_at_forward_raises_where_torch_does_with_ddpviz_names() -> None:
    results = run_ranks(_unused_error_at_forward, 2, timeout=90)
    for rank, r in results.items():
        assert r["torch"]["raised_at"] == "forward", f"rank {rank}: torch did not raise"
        assert r["ours"]["raised_at"] == "forward", f"rank {rank}: ddpviz did not raise"
        assert r["ours"]["unused_error"]
        ours, theirs = r["ours"]["message"], r["torch"]["message"]
        assert ours.startswith("ddpviz: 2 of 4 parameters got no gradient on rank")
        assert "'extra.0.weight'" in ours and "'extra.0.bias'" in ours
        first_sentence = theirs.split(". ")[0]
        assert first_sentence.startswith("Expected to have finished reduction")
        assert first_sentence in ours
        assert "DDPVIZ_UNUSED_ERROR_AT='sideways'" in r["bad_setting"]
        assert "'forward'" in r["bad_setting"] and "'backward'" in r["bad_setting"]


def test_engine_import_pulls_in_no_ui_modules() -> None:
    code = ("import sys, ddpviz.engine.ddp, ddpviz.ddp; "
            "print(sorted(m for m in ('ipywidgets', 'plotly', 'IPython') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def _storage_replaced(rank: int, world_size: int) -> dict[str, Any]:
    """A parameter given new storage (set_) after construction: torch's DDP and ddpviz's on
    the same model and inputs, and what each raises."""
    from ddpviz import DistributedDataParallel

    out: dict[str, Any] = {}
    for name, cls in (("torch", nn.parallel.DistributedDataParallel),
                      ("ours", DistributedDataParallel)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        ddp = cls(model)
        with torch.no_grad():
            model[2].weight.set_(model[2].weight.detach().clone())
        torch.manual_seed(rank)
        x = torch.randn(3, 8)
        out[name] = {"raised": None}
        try:
            for _ in range(2):
                ddp(x).sum().backward()
        except RuntimeError as e:
            out[name] = {"raised": str(e)}
        out[name]["grad_computed"] = model[2].weight.grad is not None
    return out


def test_a_parameter_given_new_storage_after_construction_is_named_with_the_cause() -> None:
    # torch's reducer loses its hook on the parameter just as ddpviz's does and fails with
    # "Expected to have finished reduction"; ddpviz says why, and that
    # find_unused_parameters=True is not the fix
    results = run_ranks(_storage_replaced, 2, timeout=90)
    for rank, r in results.items():
        assert r["torch"]["raised"] is not None, f"rank {rank}: torch did not fail"
        assert r["torch"]["raised"].startswith("Expected to have finished reduction")
        ours = r["ours"]["raised"]
        assert ours is not None, f"rank {rank}: ddpviz did not fail"
        assert ours.startswith("ddpviz: 1 of 4 parameters got no gradient on ranks 0,1")
        line = next(x for x in ours.splitlines() if "'2.weight'" in x)
        assert "its gradient was computed, but DDP's hook is no longer on it" in line
        assert "not used in forward" not in ours
        assert "Change parameters before wrapping the model" in ours.splitlines()[-1]
        assert r["ours"]["grad_computed"] and r["torch"]["grad_computed"]
