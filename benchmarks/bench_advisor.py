"""Is the bucket advisor right? Record one run, ask for advice, run the candidates, compare.

Per world size (2 and 4 gloo ranks on CPU) and model (many small layers, a few large ones,
mixed fp32/bf16): the ranks build ddpviz DDPs for torch's default setting and for up to
--most of the advisor's default candidates whose bucket maps differ (the planner's maps), and
train them in rotated blocks of steps (a block's time over its steps is one sample: a step is
forward to next forward, as the advisor counts it). The default setting's DDP is the recorded
run: its events, recorded during its own blocks, are all the advisor sees; it predicts every
candidate from them and recommends one. Printed: per candidate the predicted and measured
median step time; per (world, model) the median relative error, Spearman's rank correlation
between predicted and measured step times, and the measured step of the recommended setting
over the best measured one. Traces and times are saved in --out; --analyze re-reads them.

    PYTHONPATH=. python benchmarks/bench_advisor.py [--worlds 2,4] [--most 8]
        [--reps 6] [--block 4] [--out DIR] [--analyze] [--verbose]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _ranks import run_ranks

BATCH = 32
MIN_SETTINGS = 7  # the default and at least 6 candidates


class Mixed(nn.Module):
    """fp32 and bf16 layers alternating: each dtype gets its own buckets."""

    def __init__(self, width: int = 384, depth: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(width, width).to(torch.bfloat16 if k % 2 else torch.float32)
            for k in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x.to(layer.weight.dtype)))
        return x.float()


MODELS: dict[str, tuple[Any, int]] = {  # name -> (factory, input width)
    "many small layers (48 x 128x128)": (
        lambda: nn.Sequential(*[m for _ in range(48) for m in (nn.Linear(128, 128), nn.ReLU())]),
        128),
    "a few large layers (3 x 1024x1024)": (
        lambda: nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                              nn.ReLU(), nn.Linear(1024, 1024)), 1024),
    "mixed fp32/bf16 (8 x 384x384)": (lambda: Mixed(), 384),
}


def _build(name: str, settings: dict[str, Any], emitter: Any = None) -> Any:
    import ddpviz

    torch.manual_seed(0)
    factory, _ = MODELS[name]
    env_before = os.environ.get("DDP_SET_LAST_BUCKET_CAP")
    os.environ["DDP_SET_LAST_BUCKET_CAP"] = "1" if settings.get("set_last_bucket_cap") else "0"
    try:
        cap_list = settings.get("bucket_cap_mb_list")
        return ddpviz.DistributedDataParallel(
            factory(), bucket_cap_mb=settings.get("bucket_cap_mb"),
            bucket_cap_mb_list=list(cap_list) if cap_list else None, emitter=emitter,
            hang_timeout=0, recording=ddpviz.Recording(every=1))  # every step's gradient times
    finally:
        if env_before is None:
            os.environ.pop("DDP_SET_LAST_BUCKET_CAP", None)
        else:
            os.environ["DDP_SET_LAST_BUCKET_CAP"] = env_before


def _step(ddp: Any, opt: Any, x: torch.Tensor) -> None:
    loss = ddp(x).float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _picks(name: str, x: torch.Tensor, most: int) -> list[dict[str, Any]]:
    """torch's default setting first, then up to `most` default candidates of the advisor with
    bucket maps distinct from it and each other (the planner's maps), spread over the number of
    buckets. Every rank computes the same list."""
    from ddpviz.advisor.candidates import Candidate, default_candidates
    from ddpviz.plan import bucket_plan

    torch.manual_seed(0)
    base = bucket_plan(MODELS[name][0](), example_inputs=x)

    def steady(c: Candidate) -> tuple[tuple[int, ...], ...]:
        plan = base.with_settings(bucket_cap_mb=c.bucket_cap_mb,
                                  bucket_cap_mb_list=c.bucket_cap_mb_list,
                                  set_last_bucket_cap=c.set_last_bucket_cap)
        return tuple(b.param_indices for b in (plan.rebuilt or plan.initial))

    current = Candidate("torch's default", family="current")
    seen = {steady(current)}
    distinct, same = [], []
    for c in default_candidates(base.params, base.grad_ready_order):
        key = steady(c)
        (same if key in seen else distinct).append((len(key), c))
        seen.add(key)
    distinct.sort(key=lambda kc: kc[0])
    if len(distinct) > most:
        distinct = [distinct[round(k * (len(distinct) - 1) / (most - 1))] for k in range(most)]
    # too few distinct maps (a model of a few large layers): settings that build a map
    # already in the list make up the number (they also show the measurement's noise)
    distinct += same[:max(0, MIN_SETTINGS - 1 - len(distinct))]
    # an A/A copy of the default: the same map measured apart shows the noise floor
    distinct.append((0, Candidate("default again (A/A copy)", family="default")))
    return [{"candidate": c.label, "bucket_cap_mb": c.bucket_cap_mb,
             "bucket_cap_mb_list": list(c.bucket_cap_mb_list) if c.bucket_cap_mb_list else None,
             "set_last_bucket_cap": c.set_last_bucket_cap, "current": c is current}
            for c in [current] + [c for _, c in distinct]]


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    import ddpviz

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    results = []
    for name, (_, width) in MODELS.items():
        torch.manual_seed(rank)
        x = torch.randn(BATCH, width)
        picks = _picks(name, x, args.most)
        # The recorded run is the current setting's DDP, recorded while it takes its turns in
        # the rotation below (so it sees the same machine as the candidates); every DDP emits
        # events (the others into a list that is dropped), so all pay the same taps.
        recorded: list[Any] = []
        models = []
        for k, p in enumerate(picks):
            sink: list[Any] = []
            m = _build(name, p, recorded.append if k == 0 else sink.append)
            models.append((m, torch.optim.SGD(m.parameters(), lr=1e-4), sink))
            for _ in range(2):  # the rebuild
                _step(m, models[-1][1], x)
        measured = ddpviz.advisor.measure(
            dtypes=("float32", "bfloat16"), repeats=10)
        times: list[list[float]] = [[] for _ in picks]
        block_last: list[int] = []  # the recorded DDP's steps that end a block
        steps_done = 2
        for rep in range(args.reps):
            order = list(range(len(picks)))
            order = order[rep % len(order):] + order[:rep % len(order)]
            for k in order:
                m, o, sink = models[k]
                dist.barrier()  # each block starts together, then runs free as training does
                t = time.perf_counter()
                for _ in range(args.block):
                    _step(m, o, x)
                took = torch.tensor([(time.perf_counter() - t) / args.block],
                                    dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                times[k].append(float(took.item()))
                sink.clear()
                if k == 0:
                    steps_done += args.block
                    block_last.append(steps_done - 1)
        # a block's last step is followed by other DDPs' blocks, not by its own next forward:
        # keep only its ForwardStarted (which ends the step before it)
        from ddpviz import events as ev

        last = set(block_last)
        kept = [e for e in recorded if e.step not in last or isinstance(e, ev.ForwardStarted)]
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, kept)
        results.append({"model": name, "picks": picks, "times": times,
                        "events": gathered if rank == 0 else None,
                        "measured": {d: [ln.latency_s, ln.seconds_per_byte]
                                     for d, ln in measured.lines.items()}})
        del models
    out.put((rank, results))
    dist.destroy_process_group()


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def _candidate(p: dict[str, Any]) -> Any:
    from ddpviz.advisor import Candidate

    caps = p["bucket_cap_mb_list"]
    return Candidate(p["candidate"], p["bucket_cap_mb"], tuple(caps) if caps else None,
                     p["set_last_bucket_cap"])


def analyze(data: dict[str, Any], verbose: bool, contention: float) -> tuple[Any, ...]:
    """Predict the settings that were run (the first one is the recorded setting) and compare
    with their measured step times."""
    import ddpviz
    from ddpviz.advisor import CostModel, Line
    from ddpviz.traces.trace import Trace

    trace = Trace.load(data["trace"])
    measured = CostModel({d: Line(*v) for d, v in data["measured"].items()}, "measured")
    picks = data["picks"]
    t = time.perf_counter()
    advice = ddpviz.advise(trace, candidates=[_candidate(p) for p in picks if not p["current"]],
                           cost_model=measured, contention=contention)
    advise_s = time.perf_counter() - t
    if verbose:
        print(advice, "\n")
    rows = advice.to_records()  # the current setting first, then picks in order
    meas = [statistics.median(x) * 1e3 for x in data["times"]]
    order = [0] + [i for i, p in enumerate(picks) if not p["current"]]
    meas = [meas[i] for i in order]
    pred = [r["predicted_step_ms"] for r in rows]
    print(f"{data['world']} ranks, {data['model']}  (advise took {advise_s:.2f} s)")
    print(f"  {'candidate':46}{'buckets':>8}{'predicted ms':>14}{'measured ms':>13}{'error':>8}")
    for r, m in zip(rows, meas, strict=True):
        mark = " <- recommended" if r["recommended"] else ""
        print(f"  {r['candidate'][:46]:46}{r['buckets']:>8}{r['predicted_step_ms']:>14.2f}"
              f"{m:>13.2f}{(r['predicted_step_ms'] - m) / m:>+8.1%}{mark}")
    err = statistics.median(abs(p - m) / m for p, m in zip(pred, meas, strict=True))
    rho = spearman(pred, meas)
    rec = next(i for i, r in enumerate(rows) if r["recommended"])
    # the noise floor: settings that build the same bucket map, measured apart
    same: dict[tuple[int, ...], list[float]] = {}
    for r, m in zip(rows, meas, strict=True):
        same.setdefault(tuple(r["bucket_bytes"]), []).append(m)
    spread = max((max(v) / min(v) - 1 for v in same.values() if len(v) > 1), default=None)
    print()
    return (data["world"], data["model"], len(rows), err, rho, meas[rec] / min(meas) - 1,
            spread)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--most", type=int, default=8,
                        help="candidate settings (distinct bucket maps) run besides the default")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "ddpviz_bench_advisor"),
                        help="folder for the recorded traces and measured step times")
    parser.add_argument("--analyze", action="store_true",
                        help="only re-analyze the data saved in --out (no ranks)")
    parser.add_argument("--verbose", action="store_true", help="print each Advice too")
    args = parser.parse_args()
    from ddpviz.traces.trace import Trace

    out = Path(args.out)
    if not args.analyze:
        out.mkdir(parents=True, exist_ok=True)
        for world in [int(w) for w in args.worlds.split(",")]:
            for k, res in enumerate(run_ranks(_rank, world, args, timeout=3000)[0]):
                stem = out / f"w{world}_m{k}"
                Trace([e for evs in res["events"] for e in evs]).save(f"{stem}.ddpviz")
                Path(f"{stem}.json").write_text(json.dumps({
                    "world": world, "model": res["model"], "picks": res["picks"],
                    "times": res["times"], "measured": res["measured"],
                    "trace": f"{stem}.ddpviz"}))
    tables = {}
    for contention in (0.0, 1.0):
        print(f"=== contention {contention:g} ===")
        tables[contention] = [analyze(json.loads(p.read_text()), args.verbose, contention)
                              for p in sorted(out.glob("w*_m*.json"))]
    for contention, summary in tables.items():
        how = "overlap for free" if contention == 0 else "comm and compute take turns"
        print(f"contention {contention:g} ({how}):")
        print(f"{'ranks':>5}  {'model':36}{'settings run':>13}{'median |err|':>14}"
              f"{'spearman':>10}{'recommended vs best':>21}{'same map apart':>16}")
        for world, model, n, err, rho, over, spread in summary:
            noise = "-" if spread is None else f"{spread:.0%}"
            print(f"{world:>5}  {model:36}{n:>13}{err:>14.1%}{rho:>10.2f}{over:>+21.1%}"
                  f"{noise:>16}")


if __name__ == "__main__":
    main()
