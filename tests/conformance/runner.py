"""Conformance run: torch 2.13's own DDP tests (`DistributedTest._DistTestBase` in the installed
wheel's distributed_test.py), on gloo and CPU, each test in fresh rank processes, first with
torch's DistributedDataParallel, then with ddpviz's swapped in inside every rank.

    python -m tests.conformance.runner [--world-sizes 2 3] [--engines torch ddpviz] [-k SUBSTR]

Writes out/conformance/results.json (one row per test, engine and world size: outcome, seconds,
ddpviz constructions counted inside the ranks, the last error line) and out/conformance/table.md.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out" / "conformance"

# Tests whose assertions are about torch's C++ objects themselves (dist.Reducer, the C++ Logger),
# not about DDP's behaviour. They count as "allowed" when they fail with ddpviz only.
ALLOW_LIST: dict[str, str] = {}

# Tests that run a first iteration in which a parameter gets no gradient (with
# find_unused_parameters=False) and expect it to pass, catching torch's error at the next one.
# ddpviz raises at the end of that first backward (torch silently leaves the bucket's gradients
# un-averaged there); with DDPVIZ_UNUSED_ERROR_AT=forward it raises where torch does, with the
# same text. These tests run ddpviz that way, and the table says so.
TORCH_TIMING: dict[str, str] = dict.fromkeys((
    "test_ddp_control_flow_same_across_ranks",
    "test_ddp_control_flow_different_across_ranks",
    "test_ddp_multiple_nested_unused_params_error",
    "test_ddp_multiple_nested_unused_params_err_ignore_params",
    "test_ddp_unused_params_rebuild_buckets_exception",
), "DDPVIZ_UNUSED_ERROR_AT=forward")

# A representative subset for CI (`pytest -m conformance`): construction, training against a
# local model, find_unused, static_graph, hooks, pickling, errors at iteration 0.
CI_SUBSET = (
    "test_DistributedDataParallelCPU",
    "test_ddp_unused_params_rebuild_buckets_exception",
    "test_static_graph_multi_forward",
    "test_ddp_logging_data_cpu",
    "test_ddp_hook_parity_allreduce",
)


@dataclass(frozen=True)
class Outcome:
    test: str
    engine: str  # "torch" or "ddpviz"
    world_size: int
    shim: bool  # ran under the CPU shim (cpu_shim.py): a GPU-decorated test
    status: str  # "passed", "failed", "skipped", "timeout"
    seconds: float
    constructions: int  # ddpviz DistributedDataParallel objects built inside the ranks
    detail: str  # skip reason or the last error line


def _dist_test_base(world_size: int) -> type:
    """torch's test class, imported here only to read its source (its module reads BACKEND and
    WORLD_SIZE at import; they are set for the import only)."""
    saved = {k: os.environ.get(k) for k in ("BACKEND", "WORLD_SIZE")}
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(world_size))
    try:
        from torch.testing._internal.distributed.distributed_test import DistributedTest
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return DistributedTest._DistTestBase


def ddp_tests(world_size: int = 2) -> list[str]:
    """The tests of `_DistTestBase` that construct a DDP, directly or through a helper method."""
    base = _dist_test_base(world_size)
    sources: dict[str, str] = {}
    for name, fn in vars(base).items():
        fn = inspect.unwrap(fn) if callable(fn) else fn
        if callable(fn):
            try:
                sources[name] = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
    builds = {n for n, s in sources.items() if "DistributedDataParallel" in s}
    grew = True
    while grew:
        grew = False
        for name, src in sources.items():
            if name not in builds and any(f"self.{h}(" in src for h in builds):
                builds.add(name)
                grew = True
    return sorted(n for n in builds if n.startswith("test_"))


def needs_shim(test: str, world_size: int = 2) -> bool:
    """GPU-decorated or CUDA-using tests: run under the CPU shim (cpu_shim.py)."""
    fn = vars(_dist_test_base(world_size))[test]
    try:
        src = inspect.getsource(fn).lower()  # decorators included
    except (OSError, TypeError):
        return False
    return "gpu" in src or "cuda" in src


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Failure)\b", ln) or ln.startswith(
            ("AssertionError", "RuntimeError", "TypeError", "AttributeError", "ValueError")
        ):
            return ln[:300]
    for ln in reversed(lines):
        if "Process " in ln and "exited with" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else ""


def run_batch(tests: list[str], engine: str, world_size: int, timeout: float,
              shim: bool = False) -> list[Outcome]:
    """Runs torch tests one after another in one parent process (torch's spawn flow: each test
    in its own fresh rank processes) and classifies each. The parent and its import of torch's
    suite are shared; a test that hangs past `timeout` (+30 s) or ends the parent is named, and
    the tests after it run again in a new parent."""
    outcomes: list[Outcome] = []
    left = list(tests)
    while left:
        done = _run_parent(left, engine, world_size, timeout, shim)
        outcomes += done
        left = left[len(done):]
    return outcomes


def _run_parent(tests: list[str], engine: str, world_size: int, timeout: float,
                shim: bool) -> list[Outcome]:
    """One parent process for `tests`: the outcomes of a prefix of them, at least the first."""
    with tempfile.TemporaryDirectory(prefix="ddpviz-conf-") as tmp:
        count_dir = Path(tmp) / "counts"
        temp_dir = Path(tmp) / "torch"
        results = Path(tmp) / "results.jsonl"
        log = Path(tmp) / "output.log"
        count_dir.mkdir()
        temp_dir.mkdir()
        env = dict(os.environ)
        env.update(
            BACKEND="gloo",
            WORLD_SIZE=str(world_size),
            TEMP_DIR=str(temp_dir),
            INIT_METHOD="env://",
            DDPVIZ_CONFORMANCE_ENGINE=engine,
            DDPVIZ_CONFORMANCE_COUNT_DIR=str(count_dir),
            DDPVIZ_CONFORMANCE_RESULTS=str(results),
            DDPVIZ_CONFORMANCE_TORCH_TIMING=",".join(
                t for t in tests if engine == "ddpviz" and t in TORCH_TIMING),
            PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
            PYTORCH_PRINT_REPRO_ON_FAILURE="0",
            DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(int(timeout)),
            DDPVIZ_CONFORMANCE_CPU_SHIM="1" if shim else "0",
        )
        env.pop("DDPVIZ_UNUSED_ERROR_AT", None)  # per test, in torch_spawn (TORCH_TIMING)
        # torch's test harness reads CI=1 (set by most CI systems) as "write JUnit XML through
        # xmlrunner", a package neither engine needs: the ranks run as on a developer's machine.
        env.pop("CI", None)

        def finished() -> list[dict[str, object]]:
            if not results.exists():
                return []
            lines = results.read_text().splitlines()
            return [json.loads(ln) for ln in lines[:-1] if ln.strip()] + (
                [json.loads(lines[-1])] if lines and lines[-1].endswith("}") else [])

        start = time.monotonic()
        timed_out = False
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.conformance.torch_spawn", *tests],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # the ranks join this session: one killpg ends them all
            )
            try:
                count, since = 0, time.monotonic()  # each test has timeout + 30 s of its own
                while proc.poll() is None:
                    time.sleep(0.5)
                    n = len(finished())
                    if n != count:
                        count, since = n, time.monotonic()
                    elif time.monotonic() - since > timeout + 30:
                        timed_out = True
                        break
            finally:
                with contextlib.suppress(ProcessLookupError):  # and ranks left by a crash
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.monotonic() - start
        text = log.read_text(errors="replace")
        rows = finished()

        built = {t: sum(len(p.read_text().splitlines())
                        for p in count_dir.glob(f"{t}.*.count")) for t in tests}

    by = {str(r["test"]): r for r in rows}
    outcomes = []
    for t in tests:  # the tests in order up to the first without a result (run again after it)
        if t not in by:
            break
        r = by[t]
        outcomes.append(Outcome(t, engine, world_size, shim, str(r["status"]),
                                float(r["seconds"]),  # type: ignore[arg-type]
                                built[t],
                                _last_error_line(str(r["detail"])) if r["status"] == "failed"
                                else str(r["detail"])[:200]))
    if len(outcomes) < len(tests):  # the next test hung, or its parent ended without a result
        test = tests[len(outcomes)]
        spent = round(seconds - sum(o.seconds for o in outcomes), 1)
        if timed_out:
            status, detail = "timeout", f"no result within {timeout + 30:.0f} s"
        else:
            status, detail = "failed", _last_error_line(text)
        outcomes.append(Outcome(test, engine, world_size, shim, status, spent,
                                built[test], detail))
    return outcomes


def run(
    tests: Iterable[str],
    engines: Iterable[str] = ("torch", "ddpviz"),
    world_sizes: Iterable[int] = (2,),
    timeout: float = 240,
    jobs: int = 1,
    log: bool = True,
    ddpviz_where_torch_passes: bool = False,
    jsonl: Path | None = None,
    batch: int = 8,
) -> list[Outcome]:
    """The tests of one world size and shim run in batches of up to `batch` tests, one parent
    process a batch and engine (each test still in fresh ranks); `jobs` batches at a time, the
    largest first. With `ddpviz_where_torch_passes`, a batch runs its engines in order and
    ddpviz only where torch's DDP passed (the tests that count), which halves a full run; the
    others are reported as not run. Each outcome is appended to `jsonl` as it arrives, so an
    interrupted run keeps what it measured."""
    engines = list(engines)
    tests = list(tests)
    world_sizes = list(world_sizes)
    shims = {t: needs_shim(t) for t in tests}
    follow = ddpviz_where_torch_passes and "torch" in engines
    batches: list[tuple[list[str], int, bool, list[str]]] = []
    for w in world_sizes:
        for shim in (False, True):
            group = [t for t in tests if shims[t] == shim]
            for i in range(0, len(group), batch):
                for es in [engines] if follow else [[e] for e in engines]:
                    batches.append((group[i:i + batch], w, shim, es))
    batches.sort(key=lambda b: -len(b[0]))  # the longest first: no thread left alone at the end
    done: list[Outcome] = []
    total = len(tests) * len(world_sizes) * len(engines)

    def note(o: Outcome) -> None:
        done.append(o)
        if jsonl is not None:
            with open(jsonl, "a") as f:
                f.write(json.dumps(asdict(o)) + "\n")
        if log:
            print(
                f"[{len(done)}/{total}] w={o.world_size} {o.engine:6} {o.status:7} "
                f"{'shim ' if o.shim else ''}{o.seconds:5.1f}s n={o.constructions} "
                f"{o.test} {o.detail[:120]}",
                flush=True,
            )

    def one(job: tuple[list[str], int, bool, list[str]]) -> list[Outcome]:
        group, w, shim, es = job
        outs: dict[tuple[str, str], Outcome] = {}
        for e in es:
            runs = group
            if e == "ddpviz" and follow:
                runs = [t for t in group if outs[(t, "torch")].status == "passed"]
                for t in group:
                    if t not in runs:
                        outs[(t, e)] = Outcome(t, e, w, shim, "not run", 0.0, 0,
                                               "torch's DDP did not pass")
                        note(outs[(t, e)])
            for o in run_batch(runs, e, w, timeout=timeout, shim=shim) if runs else []:
                outs[(o.test, e)] = o
                note(o)
        return list(outs.values())

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        found = {(o.test, o.engine, o.world_size): o
                 for outs in pool.map(one, batches) for o in outs}
    return [found[(t, e, w)] for w in world_sizes for t in tests for e in engines]


def table(outcomes: list[Outcome]) -> str:
    """Markdown: per world size and engine, passed/failed/skipped, and the conformance verdict."""
    by = {(o.test, o.engine, o.world_size): o for o in outcomes}
    sizes = sorted({o.world_size for o in outcomes})
    lines = [
        "| world size | engine | tests | passed | failed | skipped | not run "
        "| ddpviz DDPs built in ranks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in sizes:
        for e in ("torch", "ddpviz"):
            rows = [o for o in outcomes if o.world_size == w and o.engine == e]
            if not rows:
                continue
            n = {s: sum(o.status == s for o in rows) for s in ("passed", "skipped", "not run")}
            failed = len(rows) - n["passed"] - n["skipped"] - n["not run"]
            built = sum(o.constructions for o in rows)
            lines.append(
                f"| {w} | {e} | {len(rows)} | {n['passed']} | {failed} | {n['skipped']} | "
                f"{n['not run']} | "
                f"{built if e == 'ddpviz' else '-'} |"
            )
    lines.append("")
    for w in sizes:
        base = [t for (t, e, ws), o in by.items() if e == "torch" and ws == w
                and o.status == "passed"]
        if not base or not any(e == "ddpviz" and ws == w for (_, e, ws) in by):
            continue
        ok = [t for t in base if by.get((t, "ddpviz", w)) and by[(t, "ddpviz", w)].status
              == "passed"]
        missing = sorted(set(base) - set(ok))
        allowed = [t for t in missing if t in ALLOW_LIST]
        unbuilt = sorted(t for t in ok if by[(t, "ddpviz", w)].constructions == 0)
        lines.append(
            f"world size {w}: ddpviz passes {len(ok)} of the {len(base)} tests that pass with "
            f"torch's DDP ({len(allowed)} allow-listed); {len(unbuilt)} of those built no DDP "
            f"in the ranks ({', '.join(unbuilt) or '-'})."
        )
        for t in missing:
            o = by.get((t, "ddpviz", w))
            why = ALLOW_LIST.get(t, o.detail if o else "not run")
            lines.append(f"  - {t}: {why}")
        timed = sorted(t for t in ok if t in TORCH_TIMING)
        if timed:
            lines.append(f"  of those, {len(timed)} ran ddpviz with torch's error timing "
                         f"(DDPVIZ_UNUSED_ERROR_AT=forward): {', '.join(timed)}")
    return "\n".join(lines) + "\n"


_LOG_LINE = re.compile(r"^\[\d+/\d+\] w=(\d+) (\w+)\s+(passed|failed|skipped|timeout|not run)\s+"
                       r"(shim )?\s*([\d.]+)s n=(\d+) (\S+) ?(.*)$")


def outcomes_from_log(text: str) -> list[Outcome]:
    """Outcomes from the progress lines a run printed (for a run stopped before its end)."""
    found = []
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m:
            w, e, status, shim, secs, n, test, detail = m.groups()
            found.append(Outcome(test, e, int(w), bool(shim), status, float(secs), int(n),
                                 detail))
    return found


def merge(base: list[Outcome], newer: list[Outcome]) -> list[Outcome]:
    """`base` with every (test, engine, world size) that `newer` measured replaced."""
    latest = {(o.test, o.engine, o.world_size): o for o in newer}
    merged = [latest.pop((o.test, o.engine, o.world_size), o) for o in base]
    return merged + list(latest.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--engines", nargs="+", default=["torch", "ddpviz"])
    ap.add_argument("-k", dest="substr", action="append", default=[],
                    help="run only tests whose name contains this (repeatable)")
    ap.add_argument("--ci-subset", action="store_true")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per test")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--list", action="store_true", help="print the selected tests and exit")
    ap.add_argument("--all-ddpviz", action="store_true",
                    help="run ddpviz's engine also where torch's DDP did not pass")
    ap.add_argument("--resume", type=Path, action="append", default=[],
                    help="results.json/.jsonl or a run's log: start from these outcomes")
    ap.add_argument("--rerun-failed", action="store_true",
                    help="with --resume: run again only the ddpviz runs that did not pass "
                         "where torch's DDP passed (after an engine fix)")
    ap.add_argument("--table-only", action="store_true",
                    help="with --resume: write results and table of those outcomes, run nothing")
    args = ap.parse_args(argv)
    previous: list[Outcome] = []
    for path in args.resume:
        text = path.read_text()
        if path.suffix == ".json":
            rows = [Outcome(**r) for r in json.loads(text)]
        elif path.suffix == ".jsonl":
            rows = [Outcome(**json.loads(ln)) for ln in text.splitlines() if ln.strip()]
        else:
            rows = outcomes_from_log(text)
        previous = merge(previous, rows)

    tests = list(CI_SUBSET) if args.ci_subset else ddp_tests()
    if args.substr:
        tests = [t for t in tests if any(s in t for s in args.substr)]
    if args.list:
        print("\n".join(tests))
        print(f"{len(tests)} tests")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / "results.jsonl"
    jsonl.unlink(missing_ok=True)
    if args.table_only:
        outcomes = previous
    elif args.rerun_failed:
        by = {(o.test, o.engine, o.world_size): o for o in previous}
        outcomes = list(previous)
        for w in args.world_sizes:
            again = [t for t in tests if by.get((t, "torch", w)) is not None
                     and by[(t, "torch", w)].status == "passed"
                     and by.get((t, "ddpviz", w)) is not None
                     and by[(t, "ddpviz", w)].status != "passed"]
            outcomes = merge(outcomes, run(again, ["ddpviz"], [w], args.timeout, args.jobs,
                                           jsonl=jsonl))
    else:
        outcomes = merge(previous, run(tests, args.engines, args.world_sizes, args.timeout,
                                       args.jobs, ddpviz_where_torch_passes=not args.all_ddpviz,
                                       jsonl=jsonl))
    (args.out / "results.json").write_text(
        json.dumps([asdict(o) for o in outcomes], indent=1) + "\n"
    )
    md = table(outcomes)
    (args.out / "table.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
