"""Post-mortems of real 2-rank gloo jobs whose own collectives go wrong
(tests/postmortem/collective_jobs.py): the finding names the ranks, the op and each rank's call
site (function and line, read from the job's source) from the Flight Recorder dumps alone,
with the model and without it; DDP's collectives keep their bucket names; a healthy job with
collectives of its own every step reports nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz.findings import fix_for
from tests.postmortem.collective_jobs import (
    FAULT_STEP,
    average_loss,
    collective_line,
    debug_print,
    log_metrics,
    run_job,
    save_checkpoint,
)
from tests.postmortem.jobs import SMALL_CAP_MB, make_model

pytestmark = pytest.mark.dist


def _both(folder: Path) -> list[ddpviz.PostMortem]:
    """The post-mortem with the model (DDP's collectives in bucket terms) and without."""
    with_model = ddpviz.postmortem(folder, make_model(), settings={"bucket_cap_mb": SMALL_CAP_MB})
    return [with_model, ddpviz.postmortem(folder)]


def _only(pm: ddpviz.PostMortem) -> ddpviz.Finding:
    assert [f.kind for f in pm.findings] == ["collective_mismatch"], str(pm)
    return pm.findings[0]


def _value(f: ddpviz.Finding, rank: int) -> str:
    return next(v for v, ranks in f.values if rank in ranks)


def _at(function: Callable[..., Any]) -> str:
    """How a value line ends for a collective of `function`: 'collective_jobs.py:LINE in NAME'."""
    file, line = collective_line(function)
    return f"{os.path.basename(file)}:{line} in {function.__name__}"


def _seq_of(pm: ddpviz.PostMortem, rank: int, function: Callable[..., Any]) -> list[int]:
    """The sequence ids of the rank's collectives launched from `function`'s collective."""
    file, line = collective_line(function)
    return [r["seq"] for r in pm.to_records() if r["rank"] == rank
            and r["call_site"].endswith(f"{os.path.basename(file)}:{line} in {function.__name__}")]


def test_a_barrier_only_rank_0_enters(tmp_path: Path) -> None:
    run_job("barrier", tmp_path)
    for pm in _both(tmp_path):
        f = _only(pm)
        assert f.field == "op" and f.ranks == (0,)
        assert _value(f, 0).startswith("barrier at ") and _value(f, 0).endswith(
            _at(save_checkpoint))
        # rank 1 went on into the next step: DDP's buffer broadcast, waiting with the barrier
        other = _value(f, 1)
        assert other.startswith("broadcast [")
        if pm.plan is not None:
            floats = sum(b.numel() for b in make_model().buffers() if b.is_floating_point())
            assert other.endswith(f"= the buffer broadcast of step {FAULT_STEP} (broadcast of "
                                  f"{floats} float32)")
        else:
            assert other.endswith(", DDP's")
        assert _seq_of(pm, 0, save_checkpoint) == [int(f.title.split("#")[1].split()[0])]
        assert not _seq_of(pm, 1, save_checkpoint)
        assert f.fix == fix_for("collective_mismatch", "extra")
        assert any("a collective only some ranks issue" in d for d in f.detail)
        assert "ranks 0,1 wait in it" in f.detail


def test_an_all_reduce_only_rank_1_issues(tmp_path: Path) -> None:
    run_job("debug_print", tmp_path)
    for pm in _both(tmp_path):
        f = _only(pm)
        assert f.field == "op" and f.ranks == (1,)
        assert _value(f, 1) == f"all_reduce [1] float32 at {_site(pm, 1, debug_print)}"
        assert _value(f, 0) == f"all_gather [3] float32 at {_site(pm, 0, log_metrics)}"
        assert _value(f, 1).endswith(_at(debug_print))
        assert _value(f, 0).endswith(_at(log_metrics))
        seq = int(f.title.split("#")[1].split()[0])
        assert _seq_of(pm, 1, debug_print) == [seq] and seq in _seq_of(pm, 0, log_metrics)
        assert f.fix == fix_for("collective_mismatch", "extra")
        # the job's own collectives, listed by call site: debug_print's on rank 1 only
        sites = {(j["function"], j["op"]): j for j in pm.job_collectives()}
        assert sites[("debug_print", "all_reduce")]["ranks"] == [1]
        assert sites[("debug_print", "all_reduce")]["line"] == collective_line(debug_print)[1]
        assert sites[("log_metrics", "all_gather")]["ranks"] == [0, 1]
        assert _at(debug_print) in str(pm)


def test_all_gather_sizes_differ_in_log_metrics(tmp_path: Path) -> None:
    run_job("metrics", tmp_path)
    for pm in _both(tmp_path):
        f = _only(pm)
        assert f.field == "size" and f.ranks == (0, 1)
        assert _value(f, 0).startswith("all_gather [3] float32 at ")
        assert _value(f, 1).startswith("all_gather [4] float32 at ")
        assert _value(f, 0).endswith(_at(log_metrics)) and _value(f, 1).endswith(
            _at(log_metrics))
        assert f.fix == fix_for("collective_mismatch", "same_site")
        assert any(d.startswith("rank 0 waits in it") for d in f.detail)  # rank 0 dumped
        # while it waited; gloo then aborted it


def test_a_healthy_job_with_its_own_collectives_reports_nothing(tmp_path: Path) -> None:
    run_job("healthy", tmp_path)
    checkpoints = 1 + sum(step % 2 == 1 for step in range(FAULT_STEP))
    expected = {("log_metrics", "all_gather", collective_line(log_metrics)[1], FAULT_STEP),
                ("average_loss", "all_reduce", collective_line(average_loss)[1], FAULT_STEP),
                ("save_checkpoint", "barrier", collective_line(save_checkpoint)[1],
                 checkpoints)}
    for pm in _both(tmp_path):
        assert not pm.findings, str(pm)
        assert str(pm).startswith("ddpviz: no problems found (world_size=2).")
        jobs = pm.job_collectives()
        assert {(j["function"], j["op"], j["line"], j["count"] // 2) for j in jobs} == expected
        assert all(j["ranks"] == [0, 1] and j["count"] % 2 == 0 for j in jobs)
        rows = pm.to_records()
        assert {r["origin"] for r in rows} == {"ddp", "job"}  # every entry has a stack
        if pm.plan is not None:  # DDP's are named in bucket terms, the job's are not DDP's
            assert {r["ddp_phase"] for r in rows if r["origin"] == "ddp"} == {
                "verify", "state_broadcast", "buffer_broadcast", "rebuild", "bucket"}
            assert {r["ddp_phase"] for r in rows if r["origin"] == "job"} == {"not DDP's"}


def _site(pm: ddpviz.PostMortem, rank: int, function: Callable[..., Any]) -> str:
    """The call site text the records give for the rank's collective in `function`."""
    file, line = collective_line(function)
    return next(r["call_site"] for r in pm.to_records() if r["rank"] == rank
                and r["call_site"].endswith(f"{os.path.basename(file)}:{line} in "
                                            f"{function.__name__}"))
