"""torchrun attach: a real 2-process torchrun job streams into a listening session; without
DDPVIZ_CONNECT the same job leaves per-rank trace files that load back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.traces.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "notebooks" / "_torchrun_job.py"
STEPS = 4

pytestmark = pytest.mark.dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(JOB)]
    full = {**os.environ, "PYTHONPATH": str(ROOT), "JOB_STEPS": str(STEPS),
            "OMP_NUM_THREADS": "1", **env}
    if "DDPVIZ_CONNECT" not in env:
        full.pop("DDPVIZ_CONNECT", None)
    proc = subprocess.run(cmd, env=full, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _check_rank_stream(trace: Trace, rank: int) -> None:
    events = trace.events(rank)
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(e.rank == rank for e in events)
    kinds = [type(e) for e in events]
    assert kinds.count(ev.BackwardStarted) == kinds.count(ev.BackwardFinished) == STEPS
    launched = kinds.count(ev.AllReduceLaunched)
    assert launched >= STEPS and launched == kinds.count(ev.AllReduceDone)
    spans = [s for s in trace.spans() if s.rank == rank]
    assert sum(1 for s in spans if s.cat == "allreduce" and s.finished) == launched
    assert all(s.finished for s in spans if s.name == "backward")


def test_torchrun_job_streams_into_a_listening_session(tmp_path):
    with ddpviz.listen(show=False) as session:
        proc = _torchrun(session.env, tmp_path)
        assert session.wait(ranks=2, timeout=60)
        stats = session.stats
        trace = session.trace
    assert "rank 0:" in proc.stdout and "rank 1:" in proc.stdout
    assert trace.ranks == [0, 1]
    for rank in (0, 1):
        _check_rank_stream(trace, rank)
        assert stats.closed[rank] == (stats.received[rank], 0)
        assert stats.gaps[rank] == 0 and stats.dropped[rank] == 0
        assert stats.clock[rank] == (0, 0)  # same kernel: one monotonic clock
    assert stats.total_rejected == 0
    assert list(tmp_path.glob("*.ddpviz")) == []  # streamed, not recorded locally
    # the session's trace saves and loads back equal
    assert Trace.load(trace.save(tmp_path / "run.ddpviz")) == trace


def test_without_the_variable_each_rank_records_a_trace_file(tmp_path):
    proc = _torchrun({"DDPVIZ_TRACE_DIR": str(tmp_path / "traces")}, tmp_path)
    files = sorted((tmp_path / "traces").glob("*.ddpviz"))
    assert [f.name for f in files] == ["ddpviz-trace-rank0.ddpviz", "ddpviz-trace-rank1.ddpviz"]
    traces = [Trace.load(f) for f in files]
    for rank, t in enumerate(traces):
        assert t.ranks == [rank] and t.meta["rank"] == rank
        assert f"rank {rank}: {STEPS} steps" in proc.stdout
        _check_rank_stream(t, rank)
    merged = Trace.merge(traces)
    assert merged.ranks == [0, 1] and merged.clock == {0: (0, 0), 1: (0, 0)}
    assert len(merged) == sum(len(t) for t in traces)
