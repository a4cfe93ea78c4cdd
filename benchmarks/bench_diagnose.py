"""diagnose() alone on big traces: CPU time and events/s, optionally against another checkout.

Each trace is loaded once; then `diagnose(trace)` runs `--rounds` times (after a first call
that builds the columns' snapshot, which is load's work, reported on its own line). With
`--against DIR`, the `ddpviz/_diagnose/diagnosis.py` and `ddpviz/_diagnose/straggler.py` of another
checkout (for example the main branch's worktree) run interleaved with this one's on the same
loaded trace, and their findings must be equal. `--profile` prints cProfile's top functions of one
call.
CPU time of this process (time.process_time): on a shared machine the steadier figure.

    PYTHONPATH=. python benchmarks/bench_diagnose.py TRACE.ddpviz... [--against /work/main]

Traces: the ones `benchmarks/bench_scale.py --keep DIR` writes (scale-64x1000x20.ddpviz,
scale-256x10000x5.ddpviz, ...).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.findings import Findings
from ddpviz.traces.trace import Trace


def cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def other_diagnose(root: Path) -> Callable[[Trace], Findings]:
    """`diagnose` of the checkout at `root` (its _diagnose.py and straggler.py; the rest of
    ddpviz is this one's)."""
    mods: dict[str, ModuleType] = {}
    for name in ("straggler", "_diagnose"):
        spec = importlib.util.spec_from_file_location(f"against_{name}",
                                                      root / "ddpviz" / f"{name}.py")
        assert spec is not None and spec.loader is not None, root
        mods[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[name])

    def run(trace: Trace) -> Findings:
        ours = sys.modules["ddpviz._diagnose.straggler"]
        sys.modules["ddpviz._diagnose.straggler"] = mods["straggler"]  # what its _straggler imports
        try:
            return mods["_diagnose"].diagnose(trace)
        finally:
            sys.modules["ddpviz._diagnose.straggler"] = ours

    return run


def bench(path: Path, rounds: int, against: Path | None, profile: bool) -> None:
    load_s, trace = cpu(lambda: Trace.load(path))
    n = len(trace)
    print(f"\n## {path.name}: {n:,} events (load {load_s:.2f} CPU s)\n")
    first_s, _ = cpu(trace.columns)
    print(f"first columns snapshot (load's work, paid by the first reader): {first_s:.3f} "
          "CPU s\n")
    runs: dict[str, tuple[Callable[[Trace], Findings], list[float]]] = {"this": (diagnose, [])}
    if against is not None:
        runs[str(against)] = (other_diagnose(against), [])
    found: dict[str, Findings] = {}
    for _ in range(rounds):
        for label, (fn, times) in runs.items():
            seconds, found[label] = cpu(lambda fn=fn: fn(trace))  # type: ignore[misc]
            times.append(seconds)
    print("| diagnose() of | CPU s (median) | events/CPU-s | runs | findings |")
    print("|---|---|---|---|---|")
    for label, (_, times) in runs.items():
        median = statistics.median(times)
        kinds = ", ".join(sorted({f.kind for f in found[label]})) or "none"
        print(f"| {label} | {median:.3f} | {n / median / 1e6:.1f}M | "
              f"{' '.join(f'{t:.3f}' for t in times)} | {len(found[label])} ({kinds}) |")
    if against is not None:
        same = found[str(against)] == found["this"]
        print(f"\nfindings equal: {same}")
    if profile:
        prof = cProfile.Profile()
        prof.runcall(diagnose, trace)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout whose diagnose runs interleaved with this one")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    for path in args.traces:
        bench(path, args.rounds, args.against, args.profile)


if __name__ == "__main__":
    main()
