"""Step time of ddpviz's DDP engine against torch's DDP, on 2 gloo ranks (CPU).

Both implementations train the same MLP (a few million parameters) inside the same two
processes, one step each in turn (torch, ddpviz with taps off, ddpviz with taps recording into
a list; the order rotates each repetition), so machine noise hits all three alike; medians over
many repetitions, and the median of per-repetition ratios. Then the all-reduce itself: one raw
all_reduce of all gradient bytes against the bucket-sized all-reduces DDP issues, and the
in-step span of ddpviz's bucket all-reduces seen by its taps.

    python benchmarks/bench_engine.py [--steps 200] [--candidate ddpviz|torch]

`--candidate torch` runs torch's DDP in the ddpviz rows (no taps): an A/A run that shows the
noise floor of the ratios on this machine.
"""

from __future__ import annotations

import argparse
import copy
import os
import queue
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

GOAL = 1.03  # ddpviz / torch step time, taps off
WARMUP = 8


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def _candidate(name: str) -> Any:
    if name == "torch":
        return torch.nn.parallel.DistributedDataParallel
    import ddpviz

    cls = getattr(ddpviz, "DistributedDataParallel", None)
    if cls is None:
        raise SystemExit("ddpviz: ddpviz.DistributedDataParallel does not exist yet; "
                         "run with --candidate torch to check the benchmark itself.")
    return cls


class _Trainer:
    """One DDP-wrapped copy of the model with its optimizer; `step()` returns seconds."""

    def __init__(self, ddp: Any, module: nn.Module) -> None:
        self.ddp, self.module = ddp, module
        self.opt = torch.optim.SGD(module.parameters(), lr=1e-3)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(self.ddp(x), y)
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t0


def _allreduce_seconds(sizes: list[int], reps: int) -> list[float]:
    """Time launching one all_reduce per size back to back, then waiting for all."""
    tensors = [torch.ones(n) for n in sizes]
    out = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        out.append(time.perf_counter() - t0)
    return out


def _comm_spans(events: list[Any]) -> list[float]:
    """Per step: first AllReduceLaunched to last AllReduceDone, from ddpviz's taps."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for e in events:
        kind = type(e).__name__
        if kind == "AllReduceLaunched":
            first.setdefault(e.step, e.t_ns)
        elif kind == "AllReduceDone":
            last[e.step] = e.t_ns
    return [(last[s] - first[s]) / 1e9 for s in sorted(first) if s in last]


def _rank(rank: int, world_size: int, port: int, steps: int, candidate: str, q: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        cand_cls = _candidate(candidate)
        base = _mlp()
        events: list[Any] = []
        trainers: dict[str, _Trainer] = {}
        for name in ("torch", "ddpviz", "ddpviz+taps"):
            module = copy.deepcopy(base)
            if name == "torch":
                ddp = torch.nn.parallel.DistributedDataParallel(module)
            elif name == "ddpviz+taps" and candidate != "torch":
                ddp = cand_cls(module, emitter=events.append)
            else:
                ddp = cand_cls(module)
            trainers[name] = _Trainer(ddp, module)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(32, 512, generator=g), torch.randint(10, (32,), generator=g)
        times: dict[str, list[float]] = {name: [] for name in trainers}
        order = list(trainers)
        for i in range(WARMUP + steps):
            for name in order[i % 3:] + order[:i % 3]:  # rotate: no one always goes first
                dt = trainers[name].step(x, y)
                if i >= WARMUP:
                    times[name].append(dt)
        n_params = sum(p.numel() for p in base.parameters())
        # torch's rebuilt buckets (bytes, reduction order); ddpviz's map must give the same.
        logged = trainers["torch"].ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        bucket_sizes = [int(b) // 4 for b in str(logged).split(",")]
        spans: list[float] = []
        if candidate != "torch":
            params = list(trainers["ddpviz"].module.parameters())
            mine = [sum(params[i].numel() for i in b)
                    for b in trainers["ddpviz"].ddp.bucket_indices()]
            if mine != bucket_sizes:
                raise RuntimeError(f"ddpviz's buckets {mine} differ from torch's {bucket_sizes}")
            spans = _comm_spans(events)[WARMUP:]
        reps = max(20, steps // 3)
        raw: list[float] = []
        bucketed: list[float] = []
        for _ in range(reps):  # alternate the two so noise hits both alike
            raw += _allreduce_seconds([n_params], 1)
            bucketed += _allreduce_seconds(bucket_sizes, 1)
        q.put((rank, {"times": times, "raw": raw, "bucketed": bucketed, "spans": spans,
                      "n_params": n_params, "bucket_sizes": bucket_sizes,
                      "n_events": len(events)}))
    except BaseException as e:
        q.put((rank, e))
        raise
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ms(xs: list[float]) -> float:
    return 1e3 * statistics.median(xs)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def _report(r: dict[str, Any], steps: int, candidate: str) -> None:
    times = r["times"]
    t = {k: _ms(v) for k, v in times.items()}
    mb = r["n_params"] * 4 / 2**20
    label = "ddpviz" if candidate == "ddpviz" else "torch (A/A)"
    print(f"ddpviz engine vs torch DDP: MLP {r['n_params'] / 1e6:.2f}M params ({mb:.1f} MiB "
          f"fp32), 2 gloo ranks on CPU, batch 32, {steps} rotated repetitions, rank 0")
    print("ratio: median of the per-repetition ratios (the three steps of a repetition ran "
          "back to back), with its quartiles")
    print()
    print(f"{'step':<36}{'median ms':>10}{'ratio':>9}{'quartiles':>16}")
    print(f"{'torch DDP':<36}{t['torch']:>10.2f}{1:>9.3f}")
    rows = [("ddpviz", f"{label}, taps off"),
            ("ddpviz+taps", f"{label}, taps recording to a list" if candidate == "ddpviz"
             else f"{label}, again")]
    ratios: dict[str, float] = {}
    for key, name in rows:
        lo, mid, hi = _quartiles([a / b for a, b in zip(times[key], times["torch"],
                                                          strict=True)])
        ratios[key] = mid
        print(f"{name:<36}{t[key]:>10.2f}{mid:>9.3f}{f'{lo:.3f}-{hi:.3f}':>16}")
    verdict = "meets" if ratios["ddpviz"] <= GOAL else "misses"
    print(f"goal, taps off <= {GOAL:.2f} x torch: {verdict} ({ratios['ddpviz']:.3f})")
    print()
    sizes = r["bucket_sizes"]
    raw = _ms(r["raw"])
    print(f"{'all-reduce of all gradients':<36}{'median ms':>10}{'ratio':>9}")
    print(f"{'one raw all_reduce, ' + f'{mb:.1f} MiB':<36}{raw:>10.2f}{1:>9.3f}")
    b = _ms(r["bucketed"])
    print(f"{f'{len(sizes)} bucket-sized all_reduces, async':<36}{b:>10.2f}{b / raw:>9.3f}")
    if r["spans"]:
        s = _ms(r["spans"])
        print(f"{'in-step span, taps (*)':<36}{s:>10.2f}{s / raw:>9.3f}")
        print("(*) first AllReduceLaunched to last AllReduceDone of a ddpviz step: includes the "
              "backward compute it overlaps with")
    print(f"bucket sizes (elements, reduction order, = torch's rebuilt buckets): {sizes}; "
          f"events recorded: {r['n_events']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--candidate", choices=("ddpviz", "torch"), default="ddpviz")
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args.steps, args.candidate, q))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(q.get(timeout=170) for _ in procs)
    except queue.Empty:
        print("a rank did not report within 170 s", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for r, res in sorted(results.items()):
        if isinstance(res, BaseException):
            print(f"rank {r} failed: {res!r}", file=sys.stderr)
            return 1
    _report(results[0], args.steps, args.candidate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
