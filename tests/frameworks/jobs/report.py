"""What every framework job writes at its end (no ddpviz import: the jobs are unmodified
framework scripts): per rank, $FW_OUT/rank{R}.json with a digest of the raw bytes of the final
parameters and the parameter names, as DDP's module holds them and as the user's model does.

Environment knobs shared by the jobs: FW_OUT (required), FW_STEPS (default 3).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn


def steps() -> int:
    return int(os.environ.get("FW_STEPS", "3"))


def digest(params: Iterable[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write(rank: int, *, model: nn.Module, ddp_module: nn.Module | None,
          step_s: list[float] | None = None, **extra: object) -> None:
    """`model`: the user's model (its dotted names are what the user knows); `ddp_module`:
    the module torch's DDP wraps (the framework may wrap the user's model in its own)."""
    wrapped = ddp_module if ddp_module is not None else model
    record = {
        "digest": digest(p for _, p in wrapped.named_parameters()),
        "ddp_names": [n for n, p in wrapped.named_parameters() if p.requires_grad],
        "model_names": [n for n, p in model.named_parameters() if p.requires_grad],
        "step_s": step_s or [],
        **extra,
    }
    out = Path(os.environ["FW_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank{rank}.json"
    tmp.write_text(json.dumps(record))
    tmp.replace(out / f"rank{rank}.json")


class StepClock:
    """Wall time of each training step, and the training thread's own CPU time in it (which
    waiting for a core or for a peer does not count), measured inside the job (benchmarks).

    With FW_TOGGLE=K (benchmarks/bench_frameworks.py --in-process), the clock also watches the
    job's DDP with `ddpviz.watch()` in every other block of K steps from step FW_TOGGLE_FROM
    on (closing the watch in between), and notes which steps were watched: an A/B inside one
    job, so that launches and other processes' load do not weigh on the ratio."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.watched: list[bool] = []
        self._t = self._c = 0.0
        self._toggle = int(os.environ.get("FW_TOGGLE", "0"))
        self._from = int(os.environ.get("FW_TOGGLE_FROM", "5"))
        self._watch: object | None = None

    def start(self, ddp: nn.Module | None = None) -> None:
        if self._toggle and ddp is not None:
            block = (len(self.times) - self._from) // self._toggle
            want = block >= 0 and block % 2 == 1
            if want and self._watch is None:
                import ddpviz  # only in the benchmark's mode: the jobs never import ddpviz

                self._watch = ddpviz.watch(ddp)
            elif not want and self._watch is not None:
                self._watch.close()  # type: ignore[attr-defined]
                self._watch = None
            self.watched.append(want)
        self._t, self._c = time.perf_counter(), time.thread_time()

    def stop(self) -> None:
        self.times.append(time.perf_counter() - self._t)
        self.cpu.append(time.thread_time() - self._c)
