"""Verdicts on a gradient-accumulation trainer with buffers (train_accum.py) under
`ddpviz record`: the right cause and the right rank for a crash between micro-steps, clipping
on rank 0 only and an evaluation on rank 0 only; each healthy twin reports nothing (#36)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import ddpviz
from ddpviz import events as ev
from tests.dist.harness import free_port
from tests.record.hooked import ROOT, hooked_python, marked_line
from tests.record.test_record import job_env

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "record" / "train_accum.py"
ACCUM = 4  # the script's default micro-steps per optimizer step
EVAL = 10  # the script's default optimizer steps between evaluations


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def line_of(marker: str) -> int:
    return marked_line(SCRIPT, marker)


def record(python: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    args = [python, "-m", "ddpviz", "record", "--out", str(out), "--", python, "-m",
            "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
            str(free_port()), str(SCRIPT)]
    return subprocess.run(args, env=job_env(TRAIN_PG_TIMEOUT="40", **env), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def cli_diagnose(python: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "ddpviz", "diagnose", str(out)], env=job_env(),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_crash_between_micro_steps_is_rank_exited_with_its_exception_first(
        python: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = record(python, out, TRAIN_DEFECT="crash")
    live = done.stdout + done.stderr
    assert done.returncode != 0, live[-3000:]  # the job fails as without ddpviz
    assert "left the training loop" not in live, live[-3000:]  # a crash is no uneven data
    findings = ddpviz.diagnose(out)
    first = findings[0]
    assert first.kind == "rank_exited" and first.severity == "error", findings
    assert first.ranks == (1,) and first.field == "exception" and first.name == "RuntimeError"
    text = str(first)
    assert "RuntimeError: planted: corrupt batch at step 12" in text, text
    assert f"train_accum.py:{line_of('crash')} in next_batch" in text, text
    assert not [f for f in findings if f.kind == "uneven_iterations"], findings
    cli = cli_diagnose(python, out)
    assert cli.returncode != 0, cli.stdout
    assert "rank 1 exited on an uncaught exception" in cli.stdout


@pytest.mark.parametrize("sync", ["toggle", "no_sync"])
def test_clipping_on_rank_0_only_is_not_blamed_on_accumulation(python: str, tmp_path: Path,
                                                               sync: str) -> None:
    out = tmp_path / "out"
    done = record(python, out, TRAIN_DEFECT="clip", TRAIN_SYNC=sync)
    live = done.stdout + done.stderr
    assert done.returncode == 0, live[-3000:]
    assert "replicas diverged" in live, live[-3000:]
    found = [f for f in ddpviz.diagnose(out) if f.kind == "replicas_diverged"]
    assert found, live[-3000:]
    f = found[0]
    text = str(f)
    # 2 ranks: neither is "the odd one" (rank 0 clipped, so naming rank 1 alone was wrong)
    assert f.ranks == (0, 1) and "cannot be told" in text, text
    assert "no_sync() (its gradients" not in text and "ranks 0,1 ran step" not in text, text
    assert "under no_sync()" not in text, text
    if f.step % ACCUM != ACCUM - 1:  # the checked step is a micro-step without sync
        assert "without gradient sync on every rank" in text and "not the cause" in text, text
    assert "clipping" in text and "clipping" in f.fix


def reported_after(out: Path, kind: str) -> list[tuple[int, int]]:
    """(rank, the step of the last forward that rank had started) at each `kind` finding in
    the ranks' traces: when, in the job's own steps, it was said live."""
    said = []
    for trace_file in sorted(out.glob("ddpviz-trace-rank*.ddpviz")):
        last = -1
        for e in ddpviz.Trace.load(trace_file):
            if isinstance(e, ev.ForwardStarted):
                last = e.step
            elif isinstance(e, ev.FindingReported) and e.finding.kind == kind:
                said.append((e.rank, last))
    return said


def test_an_evaluation_on_rank_0_only_names_rank_0(python: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = record(python, out, TRAIN_DEFECT="eval", DDPVIZ_HANG_TIMEOUT="8")
    live = done.stdout + done.stderr
    assert done.returncode != 0, live[-3000:]  # rank 0's last broadcast never pairs
    # live, from the job's collectives: rank 0's evaluation (after optimizer step 9, the last
    # micro-step of which is forward 10 * ACCUM - 1) broadcast its buffers where rank 1 ran its
    # next training forward's (See [Note: an evaluation on some ranks only])
    evaluated = EVAL * ACCUM - 1
    headline = "ddpviz: rank 0 ran a forward through the DDP without gradients (an evaluation)"
    assert headline in live, live[-3000:]
    block = live[live.index(headline):][:1500]
    assert f"at train_accum.py:{line_of('evaluate')} in evaluate at step {evaluated} that " \
           "rank 1 did not" in block, block
    assert f"rank 1 issued DDP's buffer broadcast of the training forward at step " \
           f"{evaluated + 1}" in block, block
    assert re.search(r"^  rank 0: .*broadcast\(float32 x32 .*in evaluate$", block, re.M), block
    assert re.search(r"^  rank 1: DDP's buffer broadcast .*in main$", block, re.M), block
    # said once, by whichever rank compared first: at the next comparison (twice a second),
    # which in this job of ~3 ms steps is its end (a meeting at the position, which named it one
    # forward later, was withdrawn: See [Note: an evaluation on some ranks only])
    [(_, at)] = reported_after(out, "unmatched_collective")
    assert evaluated <= at, at
    live_finding = next(f for f in ddpviz.diagnose(out) if f.kind == "unmatched_collective")
    assert live_finding.ranks == (0,) and live_finding.step == evaluated, live_finding
    # the hang at the end: rank 0 issued what rank 1 did not, not rank 1 behind
    assert "rank 1 did not reach" not in live, live[-3000:]
    hang = next(f for f in ddpviz.diagnose(out) if f.kind == "rank_hang")
    assert hang.ranks == (0,), hang
    # named by rank 0's watchdog ("rank 0 issued collectives that rank 1 did not: rank 0
    # waited ...") or by rank 1's quiet guard, which sees rank 0 still inside the evaluation's
    # forward ("rank 0 did not return from step N's forward after rank 0 issued collectives
    # that rank 1 did not; ..."): either way rank 0 first, with the collectives' verdict
    assert hang.title.startswith("rank 0 ") and \
        "rank 0 issued collectives that rank 1 did not" in hang.title, hang.title
    assert hang.detail[0].startswith("the job's collectives: " + headline.removeprefix(
        "ddpviz: ")), hang.detail
    mismatch = next(f for f in ddpviz.diagnose(out) if f.kind == "collective_mismatch")
    assert mismatch.ranks == (0,), mismatch
    assert mismatch.title.startswith("rank 0 issued collectives at step "), mismatch.title
    assert mismatch.step % ACCUM == ACCUM - 1  # the evaluation follows an optimizer step
    assert re.search(r"rank 0: .*buffer broadcast", str(mismatch)), str(mismatch)
    cli = cli_diagnose(python, out)
    assert f"(step {mismatch.step}, rank 0)" in cli.stdout, cli.stdout


# (clipping on every rank is the plain healthy job plus a clip: no separate plain twin)
# The twins of clip[toggle] (clip_all) and of eval (eval_all, with toggle) are one job: a
# trainer that clips and evaluates on every rank; the twin of clip[no_sync] is its own job.
@pytest.mark.parametrize(("defect", "sync"), [("clip_all,eval_all", "toggle"),
                                              ("clip_all", "no_sync")])
def test_each_healthy_twin_reports_nothing(python: str, tmp_path: Path, defect: str,
                                           sync: str) -> None:
    out = tmp_path / "out"
    done = record(python, out, TRAIN_DEFECT=defect, TRAIN_SYNC=sync)
    live = done.stdout + done.stderr
    assert done.returncode == 0, live[-3000:]
    assert "DiagnosisWarning" not in live and "diverged" not in live, live[-3000:]
    # (a straggler is a timing verdict, spurious under load: #36's straggler item, not these
    # verdicts' concern; asserted nowhere here either way)
    bad = [f for f in ddpviz.diagnose(out)
           if f.severity in ("error", "warning") and f.kind != "straggler"]
    assert not bad, bad
    assert len(re.findall(r"rank \d done bits [0-9a-f]+", done.stdout)) == 2


