"""`ddpviz.listen(follow=DIR)` on a real 2-rank gloo job run by `ddpviz record --out DIR`
(torchrun): attached mid-run it shows the history and then the new steps; detached, the job
goes on and ends with the numbers of an unattached run; attached again, it has every event of
the files, none lost or doubled. The job is held at steps by gate files the test creates
(tests/record/train_gated.py), never by a timing window."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.session import follow
from ddpviz.session.live import Session
from ddpviz.traces.fileformat import End
from tests.dist.harness import free_port
from tests.polling import eventually
from tests.record.hooked import ROOT, hooked_python
from tests.record.test_record import job_env

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "record" / "train_gated.py"
STEPS = 12
LIMIT = 240.0  # bounds a broken run only


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("hooked"))


def start(python: str, out: Path, gates: str) -> subprocess.Popen[str]:
    command = [python, "-m", "ddpviz", "record", "--out", str(out), "--", python, "-m",
               "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), str(SCRIPT)]
    return subprocess.Popen(command, env=job_env(TRAIN_STEPS=str(STEPS), TRAIN_GATES=gates),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # one killpg ends the ranks too


def kill(job: subprocess.Popen[str]) -> None:
    """End a failed job and every rank: killing `ddpviz record` alone leaves torchrun's
    workers holding the pipes (held at a gate), and communicate() would wait for them."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    job.communicate(timeout=30)


def finish(job: subprocess.Popen[str]) -> tuple[dict[int, str], str]:
    stdout, stderr = job.communicate(timeout=LIMIT)
    assert job.returncode == 0, stdout + stderr
    # Ranks share torchrun's stdout: their lines can interleave mid-line, so match, not split.
    found = {int(r): d for r, d in
             re.findall(r"rank (\d+) done (loss [-0-9.e+]+ bits [0-9a-f]{20})", stdout)}
    assert sorted(found) == [0, 1], stdout
    return found, stderr


def forwards(session: Session) -> dict[int, set[int]]:
    """The steps whose forward each rank has started, as the session has them."""
    seen: dict[int, set[int]] = {0: set(), 1: set()}
    for e in session.trace.of_type(ev.ForwardStarted):
        seen.setdefault(e.rank, set()).add(e.step)
    return seen


def reached(gate: Path) -> bool:
    return all(Path(f"{gate}.reached{r}").exists() for r in (0, 1))


def test_attach_mid_run_see_history_and_new_steps_detach_reattach(python: str,
                                                                  tmp_path: Path) -> None:
    out, first_gate, second_gate = tmp_path / "traces", tmp_path / "g5", tmp_path / "g9"
    job = start(python, out, f"5:{first_gate},9:{second_gate}")
    try:
        assert eventually(lambda: reached(first_gate) or job.poll() is not None, LIMIT)
        assert job.poll() is None, job.communicate()
        # Held before step 5: attach, and the history is there.
        session = ddpviz.listen(follow=out, show=False)
        assert eventually(lambda: all(forwards(session)[r] >= set(range(5)) for r in (0, 1)),
                          LIMIT), forwards(session)
        assert all(max(steps) == 4 for steps in forwards(session).values())
        assert session.trace.of_type(ev.ParamsBuilt) and session.trace.of_type(ev.BucketAssigned)
        history = len(session.trace)
        # The CLI reads the same files mid-run: a running job is no error.
        diagnosed = subprocess.run([python, "-m", "ddpviz", "diagnose", str(out)], cwd=ROOT,
                                   env=job_env(), capture_output=True, text=True, timeout=LIMIT)
        assert diagnosed.returncode == 0, diagnosed.stdout + diagnosed.stderr
        assert "from ranks 0,1 (world size 2), 5 steps" in diagnosed.stdout, diagnosed.stdout
        board = session.dashboard()
        # The follower reads on in the background (step 4's last events may still be on
        # their way to the file): the board holds the history and keeps up with the session.
        assert eventually(lambda: board.events_sent == len(session.trace), LIMIT)
        assert board.events_sent >= history
        # Let it run to step 9: the new steps arrive in the same session and its dashboard.
        first_gate.touch()
        assert eventually(lambda: reached(second_gate) or job.poll() is not None, LIMIT)
        assert eventually(lambda: all(forwards(session)[r] >= set(range(9)) for r in (0, 1)),
                          LIMIT), forwards(session)
        assert eventually(lambda: board.events_sent == len(session.trace), LIMIT)
        assert len(session.trace) > history
        before = {r: session.trace.events(r) for r in (0, 1)}
        board.close()
        session.close()  # detach: the job is still held at step 9, untouched
        assert job.poll() is None
        again = ddpviz.listen(follow=out, show=False)
        second_gate.touch()
        attached, _ = finish(job)
    except BaseException:
        kill(job)
        raise
    files = {r: ddpviz.Trace.load(out / f"ddpviz-trace-rank{r}.ddpviz") for r in (0, 1)}
    # Nothing lost or doubled: the re-attached session ends with every event of the files,
    # and counts both ranks finished once their processes have exited.
    assert again.wait(ranks=2, timeout=LIMIT), again.stats
    for r in (0, 1):
        assert again.trace.events(r) == files[r].events(r)
        assert before[r] == files[r].events(r)[:len(before[r])]  # the detached one: a prefix
        assert sorted(forwards(again)[r]) == list(range(STEPS))
    assert again.stats.gaps == {0: 0, 1: 0}
    assert again.collector.problems == []  # type: ignore[union-attr]
    again.close()
    # The same job never attached ends with the same loss and the same parameters, bit for bit.
    plain, _ = finish(start(python, tmp_path / "plain", ""))
    assert attached == plain


def test_ranks_seen_from_another_node_show_as_finished_by_their_files(
        python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whether a writing process still runs is known only on its own machine; from another
    # node only the file's end record (tracefile.py) can say that a rank is done.
    monkeypatch.setattr(follow, "_writer_gone", lambda meta: False)
    out, gate = tmp_path / "traces", tmp_path / "g3"
    job = start(python, out, f"3:{gate}")
    try:
        assert eventually(lambda: reached(gate) or job.poll() is not None, LIMIT)
        assert job.poll() is None, job.communicate()
        session = ddpviz.listen(follow=out, show=False)
        assert session.stats.closed == {}  # running: no rank is done
        gate.touch()
        finish(job)
    except BaseException:
        kill(job)
        raise
    assert session.wait(ranks=2, timeout=LIMIT), session.stats
    feed = session.collector
    assert isinstance(feed, follow.FolderFeed)
    received = session.stats.received
    assert feed.ended == {r: End(r, received[r], 0) for r in (0, 1)}
    assert all(sorted(forwards(session)[r]) == list(range(STEPS)) for r in (0, 1))
    session.close()
    diagnosed = subprocess.run([python, "-m", "ddpviz", "diagnose", str(out)], cwd=ROOT,
                               env=job_env(), capture_output=True, text=True, timeout=LIMIT)
    assert diagnosed.returncode == 0, diagnosed.stdout + diagnosed.stderr
    assert "ddpviz: ranks 0,1 ended cleanly." in diagnosed.stdout.splitlines()
