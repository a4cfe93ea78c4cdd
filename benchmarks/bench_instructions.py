"""What watch()'s default costs per step, in instructions: exact, where times are not.

Times of a ~1 ms CPU step on a shared 2-core machine swing by +-2-3% from one run to the next,
as much as the whole difference being judged. The instructions the training thread executes
per step do not: valgrind's callgrind counts them (user space, this thread only), the same on
a loaded machine as on a quiet one, to the last few. So a change to the hot path is judged
here by its instructions, and by its simulated first-level cache misses (the training thread
meets ddpviz's code cold after the step's torch work: See [Note: the plain wrapper's calls]);
time ratios stay bench_watch.py's and bench_nonfinite.py's, measured quiet.

One gloo rank (world size 1: the per-step hooks of any world size, no peers' traffic),
bench_watch.py's models, SGD, batch 16. Each variant runs in a process of its own under
callgrind with instrumentation off; after 300 warm-up steps (past the NaN check's first
window), collection is switched on for `--steps` steps and a dump is taken before every
backward (torch's PythonEngine::execute), so each dump holds one step (its backward, optimizer
step and the next forward). The NaN check's period is held at every 16th step (its budget sets
it from times, which valgrind's slowdown distorts; ~1 ms steps get every 16th or 32nd).
Printed per variant: the median step's instructions (a plain step), the mean over all steps
(plain ones and the periodic ones: the sampled every 100th, the replica check, the NaN check's
checked steps, the heartbeat's every 64th), first-level cache misses per step, and each as a
ratio to torch's DDP alone.

    PYTHONPATH=. python benchmarks/bench_instructions.py [--steps 200] [--models "~100 params"]
        [--variants torch,default,...] [--heavy]
    PYTHONPATH=. python benchmarks/bench_instructions.py --calls 500

`--calls N`: instead, what one of the job's own collectives costs to record (issue #34): N
all_reduces of 1 float under watch(), torch's function against the ledger's wrapper around
it, the calling thread's instructions per call.

Needs valgrind (apt install valgrind); about 1-2 minutes a variant.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _ranks import free_port
from bench_watch import MODELS, _model

WARMUP = 300
EVERY = 16  # the NaN check's period held while counting
TRIGGER = "torch::autograd::python::PythonEngine::execute(*"  # one dump a step, before its backward

VARIANTS = {
    "torch": "torch's DDP alone",
    "default": "ddpviz.watch(ddp)",
    "no canaries": "the contract's canary hooks dropped",
    "no NaN check": "the every-step NaN check closed",
    "no replicas": "Recording(replicas=None)",
    "no sampling": "Recording(every=None, replicas=None)",
}


def _child(variant: str, dims: tuple[int, int, int], steps: int, gate: Path) -> None:
    """One variant's process (under callgrind): warm up, say so, wait for the gate, train."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(1)
    ddp = nn.parallel.DistributedDataParallel(_model(dims))
    watch = None
    if variant != "torch":
        import ddpviz

        recording = {"no replicas": ddpviz.Recording(replicas=None),
                     "no sampling": ddpviz.Recording(every=None, replicas=None)}.get(variant)
        watch = ddpviz.watch(ddp, recording=recording)
        if variant == "no canaries":
            watch._contract.drop_canaries()
        elif variant == "no NaN check":
            watch._buckets_nf.close()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, dims[0], generator=g), torch.randn(16, dims[-1], generator=g)

    def step() -> None:
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(WARMUP):
        step()
    nf = getattr(watch, "_buckets_nf", None)
    if nf is not None:
        nf.budget.every, nf.budget._set_at = EVERY, 1 << 62
    print(f"WARM {os.getpid()}", flush=True)
    while not gate.exists():
        time.sleep(0.05)
    for _ in range(steps):
        step()
    print("DONE", flush=True)
    while not (gate.parent / "stop").exists():
        time.sleep(0.05)
    if watch is not None:
        watch.close()
    dist.destroy_process_group()


def _calls_child(variant: str, calls: int, gate: Path) -> None:
    """`calls` all_reduces of 1 float under watch() (the ledger on): torch's function itself
    ("plain") or the ledger's wrapper around it ("recorded")."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn

    import ddpviz

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(1)
    watch = ddpviz.watch(nn.parallel.DistributedDataParallel(nn.Linear(4, 4)))
    call = dist.all_reduce if variant == "recorded" else \
        dist.all_reduce.__ddpviz_original__  # type: ignore[attr-defined]
    t = torch.ones(1)
    for _ in range(200):
        call(t)
    print(f"WARM {os.getpid()}", flush=True)
    while not gate.exists():
        time.sleep(0.05)
    for _ in range(calls):
        call(t)
    print("DONE", flush=True)
    while not (gate.parent / "stop").exists():
        time.sleep(0.05)
    watch.close()
    dist.destroy_process_group()


def _wait_for(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(word):
            return line
    raise SystemExit(f"ddpviz: the benchmark's process ended before saying {word} "
                     f"(exit {proc.wait()})")


def _run(variant: str, dims: tuple[int, ...], steps: int) -> list[tuple[int, int]]:
    """(instructions, L1 misses) of the training thread, per step."""
    with tempfile.TemporaryDirectory(prefix="ddpviz-instr-") as folder:
        out = Path(folder)
        _collect(out, [f"--dump-before={TRIGGER}"],
                 ["--child", variant, ",".join(map(str, dims)), str(steps), str(out / "go")])
        return _per_step(out)


def _per_call(variant: str, calls: int) -> float:
    """Instructions of the calling thread per all_reduce (see `_calls_child`)."""
    with tempfile.TemporaryDirectory(prefix="ddpviz-instr-") as folder:
        out = Path(folder)
        _collect(out, [], ["--calls-child", variant, str(calls), str(out / "go")])
        total = next(line for line in (out / "cg.out-01").read_text().splitlines()
                     if line.startswith("totals:"))
        return int(total.split()[1]) / calls


def _collect(out: Path, options: list[str], child: list[str]) -> None:
    """Run this file's `child` under callgrind, collecting only between its WARM and DONE."""
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           "--cache-sim=yes", *options, f"--callgrind-out-file={out / 'cg.out'}",
           sys.executable, __file__, *child]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        pid = _wait_for(proc, "WARM").split()[1]
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True,
                       capture_output=True)
        (out / "go").touch()
        _wait_for(proc, "DONE")
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True,
                       capture_output=True)
        (out / "stop").touch()
        proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()


def _per_step(out: Path) -> list[tuple[int, int]]:
    """The training thread's (thread 1) dumps, in order: one per step. callgrind names the
    n-th dump `cg.out.n-01`; the first holds what ran from the gate to the first backward."""
    dumps = sorted((int(p.name.split(".")[2].split("-")[0]), p)
                   for p in out.glob("cg.out.*-01"))
    steps = []
    for _, path in dumps[1:]:
        for line in path.read_text().splitlines():
            if line.startswith("totals:"):
                # events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
                ir, _dr, _dw, i1, d1r, d1w, *_ = (int(v) for v in line.split()[1:])
                steps.append((ir, i1 + d1r + d1w))
    return steps


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        name, shape, count, gate = sys.argv[2:6]
        _child(name, tuple(int(d) for d in shape.split(",")), int(count), Path(gate))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--calls-child":
        _calls_child(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--heavy", action="store_true",
                        help="also list the steps over 1.01x the median (step: extra)")
    parser.add_argument("--calls", type=int, default=0,
                        help="instead: instructions per all_reduce of 1 float, torch's and "
                             "recorded by the ledger, over this many calls (e.g. 500)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("ddpviz: bench_instructions.py needs valgrind (apt install valgrind).")
    if args.calls:
        plain, recorded = (_per_call(v, args.calls) for v in ("plain", "recorded"))
        print(f"one all_reduce of 1 float, world size 1, the calling thread's instructions: "
              f"torch's {plain:,.0f}, recorded by the ledger {recorded:,.0f} "
              f"(+{recorded - plain:,.0f}, {recorded / plain:.3f}x)")
        return
    variants = args.variants.split(",")
    if variants[0] != "torch":
        variants.insert(0, "torch")
    print(f"The training thread per step, world size 1, {args.steps} steps after {WARMUP} "
          f"(NaN check every {EVERY}th step); instructions and L1 misses counted by callgrind")
    print(f"{'model':12} {'variant':14}{'plain step':>12}{'ratio':>8}{'mean step':>12}"
          f"{'ratio':>8}{'L1 misses':>11}{'ratio':>8}{'extra/step':>12}")
    for model_name in args.models.split(","):
        dims = MODELS[model_name]
        base: tuple[float, float, float] | None = None
        for variant in variants:
            per_step = _run(variant, dims, args.steps)
            plain = statistics.median(ir for ir, _ in per_step)
            mean = statistics.fmean(ir for ir, _ in per_step)
            misses = statistics.fmean(m for _, m in per_step)
            if base is None:
                base = (plain, mean, misses)
            print(f"{model_name:12} {variant:14}{plain:>12,.0f}{plain / base[0]:>8.3f}"
                  f"{mean:>12,.0f}{mean / base[1]:>8.3f}{misses:>11,.0f}"
                  f"{misses / base[2]:>8.3f}{mean - base[1]:>12,.0f}", flush=True)
            if args.heavy:
                heavy = [f"{WARMUP + i}: +{ir - plain:,.0f}" for i, (ir, _) in enumerate(per_step)
                         if ir > 1.01 * plain]
                print(f"    over the median: {len(heavy)} steps, {'; '.join(heavy)}")


if __name__ == "__main__":
    main()
