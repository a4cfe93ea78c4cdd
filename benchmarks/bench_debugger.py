"""What arming the debugger (ddpviz/debugger/) costs a step of ddpviz's DDP, side by side: CPU,
gloo, in the same rank processes.

Copies of one model train in alternating blocks of steps (the order rotating every repetition;
benchmarks/_ranks.py): ddpviz's DDP without a debugger, with one installed but never commanded
(unarmed: one attribute test at each safe point), and with one armed by an `Arm` command and
no break set (each forward reads the agreed boundary from the store: one TCPStore round trip a
step, never met), and armed with a break that is never met: `break_when("step < 0")` (the
predicate evaluated after each forward in the loop's names; the optimizer-step evaluation,
through install()'s global optimizer hook, is not in this loop) and
`break_on("nonfinite_gradient")` (each bucket's flat buffer tested for finiteness before its
all-reduce). Events go to an emitter that drops them. Printed: the median over
repetitions of each copy's block wall time / the plain copy's, and the armed copy's extra per
step in us (median of the per-block differences). Not a test: a measurement to read.

    PYTHONPATH=. python benchmarks/bench_debugger.py [--reps 100] [--block 5] [--world 2]

`latency`: how soon every rank is parked once a stop is due, at `--world` (4) ranks launched
with `ddpviz.launch(..., debug=True)` on ddpviz's DDP, read from the ranks' own clocks (the
`t_ns` of each rank's Parked event; one machine, one monotonic clock): from the moment the
condition is met on the triggering rank to the last rank parked. Three triggers, `--runs` (5)
stops each: a `break_when` predicate true on rank 1 at a step (from the start of that step's
forward on rank 1: an upper bound, the predicate is evaluated after the forward), a finding (a
NaN rank 1 plants in its local gradient: from the planting; the step is skipped, as a
GradScaler would, so the next stop comes from the next NaN) and `dbg.pause()` (from the
notebook's call; the first once the job has trained WARM steps). Printed: median and max
over the stops, and each, per trigger.

`inspect`: the wall time of `dbg.inspect(name)` (a summary of every rank's tensor: norms,
NaN/Inf counts, digests) of a 10M-element parameter across `--world` (4) parked ranks, value
and gradient, `--runs` calls each: median and max.

    PYTHONPATH=. python benchmarks/bench_debugger.py latency [--world 4] [--runs 5]
    PYTHONPATH=. python benchmarks/bench_debugger.py inspect [--world 4] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ranks import interleaved_blocks, join_gloo, mlp, run_ranks

DIMS = (64, 256, 256, 256, 8)
WARM = 20  # steps the `latency` pause job trains before its first pause


def _model() -> nn.Module:
    return mlp(DIMS)


def _rank(rank: int, world: int, port: int, reps: int, block: int, out: Any) -> None:
    import ddpviz
    from ddpviz.debugger import controller
    from ddpviz.debugger.protocol import Arm, BreakOn, BreakWhen, SetBreaks

    join_gloo(rank, world, port)

    def drop(event: Any) -> None:
        pass

    variants: dict[str, Any] = {}
    variants["ddpviz DDP"] = ddpviz.DistributedDataParallel(_model())
    unarmed = controller.Controller(drop, rank)
    controller._current = unarmed  # what install() sets; the DDP built next attaches to it
    variants["debugger unarmed"] = ddpviz.DistributedDataParallel(_model())
    armed = controller.Controller(drop, rank)
    armed.receive((Arm(1),))  # armed at its first forward
    controller._current = armed
    variants["debugger armed"] = ddpviz.DistributedDataParallel(_model())
    # breaks never met: a predicate evaluated twice a step in the loop's names, and a finding
    # break (its bucket points test each flat buffer's finiteness)
    for name, brk in (("break_when never true", BreakWhen(predicate="step < 0")),
                      ("break_on nonfinite", BreakOn(kind="nonfinite_gradient"))):
        c = controller.Controller(drop, rank)
        c.receive((Arm(1),))
        c._apply(SetBreaks(2, breaks=(brk,)))  # as every rank does at the agreed boundary
        controller._current = c
        variants[name] = ddpviz.DistributedDataParallel(_model())
    controller._current = None
    t = interleaved_blocks(variants, rank, DIMS, reps=reps, block=block, warmup=5)
    assert armed.armed and not unarmed.armed and not armed.parked
    out.put((rank, t.wall))


def _job(mode: str, steps: int, out: str, every: int, go: str, width: int) -> None:
    """A rank of the `latency` and `inspect` jobs (pickled by value: this is __main__)."""
    import json
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch import nn

    import ddpviz

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 8))
    ddp = ddpviz.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    marks: dict[int, int] = {}
    step = 0

    def plant(g: torch.Tensor) -> torch.Tensor:
        if mode == "finding" and rank == 1 and step % every == every // 2:
            marks[step] = time.monotonic_ns()
            g = g.clone()
            g.view(-1)[0] = float("nan")
        return g

    model[0].weight.register_hook(plant)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 64, generator=gen), torch.randn(32, 8, generator=gen)
    while not os.path.exists(go):
        time.sleep(0.01)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        if mode == "predicate" and rank == 1 and step % every == every // 2:
            marks[step] = time.monotonic_ns()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        if all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()
               if p.grad is not None):
            opt.step()  # a step with a non-finite gradient is skipped (as GradScaler does)
        if mode == "pause":
            time.sleep(0.005)
    with open(os.path.join(out, f"marks{rank}.json"), "w") as f:
        json.dump(marks, f)


def _launch(mode: str, world: int, steps: int, tmp: str, every: int, width: int) -> Any:
    import ddpviz

    go = os.path.join(tmp, f"go-{mode}")
    run = ddpviz.launch(_job, world, args=(mode, steps, tmp, every, go, width), debug=True,
                        timeout=1800)
    if not run.session.collector.wait(lambda s: len(s.peers) == world, timeout=300):
        run.stop()
        raise SystemExit("ddpviz: the benchmark's ranks never connected")
    return run, go


def _parked_since(run: Any, seen: int) -> list[Any]:
    from ddpviz import events as ev

    return [e for e in run.trace.events() if isinstance(e, ev.Parked)
            and e.reason != "already parked"][seen:]  # (a pause that found the rank parked)


def _latency(mode: str, world: int, runs: int, tmp: str) -> list[float]:
    """Seconds from the trigger to the last rank parked, one per stop."""
    import time

    every = 20
    steps = every * (runs + 1) if mode != "pause" else 100_000
    run, go = _launch(mode, world, steps, tmp, every, 256)
    out: list[float] = []
    try:
        dbg = run.debugger
        if mode == "predicate":
            dbg.break_when(f"step % {every} == {every // 2} and rank == 1")
        elif mode == "finding":
            dbg.break_on("nonfinite_gradient")
        time.sleep(2.0)  # the break set reached every rank
        Path(go).touch()
        seen = 0
        parks: list[tuple[int, list[Any]]] = []
        if mode == "pause":  # the first pause comes once the job has trained WARM steps
            while dbg.next_step() < WARM:  # (its first steps are slow: see the docs)
                time.sleep(0.05)
        for _ in range(runs):
            if mode == "pause":
                time.sleep(0.5)  # training
                t0 = time.monotonic_ns()
                dbg.pause()
            stop = dbg.wait(timeout=300)
            parked = _parked_since(run, seen)
            while len(parked) < world:
                time.sleep(0.05)
                parked = _parked_since(run, seen)
            seen += len(parked)
            assert stop.agreed and {e.step for e in parked} == {stop.step}, parked
            if mode == "pause":
                out.append((max(e.t_ns for e in parked) - t0) / 1e9)
            else:
                parks.append((stop.step, parked))
                if mode == "finding":
                    dbg.break_on("nonfinite_gradient")  # a finding break stops once
            dbg.resume(timeout=300)
        if mode == "pause":
            dbg.abort(timeout=60)
        else:
            dbg.clear()
            run.wait(timeout=1800)
            marks = json.loads((Path(tmp) / "marks1.json").read_text())
            for step, parked in parks:
                # the stop is at the forward after the step the condition was met in
                t0 = marks[str(step - 1)]
                out.append((max(e.t_ns for e in parked) - t0) / 1e9)
    finally:
        if not run.done():
            run.stop()
    return out


def _inspect(world: int, runs: int, tmp: str) -> dict[str, list[float]]:
    import time

    width = 10_000_000 // 64  # the first layer's weight: 64 x 156,250 = 10M elements
    run, go = _launch("inspect", world, 3, tmp, 1, width)
    out: dict[str, list[float]] = {"value": [], "grad": []}
    try:
        dbg = run.debugger
        dbg.break_at(step=1, where="optimizer_step")
        time.sleep(2.0)
        Path(go).touch()
        dbg.wait(timeout=600)
        for what in out:
            for _ in range(runs):
                t = time.perf_counter()
                values = dbg.inspect("0.weight", what, timeout=300)
                out[what].append(time.perf_counter() - t)
                assert values.all_equal and values[0].numel == 64 * width, values
        dbg.clear()
        dbg.resume(timeout=300)
        run.wait(timeout=1800)
    finally:
        if not run.done():
            run.stop()
    return out


def _row(name: str, xs: list[float]) -> str:
    return (f"{name:<34} {len(xs):>5} {statistics.median(xs) * 1e3:>11.0f} "
            f"{max(xs) * 1e3:>9.0f}   " + " ".join(f"{x * 1e3:.0f}" for x in xs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=("cost", "latency", "inspect"),
                        default="cost")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--world", type=int, default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", choices=("predicate", "finding", "pause"), default=None,
                        help="latency: one trigger only")
    args = parser.parse_args()
    if args.what != "cost":
        import tempfile

        world = args.world or 4
        head = f"{'':<34} {'runs':>5} {'median ms':>11} {'max ms':>9}   each (ms)"
        with tempfile.TemporaryDirectory() as tmp:
            if args.what == "latency":
                print(f"{world} gloo ranks, ddpviz's DDP: condition met -> every rank parked "
                      "(ranks' own clocks)")
                print(head)
                for mode, name in (("predicate", "break_when (predicate on rank 1)"),
                                   ("finding", "break_on (NaN planted on rank 1)"),
                                   ("pause", "dbg.pause() call")):
                    if args.only not in (None, mode):
                        continue
                    sub = os.path.join(tmp, mode)
                    os.mkdir(sub)
                    print(_row(name, _latency(mode, world, args.runs, sub)), flush=True)
            else:
                print(f"{world} gloo ranks parked: wall time of dbg.inspect of a 10M-element "
                      "float32 parameter")
                print(head)
                for what, xs in _inspect(world, args.runs, tmp).items():
                    print(_row(f"dbg.inspect(name, {what!r})", xs))
        return
    world = args.world or 2
    wall = run_ranks(_rank, world, args.reps, args.block)[0]
    base = wall["ddpviz DDP"]
    print(f"{world} gloo ranks, rank 0, {args.reps} blocks of {args.block} steps")
    print(f"{'copy':<22} {'wall / ddpviz DDP':>18}")
    for name, times in wall.items():
        ratio = statistics.median(a / b for a, b in zip(times, base, strict=True))
        print(f"{name:<22} {ratio:>18.3f}")
    d = statistics.median(a - b for a, b in zip(wall["debugger armed"], base, strict=True))
    step_us = statistics.median(base) / args.block * 1e6
    print(f"  armed - plain: {d / args.block * 1e6:+.1f} us a step (wall, median of per-block "
          f"differences; the plain step {step_us:.0f} us)")


if __name__ == "__main__":
    main()
