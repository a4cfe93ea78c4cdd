"""The hang deadline follows the process group's timeout (0.6 x, at most 300 s), so a missing
or lagging rank is named before torch's own timeout fires; explicit values still win, and a
live rank_waiting finding comes before the deadline."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddpviz.probes.watchdog import (
    DEFAULT_HANG_TIMEOUT,
    default_hang_timeout,
    process_group_timeout,
    resolve_hang_timeout,
)
from tests.dist.harness import RankFailed, run_ranks
from tests.recordings import recording

pytestmark = pytest.mark.dist

PG_TIMEOUT = 8.0  # the process group's timeout in these jobs
FAST: dict[str, Any] = {"start_method": "forkserver", "init": False, "allow_failures": True}


def init(rank: int, world_size: int, seconds: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=seconds))


def deadlines(rank: int, world_size: int) -> dict[str, Any]:
    import os

    init(rank, world_size, 20.0)
    sub = dist.new_group(list(range(world_size)), timeout=datetime.timedelta(seconds=5))
    out = {"world": process_group_timeout(), "sub": process_group_timeout(sub),
           "default_world": default_hang_timeout(), "default_sub": default_hang_timeout(sub),
           "resolved_sub": resolve_hang_timeout(None, sub),
           "explicit": resolve_hang_timeout(7, sub),
           "off": resolve_hang_timeout(0, sub)}
    os.environ["DDPVIZ_HANG_TIMEOUT"] = "2.5"
    out["env"] = resolve_hang_timeout(None, sub)
    return out


def test_default_deadline_is_derived_from_each_groups_timeout() -> None:
    results = run_ranks(deadlines, 2, timeout=60, **FAST)
    for r in (0, 1):
        assert results[r] == {"world": 20.0, "sub": 5.0, "default_world": 12.0,
                              "default_sub": 3.0, "resolved_sub": 3.0, "explicit": 7.0,
                              "off": None, "env": 2.5}


def test_without_a_process_group_the_default_stays_300s() -> None:
    assert not dist.is_initialized()
    assert process_group_timeout() is None
    assert default_hang_timeout() == DEFAULT_HANG_TIMEOUT == 300.0


def never_ranks(rank: int, world_size: int, kind: str) -> dict[str, Any]:
    """The last rank never reaches DDP (it sleeps past the group's timeout); the others build
    ddpviz's DDP, or torch's DDP with watch() at `kind`'s level ("watch-sampled", or
    "watch-light", watch's default) and then wait in step 0's all-reduce."""
    import ddpviz

    init(rank, world_size, PG_TIMEOUT)
    odd = rank == world_size - 1
    events: list[tuple[float, Any]] = []

    def emit(event: Any) -> None:
        events.append((time.monotonic(), event))

    out: dict[str, Any] = {"error": "no error"}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    start = time.monotonic()  # gloo's timeout counts from the collective that waits:
    try:  # the constructor's for ddpviz's DDP, step 0's all-reduce for a watch
        if kind == "engine":
            if odd:
                time.sleep(PG_TIMEOUT + 4)
                return out
            ddpviz.DistributedDataParallel(model, emitter=emit)
        else:
            ddp = nn.parallel.DistributedDataParallel(model)
            w = ddpviz.watch(ddp, emitter=emit, recording=recording(kind.removeprefix("watch-")))
            if odd:
                time.sleep(PG_TIMEOUT + 4)  # stuck outside DDP: never reaches the backward
                return out
            start = time.monotonic()  # (DDP's constructor and watch's attach are done)
            try:
                ddp(torch.randn(4, 8)).sum().backward()
            finally:
                out["watch_error"] = str(w.error) if w.error is not None else None
    except RuntimeError as exc:
        out["error"] = str(exc)
    out["seconds"] = time.monotonic() - start
    out["findings"] = [(t - start, e.finding.kind, e.finding.ranks, e.finding.text())
                       for t, e in events if type(e).__name__ == "FindingReported"]
    return out


@pytest.mark.parametrize("kind", ["engine", "watch-sampled", "watch-light"])
def test_missing_rank_is_named_before_the_process_groups_timeout(kind: str) -> None:
    results = run_ranks(never_ranks, 3, kind, timeout=90, **FAST)
    for r in (0, 1):
        out = results[r]
        assert not isinstance(out, RankFailed), out
        if kind == "watch-light":
            # no comm hook: torch's reducer waits in C++ and raises its own error at the
            # group's timeout; the pulse thread named rank 2 before that (quiet.py)
            assert "ddpviz" not in out["error"] and out["seconds"] >= PG_TIMEOUT, out
            verdict = next(f for f in out["findings"] if f[1] == "rank_hang")
            assert verdict[0] < PG_TIMEOUT and verdict[2] == (2,), verdict
            error = verdict[3]
        else:
            error = out.get("watch_error") or out["error"]
            assert out["seconds"] < PG_TIMEOUT, out  # named before gloo's own timeout
        assert "ddpviz: rank 2 " in error, error
        assert "4.8s" in error  # 0.6 x 8 s, not 300 s
        kinds = [k for _, k, _, _ in out["findings"]]
        assert kinds[0] == "rank_waiting", kinds
        waited_at, _, waiting_for, _ = out["findings"][0]
        assert 2 in waiting_for
        verdict_at = next(t for t, k, _, _ in out["findings"] if k != "rank_waiting")
        assert waited_at < verdict_at
