"""The debugger panel's kernel side (ddpviz/widgets/debugger_wire.py) and its place in the
TraceView (`TraceView(run, debugger=True)`, trait `debugger_state`, messages of kind
"debugger"), on 2 real gloo ranks (`ddpviz.launch(..., debug=True)`) that wait between phases
of training (tests/browser/rank_fns.train_in_phases): the buttons' commands pause, inspect and
resume them, a click's break at a bucket parks them there, errors are said as plain text, and
malformed commands are refused in words with nothing sent. Drawing it: tests/browser/
test_lab_debugger_view.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz.debugger import protocol as p
from ddpviz.widgets import debugger_wire
from ddpviz.widgets.debugger_wire import DebuggerWire
from ddpviz.widgets.trace_view import TraceView
from tests.browser import rank_fns
from tests.launch.magic_shell import magic_shell, pool, run
from tests.polling import eventually
from tests.widgets.streams import synthetic_run

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

HOSTILE = "<script>alert(1)</script>"


def _go(path: Path) -> None:
    """Let the ranks' next phase go once the command just sent reached them (rank_fns)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("after-command")
    tmp.replace(path)


def _state(view: TraceView) -> dict[str, Any]:
    return json.loads(view.debugger_state)  # type: ignore[no-any-return]


def _send(view: TraceView, content: object) -> None:
    view._on_msg(view, content, [])  # what the browser's model.send({...}) arrives as


def test_the_view_pauses_inspects_breaks_and_resumes_real_ranks(tmp_path: Path) -> None:
    go = tmp_path / "go"
    # (the last phase long: a pause under load may be agreed a few steps after it is sent)
    run = ddpviz.launch(rank_fns.train_in_phases, 2, args=(str(go), (2, 3, 20), 0.005),
                        debug=True, timeout=300)
    view = None
    try:
        dbg = run.debugger
        assert eventually(lambda: dbg.next_step() >= 2, 240)  # steps 0-1 ran; the ranks wait
        view = TraceView(run, debugger=True)
        assert view.debugger is dbg and view.debugger_wire is not None
        state = _state(view)
        assert state["status"].startswith("running") and not state["stopped"]
        assert state["stop"] is None and state["breaks"] == [] and state["breaks_text"] == "none"
        assert state["next_step"] == 3  # next_step() + 1: the first a break set now stops
        assert "0.weight" in state["params"] and state["message"] == ""

        # errors are said in words, as plain text (the browser writes them as text)
        _send(view, {"kind": "debugger", "op": "inspect", "name": HOSTILE, "what": "grad"})
        state = _state(view)
        assert state["error"] and "no parameter '<script>alert(1)</script>'" in state["message"]
        _send(view, {"kind": "debugger", "op": "inspect", "name": "0.weight", "what": "grad"})
        state = _state(view)
        assert state["error"] and "dbg.pause() then dbg.wait()" in state["message"]

        # malformed commands: refused in words, nothing sent to the ranks
        sent = p.last_request()
        for bad in ({"kind": "debugger", "op": "run", "code": "import os"},
                    {"kind": "debugger", "op": "break_at", "step": 3, "bucket": 1,
                     "code": "print(1)"},
                    {"kind": "debugger", "op": "break_at", "step": "3", "bucket": 1},
                    {"kind": "debugger", "op": "break_at", "step": True, "bucket": 1},
                    {"kind": "debugger", "op": "break_at", "step": 1 << 62, "bucket": 1},
                    {"kind": "debugger", "op": "break_at", "step": 3, "bucket": -1},
                    {"kind": "debugger", "op": "break_at", "step": 3, "bucket": 1.5},
                    {"kind": "debugger", "op": "break_at", "step": 3, "where": "eval"},
                    {"kind": "debugger", "op": "inspect", "name": "x" * 5000, "what": "grad"},
                    {"kind": "debugger", "op": "inspect", "name": ["0.weight"]},
                    {"kind": "debugger", "op": "inspect", "what": "bucket_grads", "bucket": None},
                    {"kind": "debugger", "op": "inspect", "name": "0.weight", "what": "__class__"},
                    {"kind": "debugger", "op": 7}, {"kind": "debugger"}):
            _send(view, bad)
            state = _state(view)
            assert state["error"] and "nothing was done" in state["message"], bad
        for ignored in ("debugger", None, [1], {"kind": "hello"}):
            _send(view, ignored)  # not a command for the debugger: ignored
        assert p.last_request() == sent and dbg.breaks == () and dbg.stop is None

        # a click on bucket 1 (the panel sends the break row's step): said, and set
        _send(view, {"kind": "debugger", "op": "break_at", "step": 3, "where": "bucket",
                     "bucket": 1, "clicked": True})
        state = _state(view)
        assert not state["error"]
        assert state["message"] == "break set before bucket 1's all-reduce at step 3"
        assert dbg.breaks == (p.BreakAt(step=3, where="bucket", bucket=1),)
        assert state["breaks"] == [{"kind": "at", "step": 3, "where": "bucket", "bucket": 1,
                                    "text": "step 3 bucket 1"}]
        _go(go.with_name("go1"))
        assert eventually(lambda: _state(view)["agreed"]
                          and len(_state(view)["stop"]["ranks"]) == 2, 120)
        state = _state(view)  # (set by the Debugger's change callback, on its thread)
        assert state["status"] == "paused at step 3, before bucket 1's all-reduce on ranks 0,1"
        stop = state["stop"]
        assert (stop["step"], stop["point"], stop["bucket"]) == (3, "bucket", 1)
        assert stop["groups"] == [{"step": 3, "point": "bucket", "bucket": 1, "ranks": [0, 1],
                                   "label": "ranks 0,1"}]
        assert all(r["t_ns"] > 0 for r in stop["ranks"]) and stop["params"]

        # inspect: every rank's facts side by side, compared
        name = stop["params"][0]
        _send(view, {"kind": "debugger", "op": "inspect", "name": name, "what": "grad"})
        state = _state(view)
        assert not state["error"], state["message"]
        result = state["result"]
        assert view.debugger_wire.result is not None
        # before the all-reduce each rank holds its own local gradient: two bitwise groups
        assert result["name"] == name and result["what"] == "grad" and not result["all_equal"]
        assert [r["rank"] for r in result["ranks"]] == [0, 1]
        assert all(r["n_nan"] == 0 and r["dtype"] == "float32" for r in result["ranks"])
        assert sorted(g["letter"] for g in result["groups"]) == ["A", "B"]
        assert result["difference"] is not None and len(result["difference"]["values"]) == 2
        assert len(result["rows"]) == 2 and len(result["columns"]) == 9
        assert "different values" in result["notes"][0]
        _send(view, {"kind": "debugger", "op": "inspect", "what": "bucket_buffer", "bucket": 1})
        assert not _state(view)["error"] and _state(view)["result"]["bucket"] == 1

        _send(view, {"kind": "debugger", "op": "resume"})
        state = _state(view)
        assert not state["error"], state["message"]
        assert eventually(lambda: _state(view)["stop"] is None, 60)
        assert _state(view)["status"].startswith("running")

        # pause: the ranks stop before the next forward they all reach
        # steps 2-4 ran on every rank, which then waits for go2 (a command sent before a rank
        # got there would not count as the one it waits for: rank_fns.train_in_phases)
        assert eventually(lambda: len(dbg._last_step) == 2
                          and min(dbg._last_step.values()) >= 4, 120)
        time.sleep(1.0)
        _send(view, {"kind": "debugger", "op": "pause"})
        _go(go.with_name("go2"))
        assert eventually(lambda: _state(view)["agreed"]
                          and len(_state(view)["stop"]["ranks"]) == 2, 120), _state(view)
        stop = _state(view)["stop"]
        assert (stop["point"], stop["bucket"]) == ("forward", -1) and stop["step"] >= 5
        _send(view, {"kind": "debugger", "op": "step_step"})
        assert not _state(view)["error"], _state(view)["message"]
        assert eventually(lambda: _state(view)["stop"] is not None
                          and _state(view)["stop"]["step"] == stop["step"] + 1
                          and len(_state(view)["stop"]["ranks"]) == 2, 120)
        _send(view, {"kind": "debugger", "op": "clear"})
        assert dbg.breaks == () and _state(view)["breaks_text"] == "none"
        _send(view, {"kind": "debugger", "op": "resume"})
        assert not _state(view)["error"], _state(view)["message"]
        assert len(run.wait(timeout=240)) == 2
    finally:
        if view is not None:
            view.close()
        if not run.done():
            run.stop()
    assert view.debugger_wire is not None and view.debugger_wire._closed


def test_without_a_debugger_the_view_has_no_panel_and_ignores_debugger_messages() -> None:
    events = synthetic_run(2, 8, 2, cap=1100)
    view = TraceView(events)
    assert view.debugger is None and view.debugger_wire is None and view.debugger_state == ""
    _send(view, {"kind": "debugger", "op": "pause"})  # nothing listens
    assert view.debugger_state == ""
    with pytest.raises(ValueError, match=r"needs a live Run or Session, not list"):
        TraceView(events, debugger=True)
    with pytest.raises(ValueError, match=r"takes a Debugger, True or None"):
        TraceView(events, debugger="yes")


def test_the_output_kept_is_the_tail_bounded() -> None:
    tail = debugger_wire._Tail(limit=100)
    for i in range(1000):
        tail.write(f"{i:05d}\n")
    text = tail.text()
    assert len(text) == 100 and text.endswith("00999\n") and tail.dropped > 0
    tail.clear()
    assert tail.text() == ""


def test_an_unknown_source_of_commands_is_refused_before_any_debugger_call() -> None:
    class NoDebugger:  # every attribute a call would touch raises: none may be reached
        def on_change(self, _fn: object) -> Any:
            return lambda: None

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"called {name}")

    wire = DebuggerWire(NoDebugger())  # type: ignore[arg-type]
    for bad in ({"kind": "debugger", "op": "__init__"}, {"kind": "x", "op": "pause"},
                {"kind": "debugger", "op": "pause", "then": "resume"}):
        assert wire.handle(bad) is False
        assert (wire.error and "nothing was done" in wire.message) or "not a debugger" in \
            wire.message
    started = time.monotonic()
    assert wire.handle({"kind": "debugger", "op": "inspect", "name": "a", "what": "nope"}) is False
    assert time.monotonic() - started < 1


shell = pytest.fixture(scope="module")(magic_shell)

POOL = "%%ddp -n 2 --backend gloo --debug\nfrom tests.debugger import pool_fns as f\n" \
       "st = f.build('guard')\n"
TRAIN = """%%ddp
for s in range(0, 5):
    loss = f.train_step(st, s)
    print(f"step {s} loss {loss:.6f}")
f.final(st)
"""


def test_a_pools_step_and_resume_keep_what_the_rest_of_the_cell_printed(
        shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_line_magic("ddp_stop", "")
    try:
        error, _ = run(shell, capsys, POOL)
        assert error is None
        wire = DebuggerWire(shell.run_line_magic("ddp_debugger", ""))
        assert wire.handle({"kind": "debugger", "op": "break_at", "step": 2,
                            "where": "forward"}), wire.message
        error, _ = run(shell, capsys, TRAIN)
        assert error is None and pool(shell).parked.where == "step 2, before DDP's forward"
        assert wire.state()["stop"]["step"] == 2
        # step: the parked cell goes on (on this thread) to the next forward; what it printed
        # is kept for the panel, not printed into the cell that happens to be running
        assert wire.handle({"kind": "debugger", "op": "step_step"}), wire.message
        assert pool(shell).parked.step == 3
        assert sorted(line.split()[:4] for line in wire.output.splitlines()
                      if line.startswith("[rank ") and "] step " in line) == [
            ["[rank", "0]", "step", "2"], ["[rank", "1]", "step", "2"]]
        assert "every rank stopped at step 3, before DDP's forward" in wire.output
        assert wire.state()["output"] == wire.output
        assert wire.handle({"kind": "debugger", "op": "clear"})
        assert wire.handle({"kind": "debugger", "op": "resume"}), wire.message
        assert pool(shell).parked is None
        said = wire.output.splitlines()
        assert "[rank 0] step 4" in "\n".join(said) and "step 2" not in "\n".join(said)
        assert sum(line.startswith("[rank ") and "] Out: " in line for line in said) == 2
        assert "Out:" not in capsys.readouterr().out
        wire.close()
    finally:
        shell.run_line_magic("ddp_stop", "")
        capsys.readouterr()


def test_abort_returns_at_once_and_the_ranks_end(tmp_path: Path) -> None:
    go = tmp_path / "go"
    run = ddpviz.launch(rank_fns.train_in_phases, 2, args=(str(go), (2, 100_000), 0.005),
                        debug=True, timeout=300)
    pushed: list[str] = []
    try:
        dbg = run.debugger
        assert eventually(lambda: dbg.next_step() >= 2, 240)
        wire = DebuggerWire(dbg, pushed.append)
        _go(go.with_name("go1"))  # (no command yet: the ranks wait up to 60 s, then train)
        started = time.monotonic()
        assert wire.handle({"kind": "debugger", "op": "abort"}), wire.message
        assert time.monotonic() - started < 5  # the wait for the ranks is off this thread
        assert eventually(run.done, 60)
        # the waiting thread said the end (no error: every rank ended in time)
        assert eventually(lambda: json.loads(pushed[-1])["message"] ==
                          "aborted: every rank ended (their traces saved)", 30), pushed[-1]
        assert not json.loads(pushed[-1])["error"], pushed[-1]
        wire.close()
    finally:
        if not run.done():
            run.stop()
