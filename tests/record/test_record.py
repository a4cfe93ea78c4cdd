"""`ddpviz record -- COMMAND`: an unmodified torch DDP script (train_plain.py, no ddpviz
import) run under torchrun (python -m torch.distributed.run, gloo), `python -m` and plain
`python`, watched through the startup hook ddpviz_autowatch.pth."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz import markup
from tests.dist.harness import free_port
from tests.dist.torch_release import missing
from tests.record.hooked import ROOT, hooked_python

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "record" / "train_plain.py"


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDPVIZ_", "TRAIN_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def run(args: list[str], env: dict[str, str],
        timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def torchrun(python: str, nprocs: int = 2) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nprocs),
            "--master-port", str(free_port()), str(SCRIPT)]


def kinds(trace: ddpviz.Trace) -> Counter[str]:
    return Counter(type(e).__name__ for e in trace)


def digests(stdout: str) -> dict[int, str]:
    # Ranks share torchrun's stdout: their lines can interleave mid-line, so match, not split.
    return {int(r): d for r, d in re.findall(r"rank (\d+) done (-?\d+\.\d{6})", stdout)}


def test_without_the_variable_no_ddpviz_module_is_imported(python: str) -> None:
    probe = ("import sys, torch, torch.nn.parallel as p; "
             "print(sorted(m for m in sys.modules if m.startswith('ddpviz')), "
             "hasattr(p.DistributedDataParallel.__init__, '__ddpviz_autowatch__'))")
    plain = run([python, "-c", probe], job_env())
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["[]", "False"]
    armed = run([python, "-c", probe], job_env(DDPVIZ_RECORD="1"))
    assert armed.returncode == 0, armed.stderr
    # Armed: only the stdlib-only boot module, until the first DDP is constructed.
    assert armed.stdout.split() == ["['ddpviz_autowatch']", "True"]


# The healthy job of DEFAULT_REPLICAS (below): 40 steps, the default recording, the job ends
# with dist.destroy_process_group(). Run once under `ddpviz record --out` and once unwatched,
# for the two tests that read it (the per-rank traces; the default's silence on it).
HEALTHY_KNOBS = {"TRAIN_STEPS": "40", "TRAIN_DESTROY": "1"}


class RecordedAndPlain:
    def __init__(self, done: subprocess.CompletedProcess[str], out: Path,
                 plain: subprocess.CompletedProcess[str]) -> None:
        self.done, self.out, self.plain = done, out, plain


@pytest.fixture(scope="module")
def healthy_job(python: str, tmp_path_factory: pytest.TempPathFactory) -> RecordedAndPlain:
    out = tmp_path_factory.mktemp("healthy") / "traces"
    env = job_env(**HEALTHY_KNOBS)
    done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--", *torchrun(python)],
               env)
    plain = run(torchrun(python), env)
    return RecordedAndPlain(done, out, plain)


def test_torchrun_job_writes_per_rank_traces_with_torch_ddp_events(
        healthy_job: RecordedAndPlain) -> None:
    done, out = healthy_job.done, healthy_job.out
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(out.glob("ddpviz-trace-rank*.ddpviz"))
    assert [f.name for f in files] == ["ddpviz-trace-rank0.ddpviz", "ddpviz-trace-rank1.ddpviz"]
    steps = int(HEALTHY_KNOBS["TRAIN_STEPS"])
    for rank, path in enumerate(files):
        trace = ddpviz.Trace.load(path)
        assert trace.ranks == [rank]
        counts = kinds(trace)
        assert counts["ParamsBuilt"] == 1
        assert counts["ForwardStarted"] == steps
        assert counts["AllReduceDone"] == counts["AllReduceLaunched"] >= 3
        # 4 parameters in each step the default samples per parameter (steps 0-2)
        assert counts["GradReady"] == 3 * 4
        assert {e.step for e in trace if isinstance(e, ev.GradReady)} == {0, 1, 2}
    # Unwatched, the same job ends with the same parameters.
    plain = healthy_job.plain
    assert plain.returncode == 0, plain.stderr
    assert digests(done.stdout) == digests(plain.stdout) and len(digests(plain.stdout)) == 2


def test_torchrun_job_streams_into_a_listening_session_and_wraps_the_scripts_comm_hook(
        python: str, tmp_path: Path) -> None:
    # one job for both claims: streamed (--connect, no trace folder), the script's own comm
    # hook (registered after construction) runs under watch's wrapper on every rank
    log = tmp_path / "hook"
    with ddpviz.listen(show=False) as session:
        done = run([python, "-m", "ddpviz", "record", "--connect", session.connect_string, "--",
                    *torchrun(python)], job_env(TRAIN_HOOK="1", TRAIN_HOOK_LOG=str(log)))
        assert done.returncode == 0, done.stdout + done.stderr
        # ranks=2: both senders closed and everything they sent is in
        assert session.wait(ranks=2, events=2 * 30, timeout=30)
        trace = session.trace
    assert sorted(trace.ranks) == [0, 1]
    for rank in (0, 1):
        counts = Counter(type(e).__name__ for e in trace if e.rank == rank)
        assert counts["ParamsBuilt"] == 1 and counts["AllReduceDone"] >= 3
        calls = Path(f"{log}.{rank}").read_text().split()
        # the script's hook ran under watch's wrapper: once per all-reduce launched
        assert len(calls) == counts["AllReduceLaunched"] >= 3


@pytest.mark.parametrize("how", ["python", "python -m"])
def test_a_single_process_job_is_recorded(python: str, tmp_path: Path, how: str) -> None:
    command = ([python, str(SCRIPT)] if how == "python"
               else [python, "-m", "tests.record.train_plain"])
    out = tmp_path / "traces"
    done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--", *command],
               job_env(TRAIN_PORT=str(free_port())))
    assert done.returncode == 0, done.stdout + done.stderr
    trace = ddpviz.Trace.load(out / "ddpviz-trace-rank0.ddpviz")
    counts = kinds(trace)
    assert counts["ParamsBuilt"] == 1 and counts["ForwardStarted"] == 3
    assert counts["AllReduceDone"] >= 3


def test_a_rank_that_never_constructs_ddp_is_named_before_the_group_timeout(
        python: str, tmp_path: Path) -> None:
    out = tmp_path / "traces"
    done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--", *torchrun(python)],
               job_env(TRAIN_ABSENT="1", TRAIN_PG_TIMEOUT="8", TRAIN_ABSENT_S="40"))
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert ("rank 1 never reached torch's DistributedDataParallel constructor within 4.8s"
            in text), text[-3000:]
    assert "Timed out" not in text  # gloo's own timeout never fired
    trace = ddpviz.Trace.load(out / "ddpviz-trace-rank0.ddpviz")
    found: list[Any] = [e.finding for e in trace if isinstance(e, ev.FindingReported)]
    assert [f.kind for f in found] == ["rank_waiting", "missing_rank"]
    assert found[0].ranks == (1,) and found[1].ranks == (1,)


def test_recording_sets_the_policy_for_every_rank(python: str, tmp_path: Path) -> None:
    out = tmp_path / "traces"
    done = run([python, "-m", "ddpviz", "record", "--recording", "every=never", "--out",
                str(out), "--", python, str(SCRIPT)], job_env(TRAIN_PORT=str(free_port())))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Deprecat" not in done.stderr
    counts = kinds(ddpviz.Trace.load(out / "ddpviz-trace-rank0.ddpviz"))
    assert counts["ForwardStarted"] == 3  # forwards only: no per-parameter hook, no comm hook
    assert counts["GradReady"] == counts["AllReduceDone"] == counts["GradsSummarized"] == 0


@pytest.mark.skipif(
    missing([("lazy_bucket_allocation", True)]) is not None,
    reason="the installed torch has no lazy_bucket_allocation (torch 2.15 added it)")
# three 2-rank torchrun jobs of a torch with CUDA wheels (seconds of imports per process):
# 224 s in stop 56's CI, over the default 300 s when CI shared the machine with other tests
@pytest.mark.timeout(900)
def test_the_guard_steps_aside_for_lazy_buckets_as_views_and_the_job_ends_as_unwatched(
        python: str, tmp_path: Path) -> None:
    """torch 2.15's lazy_bucket_allocation with gradient_as_bucket_view: the guard's comm hook
    cannot watch it without changing the result (guarded.py), so `ddpviz record` with the guard
    says so once, on rank 0 (every rank built it alike), and the job ends bitwise as unwatched;
    the default (hook-less) recording watches it, bitwise too."""
    env = job_env(TRAIN_LAZY="1", TRAIN_STEPS="4", TRAIN_PORT=str(free_port()))
    plain = run(torchrun(python), env)
    assert plain.returncode == 0, plain.stderr
    assert len(bits(plain.stdout)) == 2
    for recording in ("guard", None):
        out = tmp_path / f"traces-{recording}"
        policy = ["--recording", recording] if recording else []
        done = run([python, "-m", "ddpviz", "record", *policy, "--out", str(out), "--",
                    *torchrun(python)], env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert bits(done.stdout) == bits(plain.stdout), done.stderr
        said = [line for line in done.stderr.splitlines() if "is not watched" in line]
        if recording == "guard":
            assert len(said) == 1 and said[0].startswith("ddpviz record: rank 0: "), said
            assert "lazy_bucket_allocation" in said[0], said
        else:
            assert said == [], said
            assert kinds(ddpviz.Trace.load(out / "ddpviz-trace-rank0.ddpviz"))["ForwardStarted"]


def test_record_without_a_command_or_with_both_targets_says_how(
        capsys: pytest.CaptureFixture[str]) -> None:
    from ddpviz.cli import main

    assert main(["record", "--recording", "sampled", "--", sys.executable, "-c", "0"]) == 2
    err = capsys.readouterr().err
    assert "--recording 'sampled' is not a recording policy" in err
    assert "old level name: write guard,every=100" in err
    assert main(["record", "--"]) == 2
    with pytest.raises(SystemExit):
        main(["record", "--connect", "x", "--out", "y", "--", sys.executable, "-c", "0"])


def bits(stdout: str) -> dict[int, str]:
    """Per rank, a hash of the raw bytes of the final parameters."""
    return {int(r): b for r, b in re.findall(r"rank (\d+) done \S+ bits ([0-9a-f]{20})", stdout)}


def test_a_shape_that_differs_on_one_rank_is_named_on_every_rank_before_torch(
        python: str, tmp_path: Path) -> None:
    done = run([python, "-m", "ddpviz", "record", "--out", str(tmp_path), "--",
                *torchrun(python)], job_env(TRAIN_MISMATCH="shape", TRAIN_PG_TIMEOUT="60"))
    assert done.returncode != 0
    for rank in range(2):  # torch fails on rank 1 only while rank 0 waits in its broadcast
        assert re.search(rf"\[rank{rank}\]: ddpviz.errors.RankMismatchError: ddpviz: the model "
                         r"differs across ranks in 3 places", done.stderr), done.stderr[-3000:]
        assert f"[rank{rank}]:   rank 1: shape=(17, 8) dtype=float32" in done.stderr
    assert "appears not to match" not in done.stderr  # torch's own check never ran
    trace = ddpviz.Trace.load(tmp_path / "ddpviz-trace-rank0.ddpviz")
    found = [f for f in ddpviz.diagnose(trace) if f.kind == "param_mismatch"]
    assert {f.title for f in found} >= {
        "parameter 0 '0.weight' has a different shape across ranks"}


def test_names_that_differ_with_the_same_layout_are_reported_and_the_job_runs(
        python: str, tmp_path: Path) -> None:
    env = job_env(TRAIN_MISMATCH="name")
    plain = run(torchrun(python), env)
    done = run([python, "-m", "ddpviz", "record", "--out", str(tmp_path), "--",
                *torchrun(python)], env)
    assert plain.returncode == 0 and done.returncode == 0, done.stderr[-3000:]
    assert bits(done.stdout) == bits(plain.stdout) and len(bits(done.stdout)) == 2
    assert "parameter 0 is named differently across ranks" in done.stderr
    assert "torch's DistributedDataParallel accepts this difference" in done.stderr


def test_a_job_without_torch_ddp_says_that_ddpviz_observes_torch_ddp_only(
        python: str, tmp_path: Path) -> None:
    done = run([python, "-m", "ddpviz", "record", "--out", str(tmp_path), "--", python, "-c",
                "import torch; print('trained', torch.nn.Linear(2, 2)(torch.ones(2)).shape)"],
               job_env())
    assert done.returncode == 0 and "trained torch.Size([2])" in done.stdout
    assert "no torch DistributedDataParallel was constructed in this job" in done.stderr
    assert "ddpviz observes torch's DDP only" in done.stderr
    assert not list(tmp_path.iterdir())  # no empty trace left behind


def test_the_launcher_imports_neither_torch_nor_numpy_nor_zmq(python: str,
                                                             tmp_path: Path) -> None:
    # The ranks import torch; `ddpviz record` itself only sets variables and waits, so its
    # start-up stays a fraction of a second (torch alone takes seconds to import).
    probe = ("import sys; from ddpviz.cli import main; "
             f"code = main(['record', '--out', {str(tmp_path)!r}, '--', 'true']); "
             "print(code, [m for m in ('torch', 'numpy', 'zmq') if m in sys.modules])")
    done = run([python, "-c", probe], job_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "[]"]
    assert "no torch DistributedDataParallel was constructed" in done.stderr


def test_a_parameter_unused_on_every_rank_is_said_once_for_the_job(python: str,
                                                                   tmp_path: Path) -> None:
    # each rank finds that its own backward left 'unused.*' out (a rank-local finding): the
    # job says one line naming both ranks, before torch's error at the next forward
    done = run([python, "-m", "ddpviz", "record", "--out", str(tmp_path / "t"), "--",
                *torchrun(python)], job_env(TRAIN_UNUSED="1"))
    assert done.returncode != 0, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("ddpviz: ")
            and "got no gradient" in line]
    assert len(said) == 1, done.stderr
    assert said[0].startswith("ddpviz: 2 of 6 parameters got no gradient on ranks 0,1 at step 0")
    assert "'unused.weight', 'unused.bias'" in said[0]


def test_replicas_that_drift_apart_are_named_in_the_trace_diagnose_and_report(
        python: str, tmp_path: Path) -> None:
    # rank 1 edits '2.bias' after step 2: the check (every step here) names it, on stderr once
    # and as a finding in rank 0's trace, which `ddpviz diagnose` and the report print
    out = tmp_path / "traces"
    done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--", *torchrun(python)],
               job_env(TRAIN_STEPS="6", TRAIN_DIVERGE="2", DDPVIZ_RECORDING="replicas=1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("replicas diverged") == 1, done.stderr
    diagnosed = run([sys.executable, "-m", "ddpviz", "diagnose", str(out)], job_env())
    assert diagnosed.returncode == 1, diagnosed.stdout + diagnosed.stderr
    text = diagnosed.stdout
    assert "replicas diverged: 1 of 4 parameters differ across ranks first differing after " \
           "step 2: '2.bias'" in text, text
    html = tmp_path / "report.html"
    reported = run([sys.executable, "-m", "ddpviz", "report", str(out), "-o", str(html)],
                   job_env())
    assert reported.returncode == 0, reported.stderr
    assert "replicas diverged: 1 of 4 parameters" in html.read_text()


# The default recording (replicas every 25th step, a final comparison at the job's end) on
# unmodified 2-rank jobs: (knobs, step, words in the finding; None: a healthy twin, nothing)
DEFAULT_REPLICAS = {
    "edit_40_steps": ({"TRAIN_STEPS": "40", "TRAIN_DIVERGE": "6"}, 25,
                      "1 of 4 parameters differ across ranks after step 25 (last agreed after "
                      "step 0; the first differing step is between 1 and 25): '2.bias'"),
    "edit_20_steps_destroy": ({"TRAIN_STEPS": "20", "TRAIN_DIVERGE": "6", "TRAIN_DESTROY": "1"},
                              19, "the first differing step is between 1 and 19): '2.bias'"),
    "edit_20_steps_exit": ({"TRAIN_STEPS": "20", "TRAIN_DIVERGE": "6"}, 19,
                           "the first differing step is between 1 and 19): '2.bias'"),
    "lr_2x": ({"TRAIN_STEPS": "40", "TRAIN_LR2": "1"}, 0,
              "4 of 4 parameters differ across ranks first differing after step 0: '0.weight'"),
    "healthy": (HEALTHY_KNOBS, None, ""),  # (the job of the fixture healthy_job)
}


@pytest.mark.parametrize("case", list(DEFAULT_REPLICAS))
def test_the_default_names_replicas_that_drift_apart_within_25_steps_or_at_the_end(
        python: str, tmp_path: Path, case: str, request: pytest.FixtureRequest) -> None:
    knobs, step, words = DEFAULT_REPLICAS[case]
    if step is None:  # the healthy job: run once for this test and the per-rank traces' test
        job: RecordedAndPlain = request.getfixturevalue("healthy_job")
        done, out = job.done, job.out
    else:
        out = tmp_path
        done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--",
                    *torchrun(python)], job_env(**knobs))
    assert done.returncode == 0, done.stdout + done.stderr
    trace = ddpviz.Trace.load(out / "ddpviz-trace-rank0.ddpviz")
    found = [e.finding for e in trace if isinstance(e, ev.FindingReported)
             and e.finding.kind == "replicas_diverged"]
    if step is None:
        assert found == [] and "replicas diverged" not in done.stderr, done.stderr
        plain = job.plain  # bitwise the unwatched job
        assert plain.returncode == 0 and bits(done.stdout) == bits(plain.stdout), plain.stderr
        assert len(bits(plain.stdout)) == 2
        return
    (f,) = found
    # 2 ranks: which one moved differently cannot be told from the bytes (both are named)
    assert f.step == step and f.ranks == (0, 1) and f.severity == "error", f.text()
    assert words in f.title, f.title
    assert ("found by the final comparison" in f.text()) == (step == 19)
    assert done.stderr.count("replicas diverged") == 1, done.stderr


def test_the_report_of_a_job_dir_says_which_ranks_ended_as_diagnose_does(
        python: str, tmp_path: Path) -> None:
    # rank 1 dies of an uncaught ValueError after its last step, rank 0 ends normally: both
    # files end with their end record, which `ddpviz report DIR` reads as `diagnose DIR` does
    out = tmp_path / "traces"
    done = run([python, "-m", "ddpviz", "record", "--out", str(out), "--", *torchrun(python)],
               job_env(TRAIN_STEPS="4", TRAIN_RAISE="1"))
    assert done.returncode != 0 and "planted" in done.stderr, done.stdout + done.stderr
    said = "rank 0 ended cleanly; rank 1 exited on an uncaught ValueError."
    diagnosed = run([sys.executable, "-m", "ddpviz", "diagnose", str(out)], job_env())
    assert f"ddpviz: {said}" in diagnosed.stdout.splitlines(), diagnosed.stdout
    html = tmp_path / "report.html"
    reported = run([sys.executable, "-m", "ddpviz", "report", str(out), "-o", str(html)],
                   job_env())
    assert reported.returncode == 0, reported.stderr
    page = html.read_text()
    assert f"<p id='ended' class='bad'>{said}</p>" in page
    # the same findings as diagnose's, from the same records
    from ddpviz.report.html import render
    from ddpviz.traces.source import open_run

    recorded = open_run(str(out))  # the door the CLI reads TRACE arguments through
    trace, ended = recorded.as_trace(), dict(recorded.ended or {})
    findings = ddpviz.diagnose(trace, ended=ended)
    assert all(markup.escape(f.title) in page for f in findings)
    assert render(trace, title="t", ended=ended).count("class='finding ") == len(findings)
