"""The job's own collectives under `ddpviz record`: an unmodified torchrun job
(train_collectives.py) with one planted defect each is named live, with the right ranks, op,
call site (function and line, read from the script) and position, functional collectives and a
call site that ran before included; a healthy job with many collectives of its own (functional
ones with sizes that change every step among them) reports nothing and trains bitwise as
without ddpviz."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ddpviz
from ddpviz.units import ordinal
from tests.dist.harness import free_port
from tests.record.hooked import ROOT, hooked_python, marked_line
from tests.record.test_record import job_env

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "record" / "train_collectives.py"
PG_TIMEOUT = 40.0  # the job's process group timeout: every finding must come well before it
LAUNCH_S = 150.0  # torchrun's start, until the ranks joined the group (slow under load)
JOINED = "train_collectives: every rank joined"  # printed by rank 0 after its first collective


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def line_of(marker: str) -> int:
    return marked_line(SCRIPT, marker)


def command(python: str, out: Path, nprocs: int = 2) -> list[str]:
    return [python, "-m", "ddpviz", "record", "--out", str(out), "--", python, "-m",
            "torch.distributed.run", "--nproc-per-node", str(nprocs), "--master-port",
            str(free_port()), str(SCRIPT)]


def run_until(args: list[str], env: dict[str, str], pattern: str,
              deadline: float) -> tuple[str, float | None]:
    """Run the job until `pattern` shows in its output (then, a second later, stop it), or it
    ends, or `deadline` seconds pass after its ranks joined the process group (the group's
    timeout counts from its collectives: starting torchrun and importing torch, slow on a
    loaded machine, is not part of it); the output and when the pattern showed, in seconds
    after the ranks joined."""
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    start = time.monotonic()
    seen: float | None = None
    data = b""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    end = start + LAUNCH_S
    joined: float | None = None
    try:
        while time.monotonic() < end:
            if not sel.select(timeout=0.2):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
            text = data.decode(errors="replace")
            if joined is None and JOINED in text:
                joined = time.monotonic()
                end = joined + deadline
            if seen is None and re.search(pattern, text):
                seen = time.monotonic() - (joined if joined is not None else start)
                end = min(end, time.monotonic() + 1.0)  # the rest of the finding's lines
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    return data.decode(errors="replace"), seen


def finding_block(output: str, headline: str) -> str:
    start = output.index(headline)
    return output[start:start + 1500]


CASES = {
    # defect: (kind, pattern of the headline, ranks, call sites per rank (marker), op)
    # gather: at step 0 gloo aborts rank 0 and torchrun SIGTERMs rank 1 at once (named before
    # the collective runs: See [Note: claiming a position])
    "gather": ("collective_mismatch", r"ddpviz: ranks issued different collectives",
               (0, 1), "log_metrics", "all_gather"),
    "src": ("collective_mismatch", r"ddpviz: ranks issued different collectives",
            (0, 1), "share_seed", "broadcast"),
    "barrier": ("unmatched_collective", r"ddpviz: rank 0 issued barrier", (0,),
                "save_checkpoint", "barrier"),
    "extra": ("unmatched_collective", r"ddpviz: rank 1 issued all_reduce", (1,),
              "debug_print", "all_reduce"),
    "groups": ("collective_mismatch", r"ddpviz: ranks are blocked in different collectives",
               (0, 1), "sync_group", "all_reduce"),
    # a functional collective (torch.distributed._functional_collectives) with other sizes
    "funcol_size": ("collective_mismatch", r"ddpviz: ranks issued different collectives",
                    (0, 1), "funcol_stats", "all_reduce(float32 x"),
}


def assert_named_live(output: str, defect: str) -> None:
    """The job's output names CASES[defect] with its ranks, op, call site and position."""
    kind, pattern, ranks, marker, op = CASES[defect]
    assert re.search(pattern, output), output[-4000:]
    block = finding_block(output, re.search(pattern, output).group(0))  # type: ignore[union-attr]
    site = f"train_collectives.py:{line_of(marker)} in {marker}"
    assert site in block, block
    assert op in block, block
    position = re.search(r"the (\d+)(st|nd|rd|th) collective on", block)
    assert position is not None, block
    for r in ranks:  # each rank's own call is named on its line
        assert re.search(rf"^  rank[s]? [0-9,]*\b{r}\b.*: ", block, re.M), block
    if kind == "unmatched_collective":  # the other rank: DDP's collective at that position
        assert re.search(r"DDP's", block), block


# "gather" ends the job at step 0 whatever the timeouts: its live finding is checked on the
# run of test_a_mismatch_reaches_the_trace_and_diagnose[gather], not on a second job
@pytest.mark.parametrize("defect", sorted(set(CASES) - {"gather"}))
def test_a_planted_collective_defect_is_named_live_with_ranks_op_and_call_site(
        python: str, tmp_path: Path, defect: str) -> None:
    kind, pattern = CASES[defect][:2]
    # the barrier hangs: its hang finding (at the 8 s deadline) must carry the same verdict
    hang = r"the job's collectives: rank 0 issued barrier" if defect == "barrier" else None
    env = job_env(TRAIN_DEFECT=defect, TRAIN_PG_TIMEOUT=str(PG_TIMEOUT),
                  DDPVIZ_HANG_TIMEOUT="8" if hang else "30")
    output, seen = run_until(command(python, tmp_path / "out"), env, hang or pattern,
                             deadline=PG_TIMEOUT - 5)
    assert seen is not None, f"no {kind} finding before the group's timeout:\n{output[-4000:]}"
    assert_named_live(output, defect)


@pytest.mark.parametrize(("defect", "marker"), [("reduce_size", "reduce_stats"),
                                                ("gather", "log_metrics")])
def test_a_mismatch_reaches_the_trace_and_diagnose(python: str, tmp_path: Path, defect: str,
                                                   marker: str) -> None:
    """A defect that ends the job (mismatched all_reduce sizes at step 5, all_gather sizes at
    step 0: gloo aborts a process or waits until the group's timeout): named live, and the
    finding is in the trace that `ddpviz diagnose` reads."""
    out = tmp_path / "out"
    env = job_env(TRAIN_DEFECT=defect, TRAIN_PG_TIMEOUT="8", DDPVIZ_HANG_TIMEOUT="4")
    done = subprocess.run(command(python, out), env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode != 0  # the job fails as it does without ddpviz
    live = done.stdout + done.stderr
    assert "ddpviz: ranks issued different collectives" in live, live[-3000:]
    assert RING_SAID not in live, live[-3000:]  # named live: the rings add nothing
    if defect == "gather":  # named live with its ranks, op, call site and position
        assert_named_live(live, defect)
    every = ddpviz.diagnose(out)
    findings = [f for f in every if f.kind == "collective_mismatch"]
    assert findings, done.stdout[-3000:] + done.stderr[-3000:]
    # the steps parted because the collectives did: no uneven-data cause beside it
    assert "uneven_iterations" not in {f.kind for f in every}, [str(f) for f in every]
    text = str(findings[0])
    assert f"train_collectives.py:{line_of(marker)} in {marker}" in text
    assert "float32 x3" in text and "float32 x4" in text


def plain_and_recorded(python: str, tmp_path: Path, nprocs: int, **extra: str
                       ) -> tuple[Path, Path, Path, subprocess.CompletedProcess[str]]:
    """The healthy job (TRAIN_DEFECT and the rest from `extra`) run unwatched, then under
    `ddpviz record --out`: (its unwatched done folder, its recorded one, the trace folder, the
    recorded run). Each rank writes its "done" line to a file of its own (torchrun's shared
    stdout lost one rank's line in about 1 of 10 plain runs here, without ddpviz)."""
    done_plain, done_recorded = tmp_path / "done-plain", tmp_path / "done-recorded"
    done_plain.mkdir()
    done_recorded.mkdir()
    env = job_env(TRAIN_DONE_DIR=str(done_plain), **extra)
    plain = subprocess.run([python, "-m", "torch.distributed.run", "--nproc-per-node",
                            str(nprocs), "--master-port", str(free_port()), str(SCRIPT)],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0, plain.stderr[-3000:]
    out = tmp_path / "out"
    recorded = subprocess.run(command(python, out, nprocs=nprocs),
                              env={**env, "TRAIN_DONE_DIR": str(done_recorded)}, cwd=ROOT,
                              capture_output=True, text=True, timeout=180)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    return done_plain, done_recorded, out, recorded


def test_a_healthy_job_of_many_collectives_says_nothing_live_or_from_rings_and_trains_as_without(
        python: str, tmp_path: Path) -> None:
    """The healthy job, every collective pairing on every rank: log_metrics' all_gather (the
    call site of the late mismatch below) at the same size every step, and many collectives
    beside it. It reports nothing live or from diagnose, writes each rank's ring and says
    nothing of them, and ends bitwise as the unwatched job. (This job is also the healthy twin
    of the late mismatch: the same all_gather every step, none at another size.)"""
    # 3 ranks: the point-to-point calls between ranks 0 and 1 shift only their positions
    done_plain, done_recorded, out, recorded = plain_and_recorded(
        python, tmp_path, 3, TRAIN_DEFECT="none", TRAIN_STEPS="13")

    def done(folder: Path) -> list[tuple[str, ...]]:
        text = "".join(p.read_text() for p in sorted(folder.iterdir()))
        return sorted(re.findall(r"rank (\d) done (-?\d+\.\d+) (\S+)$", text, re.M))

    def done_files(folder: Path) -> list[str]:
        return sorted(p.read_text() for p in folder.iterdir())

    # the parameters' checksum and the sum of what the functional collectives returned,
    # printed exactly (repr), and the parameters' sha256: bitwise as without ddpviz
    sums = done(done_plain)
    assert sums == done(done_recorded)
    assert len(sums) == 3 and all(float(extra) != 0.0 for _, _, extra in sums), sums
    assert done_files(done_plain) == done_files(done_recorded)
    assert len(done_files(done_plain)) == 3
    both = recorded.stdout + recorded.stderr
    assert not re.search(r"ddpviz: (ranks? [0-9,]+ issued|ranks issued|ranks are blocked)",
                         both), both[-3000:]
    # the rings: written by each rank, nothing said of them after the job nor found in them
    assert sorted(p.name for p in out.glob("*.ring")) == [
        "ddpviz-ledger-rank0.ring", "ddpviz-ledger-rank1.ring", "ddpviz-ledger-rank2.ring"]
    assert RING_SAID not in both, both[-3000:]
    from ddpviz.probes.ledger_ring import folder_findings

    assert folder_findings(out) == []
    kinds = {f.kind for f in ddpviz.diagnose(out)}
    assert not kinds & {"collective_mismatch", "unmatched_collective"}, kinds


RING_SAID = "found after the job ended, from each rank's last collectives"


def test_a_late_mismatch_that_ends_the_job_is_named_from_the_ranks_rings(
        python: str, tmp_path: Path) -> None:
    """log_metrics' all_gather, a call site every rank used at steps 0-2, gets 4 elements on
    rank 1 at step 3: gloo aborts a rank (SIGABRT) and torchrun SIGTERMs the other before the
    comparison twice a second sees it (See [Note: the ring], ledger_ring.py). `ddpviz record`
    says it once, from the rings, and `ddpviz diagnose DIR` names it: both ranks' sizes, the
    op, the call site and the position torch's own sequence number gives."""
    out = tmp_path / "out"
    env = job_env(TRAIN_DEFECT="gather_late", TRAIN_AT="3", TRAIN_PG_TIMEOUT="8",
                  DDPVIZ_HANG_TIMEOUT="4")
    done = subprocess.run(command(python, out), env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode != 0  # the job fails as it does without ddpviz
    seqs = {int(r): int(s) for r, s in re.findall(
        r"train_collectives: rank (\d) seq (\d+) before log_metrics at step 3", done.stdout)}
    assert seqs and len(set(seqs.values())) == 1, done.stdout[-3000:]
    position = f"the {ordinal(next(iter(seqs.values())) + 1)} collective on the default group"
    site = f"train_collectives.py:{line_of('log_metrics')} in log_metrics"
    assert done.stderr.count(RING_SAID) == 1, done.stderr[-4000:]
    block = finding_block(done.stderr, "ddpviz: ranks issued different collectives")
    assert RING_SAID in block, block
    for rank, n in ((0, 3), (1, 4)):
        assert f"rank {rank}: all_gather(float32 x{n} into 2) at {site}" in block, block
    assert position in block and "at step 3" in block, block
    cli = subprocess.run([python, "-m", "ddpviz", "diagnose", "--json", str(out)], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert '"collective_mismatch"' in cli.stdout, cli.stdout[-3000:] + cli.stderr[-2000:]
    findings = [f for f in ddpviz.diagnose(out) if f.kind == "collective_mismatch"]
    assert len(findings) == 1, [str(f) for f in ddpviz.diagnose(out)]
    text = str(findings[0])
    assert position in text and site in text and RING_SAID in text, text
    assert "float32 x3" in text and "float32 x4" in text and findings[0].step == 3, text


def test_a_late_mismatch_is_named_from_the_rings_without_a_trace_folder(
        python: str, tmp_path: Path) -> None:
    """The same late mismatch under `ddpviz record --connect` (events go to a notebook's
    session, no trace folder): the rings go to a private folder of the record command, which
    says the first difference once after the failed job and removes the folder."""
    from ddpviz.private_dir import PREFIX

    # the job's own $TMPDIR: other jobs on the machine (pytest's other worker among them) make
    # and remove private folders of their own in the shared one meanwhile
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()

    def ring_folders() -> set[Path]:
        return {p.parent for p in tmpdir.glob(f"{PREFIX}*/*.ring")}

    before = ring_folders()
    env = job_env(TRAIN_DEFECT="gather_late", TRAIN_AT="3", TRAIN_PG_TIMEOUT="8",
                  DDPVIZ_HANG_TIMEOUT="4", TMPDIR=str(tmpdir))
    with ddpviz.listen() as session:
        args = command(python, tmp_path / "unused")
        args[args.index("--out"):args.index("--out") + 2] = ["--connect",
                                                             session.connect_string]
        done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=180)
    assert done.returncode != 0
    assert not (tmp_path / "unused").exists()
    site = f"train_collectives.py:{line_of('log_metrics')} in log_metrics"
    assert done.stderr.count(RING_SAID) == 1, done.stderr[-4000:]
    block = finding_block(done.stderr, "ddpviz: ranks issued different collectives")
    for rank, n in ((0, 3), (1, 4)):
        assert f"rank {rank}: all_gather(float32 x{n} into 2) at {site}" in block, block
    assert "at step 3" in block, block
    assert ring_folders() <= before  # the private folder is gone
