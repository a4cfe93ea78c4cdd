"""What ddpviz.watch() costs per step on torch's own DDP (CPU, gloo), side by side.

Inside the same rank processes, several DDP copies of one model train in alternating blocks of
steps (the order rotates every repetition, so noise from other processes hits them alike):
torch's DDP alone, a second unwatched copy (A/A: the noise floor of the ratios), and watched
copies at each recording, labelled by its old level name (RECORDING below; "light", the default:
no comm hook, per-parameter hooks on a few sampled steps only; "full": a GradReady per parameter
tensor; "sampled": full on the same steps, per-bucket summaries otherwise; "buckets": summaries
only; "steps": no comm hook, per-forward only), with no consumer of the events, plus "light ->
trace file" and "sampled -> trace file": the level recording into a per-rank trace file through
a Sender (what `ddpviz record --out` does), "light -> file (no marks)": the same with the
backward marks removed (their cost apart: See [Note: backward marks]), and "minimal Python
comm hook": no ddpviz at all, only torch's averaging and all-reduce in the cheapest Python
comm hook watch's design allows (completed on the training thread), i.e. the floor under every
level that has a comm hook, and the same hook completed by a callback on gloo's thread (`.then`,
as watch() did until stop 18).
Printed per world size, threads per rank and model: the median plain step time and the median
over repetitions of each copy's block time / the plain copy's block time, with a bootstrap 95%
interval of that median, for elapsed time, for the process's CPU time and for the training
thread's CPU time.

Rank r's training thread is pinned to core r % cores, gloo's threads are not (--no-pin: nothing
is pinned). Unpinned, single blocks varied 2x on 2 cores (steps of 1-1.7 ms instead of 0.6)
and hid differences of a few percent; gloo's threads pinned with the training thread were as
slow (its TCP loop spins).

    PYTHONPATH=. python benchmarks/bench_watch.py [--reps 400] [--block 5]
        [--worlds 2,3] [--threads 1,2] [--baseline-watch OLD_WATCH.py] [--no-pin]
        [--only "light -> trace file,light -> file (no marks)"]

--baseline-watch loads another watch.py (e.g. `git show <rev>:ddpviz/watch.py > /tmp/w.py`)
and adds a row for it, to compare against a previous version.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _ranks import interleaved_blocks, join_gloo, run_ranks

# the old level names the tables keep (docs/guide/recording.md), as $DDPVIZ_RECORDING spells them
RECORDING = {"light": "every=100", "steps": "every=never", "sampled": "guard,every=100",
             "full": "guard,every=1", "buckets": "guard,every=never"}
MODELS = {
    "~100 params": (8, 8, 4),  # Linear(8, 8) + Linear(8, 4): 108 parameters
    "~10k params": (64, 96, 40),  # Linear(64, 96) + Linear(96, 40): 10,120 parameters
}
WARMUP_BLOCKS = 2


def _model(dims: tuple[int, int, int]) -> nn.Module:
    torch.manual_seed(0)
    d_in, hidden, d_out = dims
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def _minimal_hook(ddp: nn.parallel.DistributedDataParallel, *, on_gloo_thread: bool = False
                  ) -> None:
    """Register the least a Python comm hook can do: torch's averaging (x 1/world_size) and
    a SUM all-reduce, the futures completed in one final callback of the backward (or, with
    `on_gloo_thread`, by a `.then` callback, which runs where the all-reduce completes)."""
    group = ddp.process_group
    scale = 1.0 / group.size()
    pending: list[tuple[Any, torch.futures.Future, torch.Tensor]] = []

    def settle() -> None:
        for work, out, buffer in pending:
            work.wait()
            out.set_result(buffer)
        pending.clear()

    def hook(bucket: dist.GradBucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        buffer.mul_(scale)
        work = group.allreduce([buffer])
        if on_gloo_thread:
            return work.get_future().then(lambda f: f.value()[0])
        out: torch.futures.Future = torch.futures.Future()
        if not pending:
            torch.autograd.Variable._execution_engine.queue_callback(settle)
        pending.append((work, out, buffer))
        return out

    # (through a lambda: torch rejects the string annotations of this module's __future__)
    dist._register_comm_hook(ddp.reducer, None, lambda state, bucket: hook(bucket))


def _load_watch(path: str | None) -> Any:
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("baseline_watch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.watch


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    import ddpviz
    from ddpviz.transport.sender import Sender

    join_gloo(rank, world, port, pin=args.pin)  # (thread count set per row below)
    baseline = _load_watch(args.baseline_watch)
    trace_dir = tempfile.mkdtemp(prefix="ddpviz-bench-watch-")
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for model_name, dims in MODELS.items():
            variants: dict[str, nn.Module] = {}
            names = ["torch DDP", "torch DDP (A/A)", "watch detail=light",
                     "watch detail=full", "watch detail=sampled", "watch detail=buckets",
                     "watch detail=steps", "light -> trace file", "light -> file (no marks)",
                     "sampled -> trace file", "minimal Python comm hook", "minimal hook, .then"]
            names += ["baseline watch"] if baseline else []
            if args.only:
                names = [n for n in names if n == "torch DDP" or n in args.only]
            watches: list[Any] = []
            senders: list[Any] = []
            for name in names:
                ddp = nn.parallel.DistributedDataParallel(_model(dims))
                if " -> " in name:
                    level = name.split()[0]
                    path = os.path.join(trace_dir,
                                        f"{level}-{threads}-{dims[0]}-rank{rank}.ddpviz")
                    senders.append(Sender.to_file(path, rank))
                    watches.append(ddpviz.watch(ddp, emitter=senders[-1], recording=(
                        ddpviz.Recording.parse(RECORDING[level]))))
                    if name.endswith("(no marks)"):  # See [Note: backward marks]
                        watches[-1]._marks.remove()
                elif name.startswith("watch detail="):
                    watches.append(ddpviz.watch(ddp, recording=ddpviz.Recording.parse(
                        RECORDING[name.split("=")[1]])))
                elif name == "baseline watch":
                    watches.append(baseline(ddp))
                elif name == "minimal Python comm hook":
                    _minimal_hook(ddp)
                elif name == "minimal hook, .then":
                    _minimal_hook(ddp, on_gloo_thread=True)
                variants[name] = ddp
            blocks, cpu, thread = interleaved_blocks(
                {n: variants[n] for n in names}, rank, dims, reps=args.reps, block=args.block,
                warmup=WARMUP_BLOCKS)
            for w in watches:
                w.close()
            for sender in senders:
                sender.close()
            rows.append({"threads": threads, "model": model_name, "blocks": blocks, "cpu": cpu,
                         "thread": thread})
    out.put((rank, rows))
    dist.destroy_process_group()


def _run_world(world: int, args: Any) -> list[dict[str, Any]]:
    return run_ranks(_rank, world, args, timeout=1800)[0]


def _median_interval(ratios: Any, resamples: int = 2000) -> tuple[float, float]:
    """A percentile-bootstrap 95% interval of the median of `ratios`."""
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(ratios, (resamples, len(ratios))), axis=1)
    lo, hi = np.percentile(medians, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    parser.add_argument("--worlds", default="2,3")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--baseline-watch", default=None)
    parser.add_argument("--only", default="", help="comma-separated variants beside torch "
                        "DDP (e.g. 'light -> trace file,light -> file (no marks)')")
    args = parser.parse_args()
    args.only = [v.strip() for v in args.only.split(",") if v.strip()]
    args.threads = [int(t) for t in args.threads.split(",")]
    print(f"watch() cost on torch DDP, gloo on CPU, batch 16, SGD, blocks of {args.block} "
          f"steps, {args.reps} rotated repetitions, rank 0; ratio = median over repetitions of "
          "block time / torch DDP's block time (bootstrap 95% interval of that median)")
    print("wall: elapsed time; cpu: the rank process's CPU time (all its threads), steadier on "
          "a loaded machine; thread: the training thread's own CPU time, which waiting for a "
          "core does not count (what ddpviz adds on that thread, even with more ranks or "
          "threads than cores)")
    print(f"{'ranks':>5} {'thr':>3}  {'model':12} {'variant':26}{'step us':>9}{'wall':>7}"
          f"{'95% interval':>15}{'cpu':>8}{'95% interval':>15}{'thread':>8}"
          f"{'95% interval':>15}")
    for world in (int(w) for w in args.worlds.split(",")):
        for row in _run_world(world, args):
            for name, times in row["blocks"].items():
                step_us = statistics.median(times) / args.block * 1e6
                cells = []
                for kind in ("blocks", "cpu", "thread"):
                    base = row[kind]["torch DDP"]
                    ratios = np.array(row[kind][name]) / np.array(base)
                    lo, hi = _median_interval(ratios)
                    cells.append(f"{np.median(ratios):>7.3f}{lo:>9.3f}-{hi:.3f}")
                print(f"{world:>5} {row['threads']:>3}  {row['model']:12} {name:26}"
                      f"{step_us:>9.0f}{''.join(cells)}")


if __name__ == "__main__":
    main()
