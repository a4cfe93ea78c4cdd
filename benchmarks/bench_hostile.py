"""What small hostile files cost: load, diagnose, dashboard, report and Chrome export of each
trace of tests/security/bombs.py, and the postmortem's reading of each Flight Recorder dump of
tests/security/dump_bombs.py, each operation in its own process under a memory cap (RLIMIT_AS)
and a time cap; seconds and the process's peak RSS. With --before PATH, the same for another
checkout (e.g. main before issue #12) side by side.

    python benchmarks/bench_hostile.py [--before /path/to/other/checkout] [--cap-s 120]
        [--only SUBSTRING] [--dumps-only | --traces-only]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's ddpviz and tests

from tests.security.bombs import BOMBS, write  # noqa: E402
from tests.security.dump_bombs import DUMP_BOMBS  # noqa: E402

OPS = ("load", "diagnose", "dashboard", "report", "chrome")
CHILD = r"""
import json, resource, sys, time, warnings
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[3]) << 20, int(sys.argv[3]) << 20))
warnings.simplefilter("ignore")
import ddpviz
from ddpviz.traces.trace import Trace
t0 = time.perf_counter()
try:
    op = sys.argv[2]
    trace = Trace.load(sys.argv[1]) if op != "dumps" else None
    if op == "dumps":
        from ddpviz._postmortem.dumps import load_dumps
        load_dumps(sys.argv[1])
    elif op == "diagnose":
        ddpviz.diagnose(trace)
    elif op == "dashboard":
        d = trace.dashboard()  # (what the kernel does: the bytes, the findings; drawn in TS)
        d.close()
    elif op == "report":
        from ddpviz.report import html as report
        report.render(trace)
    elif op == "chrome":
        trace.to_chrome_trace()
    out = "ok"
except MemoryError:
    out = "MemoryError"
except Exception as e:
    out = type(e).__name__
# VmHWM: this process image's peak RSS (ru_maxrss would carry the spawning parent's over exec)
peak = next(int(line.split()[1]) for line in open("/proc/self/status")
            if line.startswith("VmHWM:")) / 1024
print(json.dumps([out, time.perf_counter() - t0, peak]))
"""


def run(tree: Path, path: Path, op: str, cap_s: float, mem_mb: int) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, str(path), op, str(mem_mb)],
                           env=env, cwd=tree, capture_output=True, text=True,
                           timeout=cap_s)
    except subprocess.TimeoutExpired:
        return f">{cap_s:.0f} s (killed)"
    try:
        outcome, seconds, peak = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return f"died rc={p.returncode}"
    return f"{outcome} {seconds:.2f} s {peak:,.0f} MB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, help="another checkout to compare with")
    ap.add_argument("--cap-s", type=float, default=120.0)
    ap.add_argument("--mem-mb", type=int, default=3072)
    ap.add_argument("--only", help="substring of the bombs to run")
    ap.add_argument("--dumps-only", action="store_true")
    ap.add_argument("--traces-only", action="store_true")
    args = ap.parse_args()
    trees = [("after", ROOT)] + ([("before", args.before)] if args.before else [])
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in {} if args.dumps_only else BOMBS.items():
            if args.only and args.only not in name:
                continue
            path = write(Path(tmp) / "bomb.ddpviz", make())
            print(f"\n{name} ({path.stat().st_size:,} bytes)")
            print(f"  {'op':<10}" + "".join(f"{label:<34}" for label, _ in trees))
            for op in OPS:
                cells = [run(tree, path, op, args.cap_s, args.mem_mb) for _, tree in trees]
                print(f"  {op:<10}" + "".join(f"{c:<34}" for c in cells), flush=True)
        for name, make_dump in {} if args.traces_only else DUMP_BOMBS.items():
            if args.only and args.only not in name:
                continue
            path = Path(tmp) / "fr_0"
            path.write_bytes(make_dump())
            cells = [run(tree, path, "dumps", args.cap_s, args.mem_mb) for _, tree in trees]
            print(f"\n{name} ({path.stat().st_size:,} bytes)\n  {'postmortem':<12}"
                  + "".join(f"{c:<34}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
