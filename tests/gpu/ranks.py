"""Rank functions for tests/gpu: NCCL process groups with one GPU per rank (LOCAL_RANK)."""

from __future__ import annotations

import copy
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.dist.models import ZOO, Batch
from tests.dist.test_engine_fidelity import HOOKS, SEED, SETTINGS
from tests.recordings import recording

STEPS = 4
WATCH_DETAILS = ("light", "sampled")


def init_nccl(rank: int, world_size: int) -> torch.device:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=device,
                            timeout=datetime.timedelta(seconds=120))
    return device


def _batch(model: str, rank: int, step: int, device: torch.device) -> Batch:
    b = ZOO[model].batch(SEED, rank, step)
    return Batch(b.inputs.to(device), b.target.to(device))


def _train(ddp: Any, module: nn.Module, model: str, setting: str, rank: int,
           device: torch.device, *, register_hook: bool = True
           ) -> list[dict[str, torch.Tensor]]:
    """STEPS SGD steps; per step the gradients, parameters and buffers (on the CPU). The
    setting's comm hook is registered first, unless register_hook=False (watch() has it)."""
    s = SETTINGS[setting]
    if s.hook and register_hook:
        ddp.register_comm_hook(None, HOOKS[s.hook])
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    states: list[dict[str, torch.Tensor]] = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        aux = not s.unused_aux or step % 2 == rank % 2
        for micro in range(s.micro_steps):
            with ddp.no_sync():
                ZOO[model].loss(ddp, _batch(model, rank, 100 + 10 * step + micro, device),
                                aux).backward()
        ZOO[model].loss(ddp, _batch(model, rank, step, device), aux).backward()
        state = {f"grad {n}": p.grad.detach().cpu().clone()
                 for n, p in module.named_parameters() if p.grad is not None}
        opt.step()
        state.update({f"param {n}": p.detach().cpu().clone()
                      for n, p in module.named_parameters()})
        state.update({f"buffer {n}": b.detach().cpu().clone()
                      for n, b in module.named_buffers()})
        states.append(state)
    torch.cuda.synchronize()
    return states


def first_difference(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]
                     ) -> str | None:
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.keys() != y.keys():
            return f"step {step}: {sorted(set(x) ^ set(y))} only on one side"
        for name in x:
            if not torch.equal(x[name], y[name]):
                diff = float((x[name].double() - y[name].double()).abs().max())
                return f"step {step}: {name} differs (max |diff| {diff:.3g})"
    return None


def fidelity_ranks(rank: int, world_size: int, cases: list[tuple[str, str]]
                   ) -> dict[str, str | None]:
    """ddpviz's DDP against torch's, on NCCL with device_ids: per case, the first bitwise
    difference (None: equal)."""
    import ddpviz

    device = init_nccl(rank, world_size)
    out: dict[str, str | None] = {}
    for model, setting in cases:
        base = ZOO[model].build(SEED + rank).to(device)  # rank-dependent: the broadcast matters
        kwargs = {**SETTINGS[setting].kwargs, "device_ids": [device.index]}
        torch_module, ours_module = copy.deepcopy(base), copy.deepcopy(base)
        ref = _train(nn.parallel.DistributedDataParallel(torch_module, **kwargs), torch_module,
                     model, setting, rank, device)
        got = _train(ddpviz.DistributedDataParallel(ours_module, **kwargs), ours_module,
                     model, setting, rank, device)
        out[f"{model}-{setting}"] = first_difference(ref, got)
    dist.destroy_process_group()
    return out


def watch_ranks(rank: int, world_size: int, cases: list[tuple[str, str]]
                ) -> dict[str, Any]:
    """torch's DDP watched (events into a list) against an unwatched twin, on NCCL."""
    import ddpviz

    device = init_nccl(rank, world_size)
    out: dict[str, Any] = {}
    for model, setting in cases:
        base = ZOO[model].build(SEED + rank).to(device)
        kwargs = {**SETTINGS[setting].kwargs, "device_ids": [device.index]}
        plain_module = copy.deepcopy(base)
        ref = _train(nn.parallel.DistributedDataParallel(plain_module, **kwargs), plain_module,
                     model, setting, rank, device)
        for detail in WATCH_DETAILS:  # the default (no comm hook) and the comm-hook path
            events: list[Any] = []
            watched_module = copy.deepcopy(base)
            watched = nn.parallel.DistributedDataParallel(watched_module, **kwargs)
            hook = SETTINGS[setting].hook
            w = ddpviz.watch(watched, emitter=events.append, recording=recording(detail),
                             hook=HOOKS[hook] if hook else None)
            got = _train(watched, watched_module, model, setting, rank, device,
                         register_hook=False)
            w.close()
            out[f"{model}-{setting}-{detail}"] = (
                first_difference(ref, got),
                sum(type(e).__name__ == "AllReduceDone" for e in events))
    dist.destroy_process_group()
    return out


def launched(device_count: int) -> dict[str, Any]:
    """What a ddpviz.launch()ed rank sees (runs inside the rank)."""
    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    return {"backend": dist.get_backend(), "device": torch.cuda.current_device(),
            "sum": float(t[0]), "world": dist.get_world_size(), "devices": device_count}


def nan_ranks(rank: int, world_size: int, nan_step: int, steps: int) -> dict[str, Any]:
    """watch()'s default on torch's DDP over NCCL; rank 0 multiplies a NaN into `0.weight`'s
    gradient at `nan_step`. Returns the findings this rank reported and the steps that made a
    host sync (torch.cuda.set_sync_debug_mode), the unwatched first step's aside."""
    import warnings

    import ddpviz

    device = init_nccl(rank, world_size)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    found: list[tuple[str, int, tuple[int, ...], str | None, str | None]] = []

    def emit(e: Any) -> None:
        if type(e).__name__ == "FindingReported":
            f = e.finding
            found.append((f.kind, f.step, tuple(f.ranks), f.name, f.field))

    watch = ddpviz.watch(ddp, emitter=emit)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(16, 64, device=device)
    at = {"step": 0}
    model[0].weight.register_hook(
        lambda g: g * float("nan") if rank == 0 and at["step"] == nan_step else None)
    synced = []
    for step in range(steps):
        at["step"] = step
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                ddp(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        if any("synchroniz" in str(w.message) for w in got):
            synced.append(step)
    torch.cuda.synchronize()
    watch.close()
    dist.destroy_process_group()
    return {"found": found, "synced": synced}
