"""Launching a framework job recorded (`ddpviz record --out DIR -- COMMAND`) and unrecorded,
and reading what it left: each rank's report (jobs/report.py) and trace.

Every launch runs in its own process group (session) with a timeout: on a timeout or a
failed assertion nothing it started is left behind (the group is killed by its id).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz import events as ev
from tests.dist.harness import free_port
from tests.record.hooked import ROOT

JOBS = ROOT / "tests" / "frameworks" / "jobs"
WORLD = 2
TIMEOUT = 240.0  # a bound for a broken run only; a case takes 5-40 s


@dataclass
class Run:
    code: int
    out: str  # stdout and stderr together
    reports: dict[int, dict[str, Any]]
    traces: Path | None

    def trace(self, rank: int) -> ddpviz.Trace:
        assert self.traces is not None
        path = self.traces / f"ddpviz-trace-rank{rank}.ddpviz"
        # (CI once found no file for rank 0 of a Lightning job that gloo's timeout ended: say
        # what the folder and the job's output held, to find why)
        assert path.is_file(), (f"no trace file for rank {rank}; the folder holds "
                                f"{sorted(p.name for p in self.traces.glob('*'))}; exit code "
                                f"{self.code}:\n{self.out[-6000:]}")
        return ddpviz.Trace.load(path)

    def findings(self, rank: int) -> list[Any]:
        return [e.finding for e in self.trace(rank) if isinstance(e, ev.FindingReported)]


def job_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDPVIZ_", "FW_", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                "MASTER_", "ACCELERATE_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    # No user configuration (accelerate's default_config.yaml, HF caches) leaks in.
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), HF_HOME=str(home / "hf"), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               **extra)
    return env


def launch(python: str, command: list[str], tmp: Path, *, recorded: bool, name: str,
           env: dict[str, str] | None = None, timeout: float = TIMEOUT) -> Run:
    """Run `command` (recorded: under `ddpviz record --out`) with the job writing its reports
    into a fresh folder; returns what it left."""
    folder = tmp / f"{name}-{'recorded' if recorded else 'plain'}"
    folder.mkdir()
    full = dict(env or {}, FW_OUT=str(folder / "reports"))
    traces = folder / "traces" if recorded else None
    args = ([python, "-m", "ddpviz", "record", "--out", str(traces), "--", *command]
            if recorded else command)
    proc = subprocess.Popen(args, env=full, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = _kill(proc)
        pytest.fail(f"{name} ({'recorded' if recorded else 'plain'}) did not finish within "
                    f"{timeout:g}s: {' '.join(args)}\n{out[-4000:]}")
    finally:
        _kill(proc)  # whatever the job left running in its group (ranks, launch agents)
    reports = {}
    for rank in range(WORLD):
        path = folder / "reports" / f"rank{rank}.json"
        if path.is_file():
            reports[rank] = json.loads(path.read_text())
    return Run(proc.returncode, out, reports, traces)


def _kill(proc: subprocess.Popen[str]) -> str:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        return ""
    return out or ""


def side_by_side(recorded: Callable[[], Run], plain: Callable[[], Run]) -> tuple[Run, Run]:
    """A recorded run and its unrecorded reference, launched at once (each in its own ports and
    folders: fresh_port, launch's `name`): a job's ranks mostly start up and wait, so the two
    take little longer than one. Both end before this returns; a failure in either raises."""
    with ThreadPoolExecutor(max_workers=1) as pool:  # (its exit waits for the reference)
        reference = pool.submit(plain)
        first = recorded()
        second = reference.result()
    return first, second


_ISSUED: set[int] = set()
_ISSUED_LOCK = threading.Lock()


def fresh_port() -> int:
    """A free port that this process has not handed out before: two launches side by side
    never get the same one (free_port may return a port again once it is closed)."""
    with _ISSUED_LOCK:
        while (port := free_port()) in _ISSUED:
            pass
        _ISSUED.add(port)
        return port


def torchrun(python: str, script: str) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
            "--master-port", str(fresh_port()), str(JOBS / script)]


def accelerate_launch(python: str, script: str) -> list[str]:
    # A CPU multi-process launch, all on the command line (no config file): accelerate's
    # --multi_gpu launcher is torchrun; the script asks for Accelerator(cpu=True), so gloo.
    return [python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
            str(WORLD), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
            "no", "--main_process_port", str(fresh_port()), str(JOBS / script)]


def plain_python(python: str, script: str) -> list[str]:
    return [python, str(JOBS / script)]


def tail(run: Run) -> str:
    return run.out[-6000:]


def assert_finished(run: Run) -> None:
    assert run.code == 0, tail(run)
    assert sorted(run.reports) == list(range(WORLD)), tail(run)


def assert_same_parameters(recorded: Run, plain: Run) -> None:
    """Bitwise: a digest of the raw bytes of every final parameter, per rank."""
    assert_finished(plain)
    for rank in range(WORLD):
        assert recorded.reports[rank]["digest"] == plain.reports[rank]["digest"], (
            f"rank {rank}: the recorded run ended with other parameters than the unrecorded "
            f"one\n{tail(recorded)}")


def assert_traces(run: Run, *, names: str = "ddp_names") -> None:
    """A trace from every rank with its parameter names (as in the rank's report: `names`)
    and the bucket map over exactly those parameters; all-reduces done; no unsynced gradients
    named."""
    assert run.traces is not None
    files = sorted(p.name for p in run.traces.glob("ddpviz-trace-rank*.ddpviz"))
    assert files == [f"ddpviz-trace-rank{r}.ddpviz" for r in range(WORLD)], tail(run)
    for rank in range(WORLD):
        trace = run.trace(rank)
        assert trace.ranks == [rank]
        expected = run.reports[rank][names]
        built = trace.of_type(ev.ParamsBuilt)
        assert built, f"rank {rank}: no ParamsBuilt event\n{tail(run)}"
        seen = [p.name for p in built[0].params]
        assert seen == expected, f"rank {rank}: trace names {seen} != the job's {expected}"
        # the names DDP sees are the user's model's names under the framework's prefix
        model = run.reports[rank]["model_names"]
        assert len(seen) == len(model)
        assert all(s == m or s.endswith("." + m) for s, m in zip(seen, model, strict=True))
        assigned = trace.of_type(ev.BucketAssigned)
        assert assigned, f"rank {rank}: no BucketAssigned event\n{tail(run)}"
        indices = sorted(i for bucket in assigned[0].buckets for i in bucket)
        assert indices == list(range(len(seen)))
        done = trace.of_type(ev.AllReduceDone)
        assert done, f"rank {rank}: no all-reduce recorded\n{tail(run)}"
        # the framework keeps DDP's gradient-sync contract (probes/sync_contract.py)
        broken = [f for f in run.findings(rank) if f.kind == "unsynced_gradients"]
        assert not broken, f"rank {rank}: {broken}\n{tail(run)}"


def python_executable() -> str:
    return sys.executable
