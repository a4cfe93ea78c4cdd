"""`ddpviz demo`: what ddpviz shows, on a built-in model, in a terminal."""

from __future__ import annotations

import argparse

from ddpviz.plan import bucket_plan
from ddpviz.plan_table import human_bytes
from ddpviz.zoo import tiny_transformer


def run_demo(args: argparse.Namespace | None = None) -> int:
    model, tokens = tiny_transformer()
    print("ddpviz demo: the buckets torch 2.13's DistributedDataParallel builds for a tiny "
          "transformer\n(gradient-ready order measured with one local backward pass)\n")
    plan = bucket_plan(model, example_inputs=tokens)
    print(plan)
    print("\nWith bucket_cap_mb=1 (an explicit cap: no small first bucket):")
    capped = plan.with_settings(bucket_cap_mb=1)
    rebuilt = capped.rebuilt or ()
    for b in rebuilt:
        print(f"  bucket {b.index}: {len(b.slots):>2} params, {human_bytes(b.nbytes):>9}, "
              f"first {b.names[0]!r}")
    replay = plan.replay("rebuilt")
    closes = [s for s in replay.steps if s.closed is not None]
    print(f"\nWhy the default rebuild closed its buckets: {len(closes)} closing step(s)")
    for s in closes:
        name = plan.params[s.tensor_index].name
        print(f"  {name!r} brought its bucket to {human_bytes(s.bucket_bytes)} >= limit "
              f"{human_bytes(s.limit)}")
    return 0
