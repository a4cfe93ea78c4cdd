"""The browser's Chrome/Perfetto export (extension/src/chromeTrace.ts, what "Open in Perfetto"
hands over) is record for record Python's (`Trace.to_chrome_trace`) for the same `.ddpviz`
file: the columnar tests' runs (every kind of defect, a hang, clock offsets), hand-made steps
the hook-less watch records, and real 2-rank gloo runs of torch's DDP under watch() at the
default and at a sampled recording (optimizer steps, per-bucket summaries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ddpviz import events as ev
from ddpviz.traces.trace import Trace
from tests.diagnose.random_runs import random_run
from tests.dist.harness import run_ranks
from tests.extension.mirror import run_typescript
from tests.model.test_spans import _unsampled
from tests.transport.fake_run import rank_events

_EXPORT = ("cases.map(p => g.chromeTrace(load('./trace').parseTrace("
           "new Uint8Array(fs.readFileSync(p)), p)))")


def as_json_reads(value: Any) -> Any:
    """`value` as a JSON reader that keeps numbers as doubles (the browser, Perfetto) has it:
    an integer beyond 2**53 (torch's "no cap" bucket limit, 2**63 - 1) is its nearest double."""
    if isinstance(value, dict):
        return {k: as_json_reads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json_reads(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return float(value)
    return value


def _real_rank(rank: int, world_size: int) -> list[list[ev.Event]]:
    import ddpviz

    out = []
    for recording in ("every=100", "guard,every=3"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        events: list[ev.Event] = []
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0005)
        watch = ddpviz.watch(ddp, emitter=events.append,
                             recording=ddpviz.Recording.parse(recording))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(rank))
        for _ in range(5):
            ddp(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        watch.close()
        out.append(events)
    return out


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    out = [Trace([*rank_events(0), *rank_events(1, hang_in_step=2)],
                 clock={1: (-5, 3)}, meta={"job": "fake <run>", "n": 2})]
    out += [Trace(random_run(seed), clock={0: (1_000, 10), 2: (-2_000, -1)})
            for seed in range(25)]
    out += [Trace([*_unsampled(0, 3), *_unsampled(1, 3, t0=1_300)]),
            Trace([ev.ForwardStarted(0, 0, 1_000, 0),
                   ev.BackwardComputed(0, 0, 1_600, 1, param=0, first_t_ns=0)])]
    ranks = run_ranks(_real_rank, 2)
    for i in range(2):
        out.append(Trace([e for r in (0, 1) for e in ranks[r][i]], meta={"recording": i}))
    return out


def test_the_browsers_chrome_export_is_pythons(traces: list[Trace], tmp_path: Path) -> None:
    paths = [str(t.save(tmp_path / f"{i}.ddpviz")) for i, t in enumerate(traces)]
    got = run_typescript("chromeTrace", _EXPORT, paths)
    kinds: set[str] = set()
    for path, doc in zip(paths, got, strict=True):
        expected = as_json_reads(json.loads(json.dumps(Trace.load(path).to_chrome_trace())))
        doc = as_json_reads(doc)
        assert doc["traceEvents"] == expected["traceEvents"], path
        assert doc == expected, path
        kinds |= {e.get("cat", "") + ":" + e["name"].split(" ")[0] for e in doc["traceEvents"]}
        kinds |= {"unfinished" for e in doc["traceEvents"] if e.get("args", {}).get("unfinished")}
    # what the cases cover (a case list that shrank would pass without comparing these)
    assert {"phase:forward", "phase:backward", "phase:optimizer", "allreduce:all-reduce",
            "broadcast:broadcast", "gradients:gradients", "hook:grad", "event:BackwardComputed",
            "event:BucketReady", "event:FindingReported", "phase:verify", "unfinished"} <= kinds

