"""The debugger through its public API on real gloo ranks: `launch(..., debug=True)`,
`run.debugger.break_at`, `wait`, `inspect` of a gradient on every rank (each rank's local
gradient before its bucket's all-reduce, as an unpaused run's gradient hooks saw it), `fetch`,
`run`, `resume`: the paused run ends bitwise as an unpaused one. Then `abort`: every rank ends
within 5 s and no rank process is left."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.debugger.client import DebuggerError
from tests.debugger import rank_fns
from tests.debugger.harness import reference, stopping
from tests.debugger.rank_fns import STEP

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = 6


def _launch(tmp: Path, steps: int, sleep: float = 0.0,
            nan_at: int = -1) -> tuple[ddpviz.Run, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    go = tmp / "go"
    run = ddpviz.launch(rank_fns.train, 2, args=("twin", steps, str(tmp)),
                        kwargs={"go": str(go), "sleep": sleep, "nan_at": nan_at}, debug=True,
                        timeout=240)
    # every rank connected before the break goes out (the ranks wait for `go` to train)
    assert run.session.collector.wait(lambda s: len(s.peers) == 2, timeout=120)
    return run, go


def test_break_inspect_resume_through_run_debugger(tmp_path: Path) -> None:
    ref = reference("twin", STEPS, tmp_path / "ref")
    run, go = _launch(tmp_path / "run", STEPS)
    with stopping(run):
        dbg = run.debugger
        assert run.debugger is dbg
        with pytest.raises(DebuggerError, match=r"dbg.pause\(\) then dbg.wait\(\)"):
            dbg.inspect("fc1.weight", "grad")
        dbg.break_at(step=STEP, bucket=0)
        go.touch()
        stop = dbg.wait(timeout=120)
        assert stop.agreed and (stop.step, stop.point, stop.bucket) == (STEP, "bucket", 0)
        assert sorted(stop.ranks) == [0, 1] and stop.params  # bucket 0's parameters by name
        assert dbg.status() == f"paused at step {STEP}, before bucket 0's all-reduce on ranks 0,1"
        name = stop.params[0]
        values = dbg.inspect(name, "grad", timeout=60)
        # before the all-reduce each rank holds its own local gradient: different data per
        # rank, so two bitwise groups, and the first differing element located and fetched
        assert not values.all_equal and len(values.comparison.groups) == 2
        assert values.bucket_of_param == 0
        assert values.difference is not None and len(set(values.difference.values.values())) == 2
        whole = dbg.fetch(name, "grad", timeout=60)
        flat = values.difference.flat
        for r in (0, 1):
            assert whole[r].reshape(-1)[flat].item() == values.difference.values[r]
        out = dbg.run("print(rank, step)", timeout=60)
        assert {r: c.stdout.strip() for r, c in out.items()} == {0: f"0 {STEP}", 1: f"1 {STEP}"}
        dbg.clear()
        dbg.resume(timeout=60)
        final = run.wait(timeout=240)
        local = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text())["local"]
                 for r in (0, 1)]
    # the summaries the ranks sent were of the very gradients an unpaused run's hooks saw
    for r in (0, 1):
        assert values[r].digest == local[r][name] == ref[r]["local"][name]
    # paused, inspected, fetched, code run, resumed: bitwise the unpaused run's parameters
    assert final == [ref[0]["final"], ref[1]["final"]]


def test_abort_ends_every_rank_within_5_s(tmp_path: Path) -> None:
    run, go = _launch(tmp_path, 10_000, sleep=0.01)
    with stopping(run):
        dbg = run.debugger
        dbg.break_at(step=2, where="forward")
        go.touch()
        dbg.wait(timeout=120)
        t0 = time.monotonic()
        ended = dbg.abort(timeout=10)
        took = time.monotonic() - t0
        assert ended == (0, 1)
        assert took < 5.0, f"abort took {took:.2f} s"
        assert run.done() and run.status in ("failed", "stopped")
        # each rank said it left its park to abort before it ended: its events were flushed
        assert {e.rank for e in run.trace.events()
                if isinstance(e, ev.Unparked) and e.how == "abort"} == {0, 1}
        for pid in run.pids:  # no rank process is left
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
