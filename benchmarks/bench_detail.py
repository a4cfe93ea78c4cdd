"""Cost of each detail level per step (recording.py) against taps off, on 2 gloo ranks.

ddpviz's DDP trains a model of many small parameter tensors (the case where per-parameter
events cost the most: 1,000 tensors by default) in five copies inside the same two processes:
taps off (no emitter), and taps recording into a list at detail "full", "buckets" and
"sampled" (the default), plus torch's DDP for reference. One step of each in turn, the order
rotating every repetition, so machine noise hits all alike; the ratio column is the median of
the per-repetition ratios to taps off, with its quartiles; the CPU ratio compares median process
CPU time per step (less sensitive to other jobs on a loaded machine).

    python benchmarks/bench_detail.py [--steps 60] [--layers 500]
"""

from __future__ import annotations

import argparse
import copy
import os
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

WARMUP = 5
VARIANTS = ("taps off", "full", "buckets", "sampled", "torch DDP")
# the old level names the tables keep, as $DDPVIZ_RECORDING spells them (guard: ignored by
# ddpviz's own DDP, always guarded)
RECORDING = {"full": "every=1", "buckets": "every=never", "sampled": "every=100"}


def _model(layers: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(layers)])


def _rank(rank: int, world_size: int, port: int, steps: int, layers: int, q: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        import ddpviz

        base = _model(layers)
        ddps: dict[str, Any] = {}
        events: dict[str, list[Any]] = {}
        for name in VARIANTS:
            module = copy.deepcopy(base)
            if name == "torch DDP":
                ddps[name] = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=0.04)
            elif name == "taps off":
                ddps[name] = ddpviz.DistributedDataParallel(module, bucket_cap_mb=0.04,
                                                            emitter=None, hang_timeout=0)
            else:
                events[name] = []
                ddps[name] = ddpviz.DistributedDataParallel(
                    module, bucket_cap_mb=0.04, emitter=events[name].append,
                    recording=ddpviz.Recording.parse(RECORDING[name]), hang_timeout=0)
        opts = {k: torch.optim.SGD(d.parameters(), lr=1e-3) for k, d in ddps.items()}
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
        times: dict[str, list[float]] = {k: [] for k in ddps}
        cpu: dict[str, list[float]] = {k: [] for k in ddps}
        order = list(ddps)
        for i in range(WARMUP + steps):
            for name in order[i % len(order):] + order[:i % len(order)]:
                t0, c0 = time.perf_counter(), time.process_time()
                opts[name].zero_grad(set_to_none=True)
                ddps[name](x).pow(2).sum().backward()
                opts[name].step()
                if i >= WARMUP:
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
                events.get(name, []).clear()  # keep memory flat; counts are per step
        n_buckets = len(ddps["taps off"].reducer.buckets)
        per_step = {}
        for name in ("full", "buckets", "sampled"):  # events of one more step at each level
            ev_list = events[name]
            ddps[name](x).pow(2).sum().backward()
            per_step[name] = len(ev_list)
        q.put((rank, {"times": times, "cpu": cpu, "params": 2 * layers, "buckets": n_buckets,
                      "per_step": per_step}))
    except BaseException as e:
        q.put((rank, e))
        raise
    finally:
        dist.destroy_process_group()


def _per_hook_ns(n: int = 200_000) -> dict[str, float]:
    """What one gradient hook adds at each level, in-process, best of 5 rounds: a GradReady
    built and appended to a list (full) against GradSummary.add (buckets; sampled also keeps
    the (param, bucket, time) triple)."""
    from ddpviz import events as ev
    from ddpviz.recording import DetailPolicy, GradSummary

    sink: list[Any] = []
    tap = ev.Tap(sink.append, 0)
    out: dict[str, list[float]] = {"full": [], "buckets": [], "sampled": []}
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            tap.emit(ev.GradReady, i & 1023, i & 31)
        out["full"].append(time.perf_counter() - t0)
        sink.clear()
        for level in ("buckets", "sampled"):
            summary = GradSummary(DetailPolicy(level), tap)  # type: ignore[arg-type]
            summary.begin(50)
            t0 = time.perf_counter()
            for i in range(n):
                summary.add(i & 1023, i & 31, 256)
            out[level].append(time.perf_counter() - t0)
    return {k: min(v) / n * 1e9 for k, v in out.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--layers", type=int, default=500)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args.steps, args.layers, q))
             for r in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(30)
    for r, res in results.items():
        if isinstance(res, BaseException):
            raise SystemExit(f"rank {r} failed: {res!r}")
    r = results[0]
    t = r["times"]
    print(f"# detail levels vs taps off: {r['params']} parameter tensors in {r['buckets']} "
          f"buckets, 2 gloo ranks (CPU), {args.steps} rotated repetitions, rank 0, load average "
          f"{os.getloadavg()[0]:.1f}")
    print("| variant | median ms/step | ratio to taps off | quartiles | CPU ratio (process time) "
          "| events in a later step |")
    print("|---|---|---|---|---|---|")
    c = r["cpu"]
    for name in VARIANTS:
        ratios = [a / b for a, b in zip(t[name], t["taps off"], strict=True)]
        lo, mid, hi = statistics.quantiles(ratios, n=4)
        n = r["per_step"].get(name, 0 if name == "taps off" else "-")
        cpu_ratio = statistics.median(c[name]) / statistics.median(c["taps off"])
        print(f"| {name} | {1e3 * statistics.median(t[name]):.2f} | {mid:.3f} | "
              f"{lo:.3f}-{hi:.3f} | {cpu_ratio:.3f} | {n} |")
    print()
    print("| per gradient hook, in-process (best of 5) | ns |")
    print("|---|---|")
    for level, ns in _per_hook_ns().items():
        print(f"| {level} | {ns:.0f} |")


if __name__ == "__main__":
    main()
