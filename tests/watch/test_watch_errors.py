"""Under ddpviz.watch(), a diagnosis made while torch's C++ reducer waits on watch's comm hook
reaches the caller of backward() as ddpviz's own exception (type and text), not as torch's
"Unable to cast ... to Tensor" or "Got the following error when running the callback".

Real gloo ranks; the last rank is the odd one: it skips a parameter (unused) or arrives late to
backward (hang). Both detail levels.
"""

from __future__ import annotations

import datetime
import time
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist.harness import run_ranks
from tests.recordings import recording

pytestmark = pytest.mark.dist

HANG = 2.0  # ddpviz's hang_timeout here
FAST: dict[str, Any] = {"start_method": "forkserver", "init": False, "allow_failures": True}


def error_ranks(rank: int, world_size: int, situation: str, detail: str) -> dict[str, Any]:
    import ddpviz
    from tests.diagnose.scenario_models import Branchy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    odd = rank == world_size - 1
    torch.manual_seed(0)
    model = Branchy("unused" if situation == "unused" and odd else "none")
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0003)
    w = ddpviz.watch(ddp, emitter=lambda e: None, hang_timeout=HANG,
                     recording=recording(detail))
    out: dict[str, Any] = {"type": None, "text": "", "same_as_watch_error": False}
    start = time.monotonic()
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for step in range(3):
                loss = ddp(torch.randn(4, 8)).sum()
                if situation == "late" and odd and step == 1:
                    time.sleep(HANG + 4)  # alive, but late to this backward's all-reduce
                    break  # (then gone: the others have stopped, and rank 0 hosts the store)
                loss.backward()
    except RuntimeError as exc:
        out["type"] = type(exc).__name__
        out["is_rank_hang_error"] = isinstance(exc, ddpviz.RankHangError)
        out["text"] = str(exc)
        out["same_as_watch_error"] = exc is w.error
        out["findings"] = [f.kind for f in getattr(exc, "findings", ())]
    out["seconds"] = time.monotonic() - start
    w.close()
    return out


@pytest.mark.parametrize("detail", ["params", "buckets"])
def test_a_hang_in_the_bucket_all_reduce_raises_rank_hang_error_from_backward(detail: str
                                                                            ) -> None:
    results = run_ranks(error_ranks, 3, "late", detail, timeout=90, **FAST)
    for r in (0, 1):
        res = results[r]
        assert res["type"] == "RankHangError" and res["is_rank_hang_error"], res
        assert res["same_as_watch_error"], res
        assert res["text"].startswith("ddpviz: rank 2 did not reach the all-reduce of bucket"), \
            res["text"]
        assert "Unable to cast" not in res["text"] and "callback" not in res["text"]
        assert res["findings"] == ["rank_hang"]
        assert res["seconds"] < HANG + 4 + 1  # named before the late rank came back
    assert results[0]["text"] == results[1]["text"]


def test_an_unused_parameter_on_one_rank_raises_ddpviz_errors_on_every_rank() -> None:
    results = run_ranks(error_ranks, 2, "unused", "params", timeout=90, **FAST)
    waiting = results[0]  # it used every parameter: it waited in the spare's all-reduce
    assert waiting["type"] == "RankHangError" and waiting["same_as_watch_error"], waiting
    assert waiting["text"].startswith("ddpviz:") and "Unable to cast" not in waiting["text"]
    assert waiting["findings"][0] == "peer_failed"
    assert "'spare.weight'" in waiting["text"]
    odd = results[1]  # it skipped the parameter: its next forward raises what it is
    assert odd["type"] == "UnusedParametersError" and odd["text"].startswith("ddpviz: 2 of 8 "
                                                                     "parameters"), odd
