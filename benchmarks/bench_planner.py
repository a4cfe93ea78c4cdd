"""Planning time: ddpviz's Python bucket assignment against torch's C++ one, 10,000 parameters.

The model is 10,000 parameter tensors on the meta device (no memory), mostly fp32 with some
bf16 and fp16 layers, so three bucket keys. Rows: the constructor's assignment (registration
order, no tensor_indices) with the default `[sys.maxsize]` and with `[1 MiB, 25 MiB]`; the
rebuild's assignment (gradient-ready order, tensor_indices given); and the full
`ddpviz.bucket_plan` (parameter collection + both maps), which has no torch counterpart.
Each row: median of `--repeats` runs, alternating torch and ddpviz so noise hits both alike.

    python benchmarks/bench_planner.py [--params 10000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import ddpviz
from ddpviz.engine.params import build_params_for_reducer

MiB = 1024 * 1024


def make_model(n_params: int) -> nn.Module:
    """n_params parameter tensors: Linear layers (weight + bias), every 7th bf16, every 11th
    fp16; sizes vary so the [1 MiB, 25 MiB] limits close many buckets."""
    layers = []
    with torch.device("meta"):
        for i in range(n_params // 2):
            width = 64 + 32 * (i % 9)
            layer = nn.Linear(width, width)
            if i % 7 == 0:
                layer.to(torch.bfloat16)
            elif i % 11 == 0:
                layer.to(torch.float16)
            layers.append(layer)
    return nn.Sequential(*layers)


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _row(name: str, torch_fn: Callable[[], Any] | None, ours_fn: Callable[[], Any],
         repeats: int) -> tuple[str, float | None, float]:
    if torch_fn is not None:
        same = torch_fn() == ours_fn()
        if not same:
            raise SystemExit(f"ddpviz: {name}: ddpviz and torch disagree; run the tests in "
                             "tests/engine/test_buckets.py to find the input that differs.")
    t_torch: list[float] = []
    t_ours: list[float] = []
    for _ in range(repeats):
        if torch_fn is not None:
            t_torch.append(_time(torch_fn))
        t_ours.append(_time(ours_fn))
    return (name, statistics.median(t_torch) if t_torch else None, statistics.median(t_ours))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)

    model = make_model(args.params)
    params: list[torch.Tensor] = [e.param for e in build_params_for_reducer(model)]
    n = len(params)
    # a gradient-ready order like a real backward: reverse registration, bias before weight
    order = [i for layer in reversed(range(n // 2)) for i in (2 * layer + 1, 2 * layer)]
    walked = [params[i] for i in order]

    def torch_assign(tensors: list[torch.Tensor], limits: list[int],
                     indices: list[int]) -> Callable[[], Any]:
        return lambda: tuple(dist._compute_bucket_assignment_by_size(tensors, limits, [],
                                                                     indices))

    def ours_assign(tensors: list[torch.Tensor], limits: list[int],
                    indices: list[int]) -> Callable[[], Any]:
        return lambda: tuple(ddpviz.plan.compute_bucket_assignment_by_size(tensors, limits, [],
                                                                           indices))

    default_rebuild = [MiB, 25 * MiB]
    cases: list[tuple[str, list[torch.Tensor], list[int], list[int]]] = [
        ("initial, [maxsize]", params, [sys.maxsize], []),
        ("initial, [1 MiB, 25 MiB]", params, default_rebuild, []),
        ("rebuild, [1 MiB, 25 MiB], tensor_indices", walked, default_rebuild, order),
        ("rebuild, [64 KiB], tensor_indices", walked, [64 * 1024], order),
    ]
    rows = [_row(name, torch_assign(t, lim, idx), ours_assign(t, lim, idx), args.repeats)
            for name, t, lim, idx in cases]
    plan_repeats = max(3, args.repeats // 3)
    rows.append(_row("bucket_plan(model) (collect + both maps)", None,
                     lambda: ddpviz.bucket_plan(model), plan_repeats))
    plan = ddpviz.bucket_plan(model)
    rows.append(_row("plan.with_settings(bucket_cap_mb=4)", None,
                     lambda: plan.with_settings(bucket_cap_mb=4), plan_repeats))

    print(f"Bucket planning, {n:,} parameters ({len(plan.initial)} initial / "
          f"{len(plan.rebuilt or ())} rebuilt buckets), median of {args.repeats} runs "
          f"({plan_repeats} for bucket_plan rows); torch {torch.__version__}")
    print(f"{'case':<44} {'torch C++ ms':>13} {'ddpviz ms':>11} {'ratio':>7}")
    for name, t_torch, t_ours in rows:
        torch_ms = f"{t_torch * 1e3:.2f}" if t_torch is not None else "-"
        ratio = f"{t_ours / t_torch:.1f}x" if t_torch else "-"
        print(f"{name:<44} {torch_ms:>13} {t_ours * 1e3:>11.2f} {ratio:>7}")


if __name__ == "__main__":
    main()
