"""The debugger in %%ddp pools, in a real IPython shell on real gloo ranks: a break set before a
training cell makes the cell return with every rank parked in it; a gradient is read there; a
new cell is refused while parked; resume runs the rest of the cell (its output and result come
in the resuming cell) and the run ends bitwise as the same cells without the debugger (torch's
DDP alone); step blocks until the next park; abort ends the cell and leaves no rank."""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.debugger.client import DebuggerError
from ddpviz.launcher.errors import CellParked
from tests.debugger.rank_fns import STEP, digest
from tests.launch.magic_shell import magic_shell, pool, run
from tests.launch.processes import still_alive

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]

STEPS = 6
BUILD = "%%ddp -n 2 --backend gloo{debug}\nfrom tests.debugger import pool_fns as f\n" \
        "st = f.build({kind!r})\n"
TRAIN = """%%ddp
for s in range({first}, {last}):
    loss = f.train_step(st, s)
    print(f"step {{s}} loss {{loss:.6f}}")
f.final(st)
"""
_OUT = re.compile(r"^\[rank (\d+)\] Out: (.*)$")
_STEP = re.compile(r"^\[rank \d+\] step \d+ loss ")


shell = pytest.fixture(scope="module")(magic_shell)


def outs(lines: list[str]) -> dict[int, Any]:
    """Each rank's `Out:` value, read back."""
    return {int(m[1]): ast.literal_eval(m[2]) for line in lines if (m := _OUT.match(line))}


_REF: dict[str, Any] = {}


def reference(shell: Any, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The same cells on torch's DDP alone, without the debugger (run once per module): the
    step lines, the final parameters, and the local and averaged gradients of step STEP."""
    if not _REF:
        shell.run_line_magic("ddp_stop", "")
        error, _ = run(shell, capsys, BUILD.format(debug="", kind="torch"))
        assert error is None
        error, lines = run(shell, capsys, TRAIN.format(first=0, last=STEPS))
        assert error is None
        _REF["steps"] = sorted(line for line in lines if _STEP.match(line))
        _REF["final"] = outs(lines)
        error, lines = run(shell, capsys, "%%ddp\n(st.local, st.averaged)\n")
        assert error is None
        grads = outs(lines)
        _REF["local"] = {r: g[0] for r, g in grads.items()}
        _REF["averaged"] = {r: g[1] for r, g in grads.items()}
        shell.run_line_magic("ddp_stop", "")
        capsys.readouterr()
    assert len(_REF["steps"]) == 2 * STEPS and len(_REF["final"]) == 2
    return _REF


@pytest.mark.parametrize("kind", ["twin", "guard"])
def test_a_cell_parks_at_a_break_and_resumes_to_the_unpaused_end(
        shell: Any, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    ref = reference(shell, capsys)
    shell.run_line_magic("ddp_stop", "")
    capsys.readouterr()
    error, lines = run(shell, capsys, BUILD.format(debug=" --debug", kind=kind))
    assert error is None
    assert lines[0].startswith("ddpviz: started 2 ranks (gloo) with the debugger")
    dbg = shell.run_line_magic("ddp_debugger", "")
    assert dbg is pool(shell).debugger
    dbg.break_at(step=STEP, bucket=1)
    dbg.break_at(step=STEP, where="optimizer_step")

    # the training cell returns with every rank parked before bucket 1's all-reduce
    error, lines = run(shell, capsys, TRAIN.format(first=0, last=STEPS))
    seen = list(lines)
    assert error is None
    stop = pool(shell).parked
    assert stop is not None and stop.agreed and sorted(stop.ranks) == [0, 1]
    assert (stop.step, stop.point, stop.bucket) == (STEP, "bucket", 1)
    assert any(line.startswith(f"ddpviz: every rank stopped at step {STEP}, before bucket 1's "
                               "all-reduce") for line in lines)
    assert not outs(lines)  # the cell has not finished

    # its gradients there are each rank's local ones: as the unpaused run's at that step
    assert stop.params
    for name in stop.params:
        got = dbg.fetch(name, "grad")
        for rank in (0, 1):
            assert digest(got[rank]) == ref["local"][rank][name], (kind, name, rank)
    values = dbg.inspect(stop.params[0], "grad")
    assert sorted(values.summaries) == [0, 1] and len(values.comparison.groups) == 2

    # another cell is refused while parked, saying how to go on; the ranks never run it
    error, lines = run(shell, capsys, "%%ddp\nprint('the refused cell ran')\n")
    seen += lines
    assert isinstance(error, CellParked)
    assert "dbg.resume()" in str(error) and "dbg.abort()" in str(error)
    assert f"at step {STEP}, before bucket 1's all-reduce" in str(error)

    # resume: the cell goes on to the next break (after the optimizer step) and returns there
    dbg.resume()
    lines = capsys.readouterr().out.splitlines()
    seen += lines
    stop = pool(shell).parked
    assert stop is not None and (stop.step, stop.point) == (STEP, "optimizer_step")
    assert dbg.wait(timeout=5).point == "optimizer_step"
    for name, digests in ref["averaged"][0].items():
        got = dbg.fetch(name, "grad")
        assert digest(got[0]) == digest(got[1]) == digests, (kind, name)

    # resume again: the rest of the cell, its output and its result, come here
    dbg.resume()
    lines = capsys.readouterr().out.splitlines()
    seen += lines
    assert pool(shell).parked is None
    assert outs(lines) == ref["final"]
    assert ref["final"][0] == ref["final"][1]
    capsys.readouterr()
    # every step printed once, across the cells, as the unpaused run printed it
    assert sorted(line for line in seen if _STEP.match(line)) == ref["steps"]
    assert not any("the refused cell ran" in line for line in seen)
    with pytest.raises(DebuggerError, match="no %%ddp cell is parked"):
        dbg.wait(timeout=1)

    # the pool goes on as a pool: the next cell runs, with the ranks' state
    error, lines = run(shell, capsys, "%%ddp\nf.final(st)\n")
    assert error is None and outs(lines) == ref["final"]
    shell.run_line_magic("ddp_stop", "")
    capsys.readouterr()


def test_step_blocks_until_the_next_park_and_abort_leaves_no_rank(
        shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_line_magic("ddp_stop", "")
    capsys.readouterr()
    error, lines = run(shell, capsys, BUILD.format(debug=" --debug", kind="guard"))
    assert error is None
    dbg = shell.run_line_magic("ddp_debugger", "")
    the_pool = pool(shell)
    pids = the_pool.pids
    dbg.break_at(step=2, where="forward")
    error, lines = run(shell, capsys, TRAIN.format(first=0, last=STEPS))
    assert error is None
    assert pool(shell).parked.where == "step 2, before DDP's forward"
    stop = dbg.step("step")  # blocks until every rank parked again, in the same cell
    lines = capsys.readouterr().out.splitlines()
    assert stop is not None and (stop.step, stop.point) == (3, "forward")
    assert pool(shell).parked.step == 3
    assert sorted(line.split()[3] for line in lines if _STEP.match(line)) == ["2", "2"]

    ended = dbg.abort()
    lines = capsys.readouterr().out.splitlines()
    assert ended == (0, 1)
    assert still_alive(pids) == []  # no rank left, in a collective or anywhere
    assert not the_pool.alive
    assert lines[0].startswith("ddpviz: aborted: the parked cell ended at step 3, before DDP's "
                               "forward on every rank")
    # every rank left its park by the abort, and said so before it ended
    for rank in (0, 1):
        hows = [e.how for e in the_pool.session.trace.events(rank)
                if isinstance(e, ev.Unparked)]
        assert hows[-1] == "abort", (rank, hows)
    with pytest.raises(DebuggerError, match="were stopped"):
        dbg.resume()
    with pytest.raises(DebuggerError, match="no %%ddp ranks are running"):
        shell.run_line_magic("ddp_debugger", "")

    # the next cell starts fresh ranks, with the debugger again
    error, lines = run(shell, capsys, "%%ddp\nprint('st' in globals())\n")
    assert error is None
    assert lines[0].startswith("ddpviz: started 2 ranks (gloo) with the debugger")
    assert sorted(lines[1:]) == ["[rank 0] False", "[rank 1] False"]
    assert shell.run_line_magic("ddp_debugger", "") is pool(shell).debugger
    shell.run_line_magic("ddp_stop", "")
    capsys.readouterr()
