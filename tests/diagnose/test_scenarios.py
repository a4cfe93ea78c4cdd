"""Diagnosis scenarios on real gloo ranks: each situation of issue 5 planted on ONE rank, the
exact finding asserted on EVERY rank (kind, parameter name, ranks, field), in bounded time, and
the same situation run through stock torch DDP as the recorded baseline.

Ranks come from a forkserver that imported torch once (harness start_method="forkserver"), so
a run costs well under a second; model mismatches leave the group usable (every rank raises the
same error), so they share one 3-rank run. Torch baselines that crash or hang get their own
2-rank runs with a 4 s gloo timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddpviz.errors import RankMismatchError
from ddpviz.findings import Finding
from tests.diagnose.scenario_models import MODEL_DEFECTS, Net
from tests.dist.harness import RankFailed, run_ranks
from tests.recordings import recording

pytestmark = pytest.mark.dist

PG_TIMEOUT = 4.0  # gloo's timeout in torch baselines: how long torch lets a rank hang
FAST: dict[str, Any] = {"start_method": "forkserver", "init": False, "allow_failures": True}


def init(rank: int, world_size: int, timeout: float = 60.0) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"


def summary(findings: tuple[Finding, ...] | list[Finding]) -> list[tuple[Any, ...]]:
    """What a scenario asserts of each finding: kind, parameter name, ranks, field."""
    return [(f.kind, f.name, f.ranks, f.field) for f in findings]


def outcome(value: Any) -> str:
    """A rank's end in a torch baseline: its error's first line, SIGABRT, or an exit code."""
    if isinstance(value, RankFailed):
        text = next(iter(value.failures.values()))
        if "exit code -6" in text:
            return "SIGABRT"
        if "exit code" in text:
            return "exit code " + text.rsplit("exit code ", 1)[1].rstrip(")")
        return text.strip().splitlines()[-1]
    return str(value)


PIDS: list[int] = []  # every rank process the scenarios started (and that reported back)


def remember(results: dict[int, Any]) -> dict[int, Any]:
    PIDS.extend(v["pid"] for v in results.values() if isinstance(v, dict) and "pid" in v)
    return results


def no_orphans(pids: list[int]) -> bool:
    """True when none of `pids` is still running (zombies reaped by the harness count as gone)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] != "Z":
                    return False
        except FileNotFoundError:
            continue
    return True


# --- model differences ------------------------------------------------------------------------

ODD = 2  # the rank that differs in the 3-rank model scenarios

EXPECTED_MODEL: dict[str, list[tuple[Any, ...]]] = {
    "count": [("param_mismatch", "parameters", (2,), "count"),
              ("param_mismatch", "extra.weight", (2,), "present"),
              ("param_mismatch", "extra.bias", (2,), "present")],
    "names": [("param_mismatch", "fc.weight", (2,), "name"),
              ("param_mismatch", "fc.bias", (2,), "name")],
    "order": [("param_mismatch", "a.weight", (2,), "order"),
              ("param_mismatch", "a.bias", (2,), "order"),
              ("param_mismatch", "b.weight", (2,), "order"),
              ("param_mismatch", "b.bias", (2,), "order")],
    "shape": [("param_mismatch", "fc.weight", (2,), "shape"),
              ("param_mismatch", "fc.bias", (2,), "shape")],
    "stride": [("param_mismatch", "a.weight", (2,), "stride")],
    "dtype": [("param_mismatch", "fc.weight", (2,), "dtype"),
              ("param_mismatch", "fc.bias", (2,), "dtype")],
    "device": [("param_mismatch", "fc.weight", (2,), "device"),
               ("param_mismatch", "fc.bias", (2,), "device")],
    "requires_grad": [("param_mismatch", "fc.bias", (2,), "requires_grad")],
    "buffer_count": [("buffer_mismatch", "buffers", (2,), "count"),
                     ("buffer_mismatch", "extra_stats", (2,), "present")],
    "buffer_shape": [("buffer_mismatch", "stats", (2,), "shape")],
    "buffer_dtype": [("buffer_mismatch", "stats", (2,), "dtype")],
    "initial_values": [("initial_values", "a.weight", (2,), "values")],
}

# torch 2.13's DDP on the same defect (2 ranks, defect on rank 1): rank 0, rank 1. Where torch
# raises the same error everywhere or nothing at all, it runs in the shared 3-rank run instead.
# Rank 0 blocks in the state broadcast until rank 1's process is gone, then gets a transport
# error naming an address ("Connection closed by peer" or "... reset by peer", by timing).
TRANSPORT = ("Connection closed by peer", "Connection reset by peer")
TORCH_MODEL_BASELINE: dict[str, tuple[tuple[str, ...], str]] = {
    "shape": (TRANSPORT, "params[4] in this process with sizes [5, 8] appears not to match sizes"),
    "stride": (TRANSPORT,
               "params[0] in this process with sizes [8, 8] appears not to match strides"),
    "device": (TRANSPORT,
               "DistributedDataParallel's input module must be on the same type of devices"),
    "dtype": (TRANSPORT, "SIGABRT"),  # gloo: "Received data size doesn't match expected size"
    "buffer_dtype": (TRANSPORT, "SIGABRT"),
}
TORCH_SHARED_BASELINE = {  # rank 0's outcome in the shared run (torch raised on every rank or none)
    "count": "DDP expects same model across all ranks, but Rank 0 has 6 params, while rank 2 "
             "has inconsistent 8 params.",
    "requires_grad": "DDP expects same model across all ranks, but Rank 0 has 6 params, while "
                     "rank 2 has inconsistent 5 params.",
    "names": "no error", "order": "no error", "initial_values": "no error",
    "buffer_count": "no error", "buffer_shape": "no error",  # rank 2's extra room is garbage
}


def model_ranks(rank: int, world_size: int) -> dict[str, Any]:
    """Every model defect in turn through ddpviz.preflight(check=False) and ddpviz.preflight, then
    the torch baselines that leave the group usable."""
    import ddpviz

    init(rank, world_size)
    out: dict[str, Any] = {"ddpviz": {}, "torch": {}, "pid": os.getpid()}
    for defect in MODEL_DEFECTS:
        torch.manual_seed(rank if defect == "initial_values" and rank == ODD else 0)
        model = Net(defect if rank == ODD else "none")
        start = time.monotonic()
        report = ddpviz.preflight(model, timeout=10, check=False)
        entry: dict[str, Any] = {"ok": report.ok, "findings": summary(report.findings),
                                 "text": str(report)}
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ddpviz.preflight(model, timeout=10)
            entry["preflight"] = (f"warned: {str(caught[0].message).splitlines()[0]}" if caught
                                  else "passed")
        except RankMismatchError as exc:
            entry["preflight"] = first_line(exc)
            entry["preflight_findings"] = summary(exc.findings)
        entry["seconds"] = time.monotonic() - start
        out["ddpviz"][defect] = entry
    for defect in TORCH_SHARED_BASELINE:
        torch.manual_seed(rank if defect == "initial_values" and rank == ODD else 0)
        try:
            nn.parallel.DistributedDataParallel(Net(defect if rank == ODD else "none"))
            out["torch"][defect] = "no error"
        except RuntimeError as exc:
            out["torch"][defect] = str(exc).strip().splitlines()[0]
    return out


@pytest.fixture(scope="module")
def model_runs() -> dict[int, Any]:
    start = time.monotonic()
    results = remember(run_ranks(model_ranks, 3, timeout=120, start_method="forkserver",
                                 init=False))
    results[-1] = {"seconds": time.monotonic() - start}
    return results


@pytest.mark.parametrize("defect", MODEL_DEFECTS)
def test_model_difference_is_named_on_every_rank(defect: str, model_runs: dict[int, Any]
                                                 ) -> None:
    expected = EXPECTED_MODEL[defect]
    entries = [model_runs[r]["ddpviz"][defect] for r in range(3)]
    for entry in entries:
        assert entry["findings"] == expected
        assert entry["text"] == entries[0]["text"]  # the same message on every rank
        assert entry["seconds"] < 10
    text = entries[0]["text"]
    assert text.startswith("ddpviz: ")
    for _, name, _, _ in expected:
        if name not in ("parameters", "buffers"):
            assert f"'{name}'" in text
    if defect == "initial_values":
        assert all(e["ok"] for e in entries)  # a warning, not an error
        assert "manual_seed" in text
        assert all(e["preflight"].startswith("warned: ddpviz: 6 of 6 parameters have different "
                                             "values") for e in entries)
    else:
        assert not any(e["ok"] for e in entries)
        assert all(e["preflight"] == f"RankMismatchError: {text.splitlines()[0]}"
                   and e["preflight_findings"] == expected for e in entries)
    assert no_orphans([model_runs[r]["pid"] for r in range(3)])


@pytest.mark.parametrize("defect", sorted(TORCH_SHARED_BASELINE))
def test_torch_baseline_raises_the_same_everywhere_or_nothing(defect: str,
                                                             model_runs: dict[int, Any]) -> None:
    baseline = TORCH_SHARED_BASELINE[defect]
    assert model_runs[0]["torch"][defect] == baseline
    if baseline == "no error":
        assert all(model_runs[r]["torch"][defect] == "no error" for r in range(3))
    else:  # a count without names: torch never says which parameters differ
        assert all("weight" not in model_runs[r]["torch"][defect]
                   and "bias" not in model_runs[r]["torch"][defect] for r in range(3))


def torch_model_ranks(rank: int, world_size: int, defect: str) -> str:
    init(rank, world_size, PG_TIMEOUT)
    torch.manual_seed(0)
    model = Net(defect if rank == world_size - 1 else "none")
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp(torch.randn(2, 8)).sum().backward()
        return "no error"
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0]
    except ValueError as exc:
        return str(exc).strip().splitlines()[0]


@pytest.mark.parametrize("defect", sorted(TORCH_MODEL_BASELINE))
def test_torch_baseline_errors_on_one_rank_and_hangs_or_crashes_the_other(defect: str) -> None:
    results = run_ranks(torch_model_ranks, 2, defect, timeout=30, **FAST)
    rank0, rank1 = TORCH_MODEL_BASELINE[defect]
    assert any(text in outcome(results[0]) for text in rank0), outcome(results[0])
    assert rank1 in outcome(results[1]), outcome(results[1])


# --- runtime situations on stock torch DDP, through ddpviz.watch -----------------------------

HANG = 2.0  # ddpviz's hang_timeout in the runtime scenarios
GRACE = 6.0  # what a hang may take beyond HANG: the others' grace to report, polling, slack


def watch_ranks(rank: int, world_size: int, situation: str, use_ddpviz: bool,
                detail: str) -> dict[str, Any]:
    """One situation on torch's DDP, with ddpviz.watch attached at `detail` (use_ddpviz) or
    without (the baseline). The last rank is the odd one."""
    import ddpviz
    from tests.diagnose.scenario_models import Branchy

    init(rank, world_size, 60.0 if use_ddpviz else PG_TIMEOUT)
    odd = rank == world_size - 1
    torch.manual_seed(0)
    defect = {"unused": "unused", "order": "order"}.get(situation, "none")
    model = Branchy(defect if odd else "none")
    ddp = nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=situation == "unused_found", bucket_cap_mb=0.0003)
    if situation == "unused_found" and odd:
        model.defect = "unused"
    events: list[Any] = []
    w = ddpviz.watch(ddp, emitter=events.append, hang_timeout=HANG,
                     recording=recording(detail)) if use_ddpviz else None
    steps = 2 if situation == "uneven" and odd else 3
    out: dict[str, Any] = {"pid": os.getpid(), "error": "no error", "findings": []}
    start = time.monotonic()
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for step in range(steps):
                if situation.startswith("crash") and odd and step == int(situation[-1]):
                    os._exit(3)
                ddp(torch.randn(4, 8)).sum().backward()
    except RuntimeError as exc:
        out["error"] = str(exc).strip().splitlines()[0 if not use_ddpviz else -1]
        error = w.error if w is not None else None
        if error is None and isinstance(exc, ddpviz.DiagnosisError):
            error = exc
        if error is not None:
            out["error"] = str(error)
            out["findings"] = summary(getattr(error, "findings", ()))
    out["seconds"] = time.monotonic() - start
    if situation == "uneven" and odd:
        time.sleep(HANG + 3)  # alive but out of data: torch waits for it until its timeout
    out["events"] = events
    return out


def run_watch(situation: str, world_size: int, use_ddpviz: bool,
              detail: str = "sampled") -> dict[int, Any]:
    """The comm-hook level by default: these tests check what it raises (from backward)."""
    return remember(run_ranks(watch_ranks, world_size, situation, use_ddpviz, detail,
                              timeout=60, **FAST))


def test_watch_uneven_inputs_name_the_lagging_rank_on_every_waiting_rank() -> None:
    results = run_watch("uneven", 3, True)
    for r in (0, 1):
        assert results[r]["findings"] == [("rank_hang", "", (2,), "buffer broadcast")]
        assert results[r]["error"] == results[0]["error"]
        assert results[r]["seconds"] < HANG + GRACE
    lines = results[0]["error"].splitlines()
    assert lines[0] == ("ddpviz: rank 2 did not reach the buffer broadcast at step 2 within 2s "
                        "(world_size=3):")
    assert lines[3].startswith("  rank 2: last seen at step 1 (forward")
    assert results[2]["error"] == "no error"  # the lagging rank itself had nothing wrong
    assert no_orphans([results[r]["pid"] for r in range(3)])
    baseline = run_watch("uneven", 2, False)  # torch: a timeout naming no rank
    assert "Timed out waiting 4000ms" in outcome(baseline[0]["error"])
    assert baseline[1]["error"] == "no error"


def test_watch_light_uneven_inputs_name_the_lagging_rank_before_torchs_timeout() -> None:
    """watch's default level has no comm hook: rank 1, past the buffer broadcast (gloo's
    broadcast needs only the root), waits for rank 2 inside torch's C++ all-reduce. Its pulse
    thread names rank 2 and posts rank 1 as waiting there, so rank 0's verdict from the guarded
    broadcast names rank 2 alone; rank 1 then gets torch's own error when rank 0 exits."""
    results = run_watch("uneven", 3, True, detail="light")
    assert results[0]["findings"] == [("rank_hang", "", (2,), "buffer broadcast")]
    lines = results[0]["error"].splitlines()
    assert lines[0] == ("ddpviz: rank 2 did not reach the buffer broadcast at step 2 within 2s "
                        "(world_size=3):")
    assert lines[2].startswith("  rank 1: waiting in the all-reduce at step 2")
    assert results[0]["seconds"] < HANG + GRACE
    named = [e.finding for e in results[1]["events"] if type(e).__name__ == "FindingReported"]
    # its post (which rank 0's verdict shows) came with the live finding; the rank_hang one
    # follows at 2s unless rank 0, the store's host, has exited by then. Rank 2 left its loop
    # to sleep, so it may be named as having left it first: a warning, as it could come back.
    waiting = [f for f in named if f.kind != "uneven_iterations"]
    assert (waiting[0].kind, waiting[0].ranks, waiting[0].step) == ("rank_waiting", (2,), 2)
    assert {(f.ranks, f.step) for f in named} == {((2,), 2)}
    assert all((f.severity, f.field) == ("warning", "left_loop") for f in named
               if f.kind == "uneven_iterations")
    assert "ddpviz" not in results[1]["error"]  # torch's, once rank 0 stopped
    assert results[2]["error"] == "no error"
    assert no_orphans([results[r]["pid"] for r in range(3)])


@pytest.mark.parametrize("step", [1, 2])
def test_watch_crashed_rank_is_named_with_its_last_position(step: int) -> None:
    results = run_watch(f"crash@{step}", 3, True)
    assert outcome(results[2]) == "exit code 3"
    for r in (0, 1):
        assert results[r]["error"] == results[0]["error"]
        assert results[r]["seconds"] < HANG + GRACE
    if step == 1:  # before torch's (unguardable) bucket rebuild: ddpviz meets there first
        assert results[0]["findings"] == [("missing_rank", "", (2,), "arrival")]
        assert results[0]["error"].startswith(
            "ddpviz: rank 2 never reached the bucket rebuild at step 1 within 2s")
    else:
        assert results[0]["findings"] == [("rank_exited", "", (2,), "buffer broadcast")]
        assert "  rank 2: gone; last seen at step 1 (forward" in results[0]["error"]
    baseline = run_watch(f"crash@{step}", 2, False)
    assert any(t in baseline[0]["error"] for t in TRANSPORT), baseline[0]  # an address only


def test_watch_unused_parameter_on_one_rank_stops_every_rank_at_iteration_0() -> None:
    results = run_watch("unused", 2, True)
    expected = ("unused_parameter", "spare.weight", (1,), "unused")
    assert expected in results[0]["findings"] and expected in results[1]["findings"]
    assert results[0]["findings"][0][0] == "peer_failed"
    assert results[0]["seconds"] < GRACE  # rank 0 waited in iteration 0's all-reduce
    assert "step 0" in results[1]["error"].splitlines()[0]
    baseline = run_watch("unused", 2, False)
    assert "Expected to have finished reduction in the prior iteration" in \
        outcome(baseline[1]["error"])
    assert "spare" not in baseline[1]["error"]  # torch names parameters only with DEBUG=INFO


def test_watch_events_show_grad_order_and_unused_differences_torch_keeps_silent() -> None:
    import ddpviz

    order = run_watch("order", 2, True)
    findings = ddpviz.diagnose([e for r in (0, 1) for e in order[r]["events"]])
    (grad_order,) = [f for f in findings if f.kind == "grad_order"]
    assert (grad_order.ranks, grad_order.step, grad_order.name) == ((1,), 0, "spare.bias")
    assert grad_order.bucket >= 0
    unused = run_watch("unused_found", 2, True)
    findings = ddpviz.diagnose([e for r in (0, 1) for e in unused[r]["events"]])
    names = [(f.name, f.ranks, f.values) for f in findings if f.kind == "unused_parameter"]
    assert names[:2] == [("spare.weight", (1,), (("used", (0,)), ("unused", (1,)))),
                         ("spare.bias", (1,), (("used", (0,)), ("unused", (1,))))]
    baseline = [run_watch(s, 2, False) for s in ("order", "unused_found")]
    assert all(b[r]["error"] == "no error" for b in baseline for r in (0, 1))


# --- runtime situations on ddpviz's engine ----------------------------------------------------


def engine_ranks(rank: int, world_size: int, situation: str, use_ddpviz: bool
                 ) -> dict[str, Any]:
    """One runtime situation on ddpviz.DistributedDataParallel (use_ddpviz) or on torch's DDP
    (the baseline). The last rank is the odd one."""
    import ddpviz
    from tests.diagnose.scenario_models import Branchy

    init(rank, world_size, 60.0 if use_ddpviz else PG_TIMEOUT)
    odd = rank == world_size - 1
    torch.manual_seed(0)
    defect = {"graph_change": "graph_change" if odd else "graph_static"}.get(
        situation, situation if odd else "none")
    if situation == "nosync":  # no buffers: only the all-reduces pair up wrongly
        model: nn.Module = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    else:
        model = Branchy(defect if situation not in ("never", "uneven", "crash", "nosync",
                                                    "unused_found", "left") else "none")
    if situation == "unused_found" and odd:
        model.defect = "unused"  # type: ignore[assignment]
    events: list[Any] = []
    out: dict[str, Any] = {"pid": os.getpid(), "error": "no error", "findings": [],
                           "events": events}
    kwargs: dict[str, Any] = {"static_graph": situation == "graph_change",
                              "find_unused_parameters": situation == "unused_found"}
    if situation in ("order", "unused_found"):
        kwargs["bucket_cap_mb"] = 0.0003
    steps = 2 if situation in ("uneven", "left") and odd else 3
    # "left": the odd rank leaves after 2 steps for a barrier no other rank joins (on a side
    # group: a barrier on the DDP's group would pair up with its collectives)
    side = dist.new_group(timeout=datetime.timedelta(seconds=LEFT_HANG + 10)) \
        if situation == "left" else None
    start = time.monotonic()
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            if situation == "never" and odd:
                # stuck before DDP, arrives long after the others gave up
                time.sleep((HANG if use_ddpviz else PG_TIMEOUT) + 2)
            if use_ddpviz:
                ddp: nn.Module = ddpviz.DistributedDataParallel(
                    model, emitter=events.append,
                    hang_timeout=LEFT_HANG if situation == "left" else HANG, **kwargs)
            else:
                ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
            for step in range(steps):
                if situation == "crash" and odd and step == 2:
                    os._exit(3)
                x = torch.randn(4, 8)
                if situation == "nosync" and odd and step == 1:
                    with ddp.no_sync():  # type: ignore[operator]
                        ddp(x).sum().backward()
                    continue
                ddp(x).sum().backward()
            if side is not None and odd:
                with contextlib.suppress(RuntimeError):  # (the others exit: it fails then)
                    dist.barrier(group=side)
    except RuntimeError as exc:
        out["error"] = str(exc)
        out["type"] = type(exc).__name__
        out["findings"] = summary(getattr(exc, "findings", ()))
    out["seconds"] = time.monotonic() - start
    if side is not None and not odd:  # join the left rank's barrier, so that all can end
        with contextlib.suppress(RuntimeError):
            dist.barrier(group=side)
    if situation in ("uneven", "nosync") and odd:
        time.sleep(max(HANG, PG_TIMEOUT) + 2)  # alive, but done: the others wait for it
    if situation == "never" and not odd:
        time.sleep(3)  # rank 0 hosts the store: keep it up until the late rank has read it
    return out


def run_engine(situation: str, use_ddpviz: bool = True, world_size: int = 2) -> dict[int, Any]:
    return remember(run_ranks(engine_ranks, world_size, situation, use_ddpviz, timeout=60,
                              **FAST))


def test_rank_that_never_reaches_ddp_is_named_on_every_rank() -> None:
    results = run_engine("never", world_size=3)
    expected = [("missing_rank", "", (2,), "arrival")]
    for r in range(3):
        assert results[r]["findings"] == expected
        assert results[r]["error"] == results[0]["error"]  # the late rank too
    assert results[0]["error"].startswith(
        "ddpviz: rank 2 never reached DistributedDataParallel's constructor within 2s")
    assert results[0]["seconds"] < HANG + GRACE
    baseline = run_engine("never", False)  # torch: a send timeout that names no rank
    assert "Timed out waiting 4000ms" in baseline[0]["error"]


def test_unused_parameter_without_find_unused_fails_every_rank_at_iteration_0() -> None:
    results = run_engine("unused")
    expected = [("unused_parameter", "spare.weight", (1,), "unused"),
                ("unused_parameter", "spare.bias", (1,), "unused")]
    for r in (0, 1):
        assert results[r]["findings"] == expected
        assert results[r]["error"] == results[0]["error"]
    assert results[0]["error"].splitlines()[:3] == [
        "ddpviz: 2 of 8 parameters got no gradient on rank 1 at step 0 "
        "(find_unused_parameters=False, world_size=2):",
        "  parameter 4 'spare.weight' (8, 8): not used in forward on rank 1",
        "  parameter 5 'spare.bias' (8,): not used in forward on rank 1"]
    baseline = run_engine("unused", False)
    assert any(t in baseline[0]["error"] for t in TRANSPORT)  # rank 0 hung in iteration 0
    assert baseline[1]["error"].startswith("Expected to have finished reduction in the prior "
                                           "iteration")  # one iteration late, no names
    assert "spare" not in baseline[1]["error"]


def test_hook_firing_twice_is_named_and_the_other_rank_stops() -> None:
    results = run_engine("twice")
    twice = ("hook_fired_twice", "b.bias", (1,), "hook")
    assert twice in results[1]["findings"]
    assert results[0]["findings"][0][0] == "peer_failed" and twice in results[0]["findings"]
    assert results[0]["seconds"] < GRACE
    baseline = run_engine("twice", False)
    assert baseline[1]["error"].startswith("Expected to mark a variable ready only once.")
    assert any(t in baseline[0]["error"] for t in TRANSPORT)


def test_graph_change_under_static_graph_is_named() -> None:
    results = run_engine("graph_change")
    changed = ("graph_changed", "spare.bias", (1,), "static_graph")
    assert changed in results[1]["findings"]
    assert results[0]["findings"][0][0] == "peer_failed" and changed in results[0]["findings"]
    baseline = run_engine("graph_change", False)
    assert baseline[1]["error"].startswith("Your training graph has changed in this iteration")
    assert "spare" not in baseline[1]["error"]


def test_skipped_all_reduce_is_a_hang_at_the_end_and_a_collective_mismatch() -> None:
    import ddpviz

    results = run_engine("nosync")
    assert results[0]["findings"] == [("rank_hang", "2.bias", (1,), "all-reduce")]
    assert results[0]["seconds"] < HANG + GRACE
    findings = ddpviz.diagnose([e for r in (0, 1) for e in results[r]["events"]])
    mismatch = next(f for f in findings if f.kind == "collective_mismatch")
    assert (mismatch.step, mismatch.ranks) == (1, (1,))
    assert mismatch.values == (("bucket rebuild broadcast, all-reduce b0", (0,)),
                               ("bucket rebuild broadcast", (1,)))
    baseline = run_engine("nosync", False)
    assert "Timed out waiting 4000ms" in baseline[0]["error"]


LEFT_HANG = 30.0  # the hang timeout when a rank leaves: its verdict must come well before


def test_engine_names_a_rank_that_left_the_loop_before_the_hang_timeout() -> None:
    results = run_engine("left", world_size=3)
    for r in (0, 1):
        assert results[r]["type"] == "RankHangError"
        assert results[r]["findings"] == [("uneven_iterations", "", (2,), "left_loop")]
        assert results[r]["error"] == results[0]["error"]  # one verdict, every waiting rank
        assert results[r]["seconds"] < LEFT_HANG  # (not the hang timeout's verdict)
    first = results[0]["error"].splitlines()[0]
    assert first.startswith("ddpviz: rank 2 left the training loop after 2 steps while rank ")
    assert "blocked in torch.distributed's barrier" in first
    assert "  rank 2: ran 2 steps (0-1), then left the loop at tests/diagnose/test_scenarios.py:" \
        in results[0]["error"]


@pytest.mark.parametrize("situation", ["uneven", "crash"])
def test_engine_names_a_lagging_or_crashed_rank(situation: str) -> None:
    results = run_engine(situation)
    kind = {"uneven": "rank_hang", "crash": "rank_exited"}[situation]
    assert [f[:3] for f in results[0]["findings"]] == [(kind, "", (1,))]
    assert results[0]["seconds"] < HANG + GRACE
    assert "rank 1: " in results[0]["error"] and "step 1 (forward" in results[0]["error"]
    if situation == "uneven":  # where it is in code: asleep after its loop
        assert "rank 1 is at tests/diagnose/test_scenarios.py:" in results[0]["error"]
        assert "time.sleep(max(HANG, PG_TIMEOUT) + 2)" in results[0]["error"]
    baseline = run_engine(situation, False)
    assert "rank 1" not in baseline[0]["error"]


def test_runs_that_finish_still_show_order_unused_and_reassigned_buffers() -> None:
    import ddpviz

    events = []
    for situation in ("order", "unused_found", "reassign"):
        results = run_engine(situation)
        assert all(results[r]["error"] == "no error" for r in (0, 1))
        events += [e for r in (0, 1) for e in results[r]["events"]]
        baseline = run_engine(situation, False)  # torch: silent
        assert all(baseline[r]["error"] == "no error" for r in (0, 1))
    found = {(f.kind, f.name, f.ranks) for f in ddpviz.diagnose(events)}
    assert ("grad_order", "spare.bias", (1,)) in found
    assert ("unused_parameter", "spare.weight", (1,)) in found
    assert ("buffer_reassigned", "stats", (1,)) in found


def test_a_follow_up_run_works_and_nothing_is_left_behind() -> None:
    results = run_ranks(_follow_up, 2, timeout=30, start_method="forkserver")
    assert results == {0: 2.0, 1: 2.0}
    assert len(PIDS) > 20 and no_orphans(PIDS)  # every rank of every scenario above is gone


def _follow_up(rank: int, world_size: int) -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())
