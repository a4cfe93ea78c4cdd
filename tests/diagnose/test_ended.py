"""A rank whose trace file ends with its end record (tracefile.py's [Note: a rank's end in its
file]) is never named as hung by `diagnose` ([Note: ranks that ended cleanly]): a rank still
writing when the files were read is not waiting for a rank that ended after reaching its
step; a rank that ended at an earlier step is named as having ended, not as hung; one that
died of an uncaught exception is treated as before. `ddpviz diagnose DIR` reads the records
of the files written by ranks' senders and says which ranks ended."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.findings import fix_for
from ddpviz.traces.fileformat import End, TraceWriter
from ddpviz.traces.trace import Trace
from tests.diagnose.synthetic import Ranks

ROOT = Path(__file__).resolve().parents[2]


def run(last: dict[int, int], open_on: int | None) -> Trace:
    """2 ranks: rank r runs steps 0..last[r]; `open_on`'s last step launches its all-reduce,
    which never completes in its events."""
    ranks = Ranks(2)
    ranks.construct()
    for r in (0, 1):
        for step in range(last[r] + 1):
            ranks.iteration(r, step, finish=not (r == open_on and step == last[r]))
    return Trace(ranks.events)


def hangs(trace: Trace, ended: dict[int, End] | None = None) -> list[tuple[str, tuple[int, ...],
                                                                         str]]:
    return [(f.title, f.ranks, f.fix) for f in diagnose(trace, ended=ended)
            if f.kind == "rank_hang"]


def test_a_rank_still_writing_is_not_waiting_for_one_that_ended_after_its_step() -> None:
    # rank 0's file was read mid-all-reduce of step 3; rank 1 finished step 3 and ended
    trace = run({0: 3, 1: 3}, open_on=0)
    before = hangs(trace)  # without the record: rank 1, done, is named as the one not in it
    assert before and before[0][1] == (1,) and "rank 1 was not in it" in before[0][0]
    assert hangs(trace, {1: End(1, 50, 0)}) == []


def test_a_rank_that_ended_at_an_earlier_step_is_named_as_ended_not_hung() -> None:
    trace = run({0: 3, 1: 1}, open_on=0)
    [(title, ranks, fix)] = hangs(trace, {1: End(1, 30, 0)})
    assert title == ("rank 0 was still waiting in a collective when the events end; rank 1 had "
                     "already ended cleanly, at an earlier step")
    assert ranks == (1,) and fix == fix_for("uneven_iterations", "left_loop")
    [hang] = [f for f in diagnose(trace, ended={1: End(1, 30, 0)}) if f.kind == "rank_hang"]
    assert ("ended cleanly after step 1", (1,)) in hang.values


def test_a_rank_that_died_of_an_exception_is_not_taken_for_a_clean_end() -> None:
    trace = run({0: 3, 1: 3}, open_on=0)
    assert hangs(trace, {1: End(1, 50, 0, error="ValueError")}) == hangs(trace)


def test_a_rank_that_ended_is_never_still_waiting_whatever_its_last_events() -> None:
    trace = run({0: 3, 1: 3}, open_on=1)  # rank 1's last all-reduce has no done event
    assert hangs(trace) and hangs(trace, {1: End(1, 50, 0)}) == []


def ranks_file(folder: Path, rank: int, steps: int, crash: bool = False) -> None:
    """A rank's file as `ddpviz record` writes it: a Sender into a file, closed at exit (a
    subprocess: the exit hooks close it), optionally dying of an uncaught exception."""
    code = (
        "import sys\nfrom ddpviz import events as ev\n"
        "from ddpviz.transport.sender import Sender\n"
        f"s = Sender.to_file(sys.argv[1], {rank})\ntap = ev.Tap(s, {rank})\n"
        f"for step in range({steps}):\n"
        "    tap.step = step\n    tap.emit(ev.ForwardStarted)\n    tap.emit(ev.BackwardStarted)\n"
        "    tap.emit(ev.BackwardFinished)\n"
        + ("raise ValueError('planted')\n" if crash else ""))
    subprocess.run([sys.executable, "-c", code, str(folder / f"ddpviz-trace-rank{rank}.ddpviz")],
                   cwd=ROOT, capture_output=True, check=not crash, timeout=120)


def test_diagnose_dir_says_which_ranks_ended(tmp_path: Path) -> None:
    ranks_file(tmp_path, 0, 3)
    ranks_file(tmp_path, 1, 3, crash=True)
    # a rank still running: its events so far, no end record yet
    with TraceWriter(tmp_path / "ddpviz-trace-rank2.ddpviz", meta={"rank": 2}) as w:
        w.write(ev.ForwardStarted(2, 0, 1, 0))
    out = subprocess.run([sys.executable, "-m", "ddpviz", "diagnose", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert ("ddpviz: rank 0 ended cleanly; rank 1 exited on an uncaught ValueError; rank 2 has "
            "no end record (still running, or killed).") in out.stdout.splitlines(), out
    data = subprocess.run([sys.executable, "-m", "ddpviz", "diagnose", "--json", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert json.loads(data.stdout)["trace"]["ended"] == {
        "0": {"events": 9, "dropped": 0, "error": ""},
        "1": {"events": 9, "dropped": 0, "error": "ValueError"}}


def test_a_copy_of_a_ranks_file_leaves_the_rank_without_an_end_and_is_named(
        tmp_path: Path) -> None:
    # See [Note: whose end record counts] (traces/source.py): two files say they are rank 0's
    # (a copy left in the folder), so neither's record counts, and the verdict says why.
    ranks_file(tmp_path, 0, 3)
    ranks_file(tmp_path, 1, 3)
    copy = tmp_path / "ddpviz-trace-rank0-copy.ddpviz"
    copy.write_bytes((tmp_path / "ddpviz-trace-rank0.ddpviz").read_bytes())
    out = subprocess.run([sys.executable, "-m", "ddpviz", "diagnose", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert ("ddpviz: rank 1 ended cleanly; rank 0 has no end record (still running, or "
            "killed).") in lines, out
    said = (f"ddpviz: 2 files say they are rank 0's: {str(copy)!r}, "
            f"{str(tmp_path / 'ddpviz-trace-rank0.ddpviz')!r}. Only one can be")
    assert any(line.startswith(said) for line in lines), out
    assert out.stderr == "", out.stderr  # said in the verdict, not as a Python warning
