"""The examples of the atlas of DDP errors (docs/errors.md), produced by running each case.

Each case runs on real gloo ranks twice where that is what the page shows: once under torch
2.13's own DDP (its exact words: what a user pastes into a search box) and once under ddpviz
(its finding and message). The texts go to docs/_generated/atlas/CASE.torch.txt and
CASE.ddpviz.txt, which errors.md includes, so the page never shows a message typed by hand.
The runs are the diagnosis scenarios of tests/diagnose/test_scenarios.py (ranks forked from a
forkserver that imported torch once), plus two cases defined here where torch only warns.

Run by `make docs` (PYTHONPATH=. python docs/atlas_examples.py); about a minute on 2 cores,
three cases at a time (`--jobs`).
`--only CASE ...` reruns some cases.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "_generated" / "atlas"
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

PG_TIMEOUT = 4.0  # the process group's timeout in the torch runs that hang


def _init(rank: int, world_size: int, timeout: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))


def _stderr_to(path: str) -> None:
    """Send this process's stderr (C++ warnings included) to `path`."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


def torch_only_ranks(rank: int, world_size: int, case: str, use_ddpviz: bool,
                     stderr: str) -> dict[str, Any]:
    """Cases where torch only warns: torch's DDP alone, or watched by ddpviz.watch(). Returns
    what the rank printed (torch's C++ warnings go to stderr, not to Python's warnings)."""
    import ddpviz

    _stderr_to(f"{stderr}.{rank}")
    _init(rank, world_size, 60.0)
    torch.manual_seed(0)
    out: dict[str, Any] = {"error": "no error", "findings": []}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            if case == "find_unused_none":
                # find_unused_parameters=True on a model that uses every parameter
                model: nn.Module = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
                ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
                w = ddpviz.watch(ddp, hang_timeout=5) if use_ddpviz else None
                for _ in range(2):
                    ddp(torch.randn(4, 8)).sum().backward()
            else:  # grad_strides: the model went channels_last after DDP built its buckets
                model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3))
                ddp = nn.parallel.DistributedDataParallel(model)
                w = ddpviz.watch(ddp, hang_timeout=5) if use_ddpviz else None
                model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
                x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
                for _ in range(2):
                    ddp(x).sum().backward()
            if w is not None:
                out["findings"] = [f.kind for f in ddpviz.diagnose(w.events)] \
                    if hasattr(w, "events") else []
    except RuntimeError as exc:
        out["error"] = str(exc).strip()
        out["findings"] = [f.kind for f in getattr(exc, "findings", ())]
    sys.stderr.flush()
    return out


def train(rank: int, world_size: int, case: str) -> str:
    """A training loop that breaks DDP's gradient-sync contract, watched: the loss computed on
    ddp.module after a validation pass through the DDP ("unsynced_module"), or no_sync()
    around the last of 3 micro-batches ("unsynced_no_sync"). torch says nothing; returns what
    ddpviz says (its finding)."""
    import contextlib

    import ddpviz
    from ddpviz import events as ev

    _init(rank, world_size, 60.0)
    torch.manual_seed(rank)  # each rank its own batches (DDP broadcasts rank 0's weights)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    ddp = nn.parallel.DistributedDataParallel(model)
    found: list[Any] = []
    watch = ddpviz.watch(ddp, emitter=found.append)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    if case == "unsynced_module":
        with torch.no_grad():  # a validation pass through the DDP
            ddp(torch.randn(4, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the same text, on stderr)
        for _step in range(2):
            for i in range(3):
                x = torch.randn(4, 8)
                if case == "unsynced_module":
                    loss = ddp.module(x).square().mean()
                    loss.backward()
                    break
                with ddp.no_sync() if i == 2 else contextlib.nullcontext():
                    loss = ddp(x).square().mean()
                    loss.backward()
            opt.step()
            opt.zero_grad()
    watch.close()
    texts = [e.finding.text() for e in found if isinstance(e, ev.FindingReported)]
    return "\n".join(texts) or "(nothing printed)"


def _text(value: Any, key: str = "error") -> str:
    """A rank's outcome as text: its error, or what a crashed rank's process said."""
    if isinstance(value, dict):
        return str(value.get(key, ""))
    failures = getattr(value, "failures", None)
    if failures:
        return next(iter(failures.values())).strip().splitlines()[-1]
    return str(value)


def _scrub(text: str) -> str:
    """Addresses and ports differ from run to run; the rest is the message as printed."""
    return re.sub(r"\[127\.0\.0\.1\]:\d+|\[localhost\]:\d+|127\.0\.0\.1:\d+", "[127.0.0.1]:PORT",
                  text)


def run_cases(only: set[str] | None, jobs: int = 3) -> dict[str, dict[str, str]]:
    """Every case: {case: {"torch": text, "ddpviz": text, "kinds": ...}}. The cases' runs are
    independent (each its own ranks and port) and mostly wait (on hangs, gloo's timeouts,
    process start-up): `jobs` of them run at a time, in threads."""
    import ddpviz
    from tests.diagnose import test_scenarios as sc
    from tests.dist.harness import run_ranks

    done: dict[str, dict[str, str]] = {}

    def want(case: str) -> bool:
        return only is None or case in only

    def engine(case: str, situation: str, ddpviz_rank: int, torch_rank: int) -> None:
        mine = sc.run_engine(situation)
        theirs = sc.run_engine(situation, False)
        done[case] = {"ddpviz": _text(mine[ddpviz_rank]), "torch": _text(theirs[torch_rank]),
                      "kinds": ",".join(f[0] for f in mine[ddpviz_rank].get("findings", []))}
        if situation == "nosync" and want("collective_mismatch"):
            collective_mismatch(mine)

    def collective_mismatch(mine: dict[int, Any] | None) -> None:
        # the skipped all-reduce's run, diagnosed after the fact from every rank's events
        mine = mine or sc.run_engine("nosync")
        events = [e for r in (0, 1) for e in mine[r]["events"]]
        found = [f for f in ddpviz.diagnose(events) if f.kind == "collective_mismatch"]
        done["collective_mismatch"] = {"ddpviz": str(ddpviz.findings.Findings(found)),
                                       "torch": "", "kinds": "collective_mismatch"}

    def after_the_fact() -> None:
        events = []
        for situation in ("order", "reassign"):
            mine = sc.run_engine(situation)
            events += [e for r in (0, 1) for e in mine[r]["events"]]
        for kind in ("grad_order", "buffer_reassigned"):
            found = [f for f in ddpviz.diagnose(events) if f.kind == kind and f.severity != "info"]
            done[kind] = {"ddpviz": str(ddpviz.findings.Findings(found)), "torch": "",
                          "kinds": kind}

    def model_cases() -> None:
        models = sc.run_ranks(sc.model_ranks, 3, timeout=120, start_method="forkserver",
                              init=False)
        for case, defect in (("param_count", "count"), ("param_shape", "shape"),
                             ("param_stride", "stride"), ("param_dtype", "dtype"),
                             ("initial_values", "initial_values")):
            entry = models[0]["ddpviz"][defect]
            torch_text = models[0]["torch"].get(defect, "")
            if defect in sc.TORCH_MODEL_BASELINE:  # torch fails on one rank, hangs the other
                theirs = run_ranks(sc.torch_model_ranks, 2, defect, timeout=30, **sc.FAST)
                torch_text = sc.outcome(theirs[1])
            done[case] = {"ddpviz": entry["text"], "torch": torch_text,
                          "kinds": ",".join(f[0] for f in entry["findings"])}

    def unsynced(case: str) -> None:  # torch prints nothing: the replicas drift apart, silently
        said = run_ranks(train, 2, case, timeout=60, **sc.FAST)
        done[case] = {"ddpviz": str(said[0]), "torch": "(nothing printed)",
                      "kinds": "unsynced_gradients"}

    def warned(case: str) -> None:
        texts = {}
        for side, use in (("torch", False), ("ddpviz", True)):
            stderr = str(OUT / f".{case}.{side}.stderr")
            run_ranks(torch_only_ranks, 2, case, use, stderr, timeout=60, **sc.FAST)
            printed = Path(f"{stderr}.0").read_text(encoding="utf-8", errors="replace")
            lines = [line for line in printed.splitlines()
                     if ("Warning:" in line or line.startswith("ddpviz")) and
                     (side == "torch" or line.startswith("ddpviz"))]
            texts[side] = "\n".join(dict.fromkeys(lines)) or "(nothing printed)"
            for r in (0, 1):
                Path(f"{stderr}.{r}").unlink(missing_ok=True)
        done[case] = {**texts, "kinds": ""}

    # the longest first (the hangs wait for their timeouts), so no thread is left alone at the end
    work: list[Callable[[], None]] = []
    for case, situation, ddpviz_rank, torch_rank in (
            ("missing_rank", "never", 0, 0), ("rank_exited", "crash", 0, 0),
            ("uneven_inputs", "uneven", 0, 0), ("skipped_allreduce", "nosync", 0, 0),
            ("unused_parameter", "unused", 0, 1), ("hook_fired_twice", "twice", 1, 1),
            ("graph_changed", "graph_change", 1, 1)):
        if want(case):
            work.append(functools.partial(engine, case, situation, ddpviz_rank, torch_rank))
    if want("collective_mismatch") and not want("skipped_allreduce"):
        work.append(functools.partial(collective_mismatch, None))
    if any(want(c) for c in ("param_count", "param_shape", "param_stride", "param_dtype",
                             "initial_values")):
        work.insert(0, model_cases)
    if want("grad_order") or want("buffer_reassigned"):
        work.append(after_the_fact)
    work += [functools.partial(unsynced, c) for c in ("unsynced_module", "unsynced_no_sync")
             if want(c)]
    work += [functools.partial(warned, c) for c in ("find_unused_none", "grad_strides")
             if want(c)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(w) for w in work]:
            future.result()  # a case's error, raised here
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="cases to rerun (default: all)")
    p.add_argument("--jobs", type=int, default=3, help="cases run at a time (default: 3)")
    args = p.parse_args(argv)
    start = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    # The torch runs fail on purpose, and their ranks print C++ stack traces and gloo's aborts:
    # keep them in a log beside the examples, shown only if this script fails.
    log = OUT / "ranks.log"
    saved = os.dup(2)
    with open(log, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            cases = run_cases(set(args.only) if args.only else None, args.jobs)
        except BaseException:
            os.dup2(saved, 2)
            sys.stderr.write(log.read_text(encoding="utf-8", errors="replace")[-20_000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    for case, texts in cases.items():
        for side in ("torch", "ddpviz"):
            (OUT / f"{case}.{side}.txt").write_text(_scrub(texts[side]).rstrip() + "\n",
                                                     encoding="utf-8")
    manifest = OUT / "cases.json"
    known = json.loads(manifest.read_text()) if manifest.exists() else {}
    known.update({c: {"kinds": t["kinds"]} for c, t in cases.items()})
    manifest.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"atlas: cases run: {len(cases)}, in {time.monotonic() - start:.0f} s -> {OUT} "
          f"(the ranks' own output: {log.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
