"""The NCCL path, with as many ranks as GPUs (world size 1 on one GPU): ddpviz's DDP bitwise
against torch's (device_ids), watch() on torch's DDP against an unwatched twin, ddpviz.launch,
and `ddpviz record` under torchrun. Skipped without CUDA (see conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ddpviz
from tests.dist.harness import free_port, run_ranks
from tests.gpu.conftest import world_size
from tests.gpu.ranks import WATCH_DETAILS, fidelity_ranks, launched, nan_ranks, watch_ranks
from tests.record.hooked import ROOT, hooked_python

# Dense models only: NCCL has no sparse all-reduce (torch's DDP refuses sparse gradients there).
FIDELITY = [("mlp", "default"), ("cnn_bn", "default"), ("tied_lm", "default"),
            ("mixed_bf16", "default"), ("mlp", "caps"), ("cnn_bn", "cap_list"),
            ("mlp", "find_unused"), ("mlp", "static_graph"), ("mlp", "grad_view"),
            ("mlp", "no_sync"), ("mlp", "fp16_hook")]
WATCHED = [("mlp", "default"), ("cnn_bn", "caps"), ("mixed_bf16", "default"),
           ("mlp", "grad_view"), ("mlp", "static_graph"), ("mlp", "find_unused"),
           ("mlp", "no_sync"), ("mlp", "fp16_hook")]


@pytest.fixture(scope="module")
def fidelity() -> dict[int, dict[str, str | None]]:
    return run_ranks(fidelity_ranks, world_size(), FIDELITY, timeout=600, init=False,
                     start_method="spawn")


@pytest.fixture(scope="module")
def watched() -> dict[int, dict[str, object]]:
    return run_ranks(watch_ranks, world_size(), WATCHED, timeout=600, init=False,
                     start_method="spawn")


@pytest.mark.parametrize(("model", "setting"), FIDELITY)
def test_ddpviz_ddp_is_bitwise_equal_to_torch_on_nccl(
        fidelity: dict[int, dict[str, str | None]], model: str, setting: str) -> None:
    for rank, cases in fidelity.items():
        assert cases[f"{model}-{setting}"] is None, (rank, cases[f"{model}-{setting}"])


@pytest.mark.parametrize("detail", WATCH_DETAILS)
@pytest.mark.parametrize(("model", "setting"), WATCHED)
def test_watch_is_transparent_on_nccl(watched: dict[int, dict[str, object]], model: str,
                                      setting: str, detail: str) -> None:
    for rank, cases in watched.items():
        difference, all_reduces = cases[f"{model}-{setting}-{detail}"]  # type: ignore[misc]
        assert difference is None, (rank, difference)
        assert all_reduces > 0  # it did watch


def test_launch_runs_on_nccl_with_a_gpu_per_rank() -> None:
    n = world_size()
    run = ddpviz.launch(launched, nprocs=n, args=(torch.cuda.device_count(),), timeout=300)
    results = run.wait()
    assert [r["backend"] for r in results] == ["nccl"] * n
    assert [r["device"] for r in results] == list(range(n))
    assert all(r["sum"] == n * (n + 1) / 2 and r["world"] == n for r in results)


def test_record_watches_torchrun_on_nccl(tmp_path: Path) -> None:
    python = hooked_python(tmp_path)
    n = world_size()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPVIZ_", "TRAIN_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
               TRAIN_DEVICE="cuda")
    out = tmp_path / "traces"
    done = subprocess.run(
        [python, "-m", "ddpviz", "record", "--out", str(out), "--", python, "-m",
         "torch.distributed.run", "--nproc-per-node", str(n), "--master-port",
         str(free_port()), str(ROOT / "tests" / "record" / "train_plain.py")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(n):
        trace = ddpviz.Trace.load(out / f"ddpviz-trace-rank{rank}.ddpviz")
        names = [type(e).__name__ for e in trace]
        assert names.count("ForwardStarted") == 3 and names.count("AllReduceDone") >= 3
        params = next(e for e in trace if type(e).__name__ == "ParamsBuilt").params
        assert {p.device for p in params} == {f"cuda:{rank}"}


def test_gpu_suite_uses_every_gpu() -> None:
    assert world_size() == torch.cuda.device_count() >= 1
    assert sys.modules["torch"].cuda.is_available()


def test_a_nan_is_named_at_its_step_on_the_gpu_with_no_host_sync() -> None:
    """The default's every-step NaN check on the device: a NaN multiplied into rank 0's
    `0.weight` gradient at step 40 is named at step 40, and no step makes a host sync (the
    healthy ones nor the precise steps after the NaN; step 0 is DDP's own first step)."""
    results = run_ranks(nan_ranks, world_size(), 40, 60, timeout=300, init=False,
                        start_method="spawn")
    found = results[0]["found"]
    assert ("nonfinite_gradient", 40, (0,), "0.weight", "gradient") in found, found
    for rank, result in results.items():
        assert [s for s in result["synced"] if s > 0] == [], (rank, result["synced"])
