"""Each bucket's flat buffer before and after its all-reduce, on real gloo ranks (what
notebooks/07_debugger.ipynb teaches): at the break before bucket k the buffer on each rank is
that rank's local gradients of bucket k, concatenated in bucket order and multiplied by
1/world_size (DDP averages before its SUM all-reduce); at the break after the backward every
bucket's buffer is, on every rank, torch's DDP's averaged gradients of the same run, bitwise; a
bucket whose all-reduce was launched is refused while it may be in flight; and the run, resumed,
ends bitwise as an unpaused torch DDP run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import ddpviz
from ddpviz.debugger.client import DebuggerError
from tests.debugger import buffer_fns
from tests.debugger.buffer_fns import STEP

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = 4
N_PARAMS = 6  # a bucket holds at least one parameter: at most this many buckets


def _reference(tmp: Path, nprocs: int) -> list[dict[str, Any]]:
    tmp.mkdir(parents=True, exist_ok=True)
    run = ddpviz.launch(buffer_fns.train, nprocs, args=("torch", STEPS, str(tmp)), timeout=240)
    run.wait(timeout=240)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(nprocs)]


def _tensor(hexed: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(hexed)), dtype=torch.float32)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(("kind", "nprocs"), [("twin", 2), ("guard", 3)])
def test_each_bucket_before_and_after_its_all_reduce(kind: str, nprocs: int,
                                                      tmp_path: Path) -> None:
    ref = _reference(tmp_path / "ref", nprocs)
    out = tmp_path / "run"
    out.mkdir()
    run = ddpviz.launch(buffer_fns.train, nprocs, args=(kind, STEPS, str(out)),
                        debug="paused", timeout=240)
    try:
        dbg = run.debugger
        start = dbg.wait(timeout=120)  # debug="paused": every rank before its first forward
        assert start.agreed and (start.step, start.point) == (0, "forward")
        assert {s.reason for s in start.ranks.values()} == {"start paused"}
        for k in range(N_PARAMS):  # a break at a bucket the step does not have never fires
            dbg.break_at(STEP, bucket=k)
        dbg.break_at(STEP, where="after_backward")
        dbg.resume(timeout=60)
        before: dict[int, dict[int, torch.Tensor]] = {}  # bucket -> rank -> its buffer
        members: dict[int, tuple[str, ...]] = {}
        stop = dbg.wait(timeout=120)
        while stop.point == "bucket":
            k = stop.bucket
            assert stop.agreed and stop.step == STEP and k == len(before), stop
            assert stop.params, "the bucket's parameters by name"
            members[k] = stop.params
            before[k] = dbg.fetch("", "bucket_buffer", bucket=k, timeout=60)
            if k > 0:  # the previous bucket's all-reduce was launched: not read in flight
                busy = dbg.inspect_bucket(k - 1, timeout=60)
                assert sorted(busy.errors) == list(range(nprocs)) and not busy.all_equal
                assert all("may still be running" in why for why in busy.errors.values())
                with pytest.raises(DebuggerError, match="may still be running"):
                    dbg.fetch("", "bucket_buffer", bucket=k - 1, timeout=60)
            dbg.resume(timeout=60)
            stop = dbg.wait(timeout=120)
        assert stop.agreed and (stop.step, stop.point) == (STEP, "after_backward")
        assert len(before) >= 2  # several buckets
        after = {k: dbg.fetch("", "bucket_buffer", bucket=k, timeout=60) for k in before}
        values = dbg.inspect_bucket(0, timeout=60)
        assert values.all_equal  # summarised on the ranks: bitwise equal everywhere
        dbg.clear()
        dbg.resume(timeout=60)
        final = run.wait(timeout=240)
    finally:
        if not run.done():
            run.stop()
    seen = [n for k in sorted(members) for n in members[k]]
    assert sorted(seen) == sorted(ref[0]["local"])  # every parameter in exactly one bucket
    for k, names in members.items():
        averaged = torch.cat([_tensor(ref[0]["averaged"][n]) for n in names])
        for r in range(nprocs):
            local = torch.cat([_tensor(ref[r]["local"][n]) for n in names])
            # before: this rank's own gradients, scaled as torch scales them before its SUM
            assert _bits(before[k][r]) == _bits(torch.mul(local, 1.0 / nprocs)), (k, r)
            # after: torch DDP's averaged gradients, on every rank
            assert _bits(after[k][r]) == _bits(averaged), (k, r)
        assert len({_bits(before[k][r]) for r in range(nprocs)}) == nprocs  # ranks differ
    # stopped at every bucket and after the backward, fetched, resumed: as never paused
    assert final == [ref[r]["final"] for r in range(nprocs)]
