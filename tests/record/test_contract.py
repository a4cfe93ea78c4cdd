"""`ddpviz record` on a real 2-rank torchrun job (tests/record/train_contract.py, no ddpviz
import) that breaks DDP's gradient-sync contract three ways and keeps it three ways: the loss
computed on `ddp.module`, `no_sync()` around the last micro-batch, and a DDP built and never
called (which only the contract attached at construction can see) are each named live on
every rank at the first offending step, with the lines of the DDP's construction, the
backward, the optimizer step and (no_sync) the forward, and kept by `ddpviz diagnose` as one
finding naming both ranks; the healthy phases report nothing; and the job ends with bitwise
the parameters of the same job run without ddpviz."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import ddpviz
from ddpviz import events as ev
from tests.dist.harness import free_port
from tests.record.hooked import ROOT, hooked_python
from tests.record.test_record import job_env

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "record" / "train_contract.py"
CAUSES = {"module": "module_forward", "no_sync_last": "no_sync", "unused": "unused_ddp"}
HEALTHY = ("accumulate", "forced_sync", "teacher")
WHY = {"module_forward": r"loss computed on ddp\.module\?", "no_sync": r"ran under no_sync\(\)",
       "unused_ddp": "its module was trained directly"}


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=job_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def torchrun(python: str) -> list[str]:
    return torchrun_of(python, SCRIPT)


def torchrun_of(python: str, script: Path) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
            str(free_port()), str(script)]


def digests(stdout: str) -> dict[tuple[int, str], str]:
    # Ranks share torchrun's stdout: their lines can interleave mid-line, so match, not split.
    return {(int(r), p): d for r, p, d in
            re.findall(r"rank (\d) phase (\w+) bits ([0-9a-f]{20})", stdout)}


def lines() -> dict[tuple[str, str], int]:
    return {(m[1], m[2]): n for n, text in enumerate(SCRIPT.read_text().splitlines(), start=1)
            if (m := re.search(r"# LINE:(\w+):(\w+)$", text))}


def test_broken_sync_contracts_are_named_live_and_kept_by_diagnose(python: str,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "traces"
    recorded = run([python, "-m", "ddpviz", "record", "--out", str(out), "--",
                    *torchrun(python)])
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    plain = run(torchrun(python))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    phases = set(CAUSES) | set(HEALTHY)
    assert set(digests(plain.stdout)) == {(r, p) for r in (0, 1) for p in phases}
    assert digests(recorded.stdout) == digests(plain.stdout)  # bitwise, every phase

    at = lines()
    script = r"\S*train_contract\.py"
    for rank in (0, 1):
        trace = ddpviz.Trace.load(out / f"ddpviz-trace-rank{rank}.ddpviz")
        found = [e.finding for e in trace if isinstance(e, ev.FindingReported)]
        # the contract first, at step 0; then, possibly, what it caused: the replicas that
        # trained apart, named by the replica check's final comparison at the job's end
        kinds = [f.kind for f in found]
        assert kinds[:3] == ["unsynced_gradients"] * 3, found
        assert set(kinds[3:]) <= {"replicas_diverged"}, found
        by_cause = {f.field: f for f in found if f.kind == "unsynced_gradients"}
        for phase, cause in CAUSES.items():
            f = by_cause[cause]
            assert (f.step, f.ranks, f.severity, f.world_size) == (0, (rank,), "error", 2)
            assert re.search(rf"built at {script}:{at[(phase, 'built')]} in {phase}\b",
                             f.title), f.title
            sites = f.values[0][0]
            assert re.search(rf"^backward at {script}:{at[(phase, 'backward')]} in {phase} ",
                             sites), sites
            assert re.search(rf"SGD\.step\(\) at {script}:{at[(phase, 'step')]} in {phase} ",
                             sites), sites
            if cause == "no_sync":
                assert re.search(rf"under no_sync\(\) at {script}:{at[(phase, 'forward')]} ",
                                 sites), sites

    # said live once for the job per broken contract: one line naming both ranks (each rank
    # found it on its own side; the first to claim it waits for the other's part)
    said = recorded.stderr
    assert said.count("optimizer step 0 used gradients") == 3, said
    assert said.count("ranks 0,1: optimizer step 0 used gradients") == 3, said
    for why in WHY.values():
        assert len(re.findall(rf"ranks 0,1: optimizer step 0 used gradients .*{why}",
                              said)) == 1, said
    assert "DiagnosisWarning" not in said and "warnings.warn" not in said, said

    findings = ddpviz.diagnose(out)
    contract = [f for f in findings if f.kind == "unsynced_gradients"]
    assert sorted(f.field for f in contract) == sorted(CAUSES.values()), findings
    assert all(f.ranks == (0, 1) and f.title.startswith("ranks 0,1: ") for f in contract)
    verdict = run([python, "-m", "ddpviz", "diagnose", str(out)])
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr  # errors found
    assert verdict.stdout.count("ranks 0,1: optimizer step 0 used gradients") == 3
