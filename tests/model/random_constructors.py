"""Random constructors for the verification matrix's tests: variants of one parameter list on
some ranks, verification passed, failed (random mismatches, counts) or not reported. Shared by
tests/model/test_verification_matrix.py and tests/extension/test_verification_matrix_mirror.py."""

from __future__ import annotations

import random

from ddpviz import events as ev
from ddpviz.events import Mismatch


def _variant(rng: random.Random, params: list[ev.ParamInfo]) -> list[ev.ParamInfo]:
    """`params` with at most one defect a rank can have (or a copy of the same list)."""
    out = list(params)
    i = rng.randrange(len(out))
    what = rng.choice(["copy", "shape", "dtype", "device", "missing", "extra", "duplicate"])
    p = out[i]
    if what == "shape":
        out[i] = ev.ParamInfo(p.index, p.name, (rng.randint(1, 3), 7), p.dtype, p.device, False)
    elif what == "dtype":
        out[i] = ev.ParamInfo(p.index, p.name, p.shape, "bfloat16", p.device, False)
    elif what == "device":  # the matrix compares the device type only: cuda:1 == cuda:0
        out[i] = ev.ParamInfo(p.index, p.name, p.shape, p.dtype,
                              rng.choice(["cuda:1", "meta"]), False)
    elif what == "missing":
        del out[i]
        out = [ev.ParamInfo(j, q.name, q.shape, q.dtype, q.device, False)
               for j, q in enumerate(out)]
    elif what == "extra":
        out.append(ev.ParamInfo(len(out), f"extra{rng.randrange(3)}", (2,), "float32", "cpu",
                                False))
    elif what == "duplicate":
        out.append(ev.ParamInfo(len(out), p.name, (9,), "float32", "cpu", False))
    return out


def random_constructor(rng: random.Random, world: int, *, someone: bool = False
                       ) -> list[ev.Event]:
    """A constructor's events on `world` ranks (`someone`: at least rank 0 reports)."""
    params = [ev.ParamInfo(i, f"l{i // 2}.{'bias' if i % 2 else 'weight'}", (4, 4 + i % 3),
                           "float32", "cuda:0", False) for i in range(rng.randint(1, 8))]
    kinds = [params] + [_variant(rng, params) for _ in range(rng.choice([1, 3, 12]))]
    buffer_sets = [("bn.mean",), ("bn.mean", "bn.var"), ()]
    events: list[ev.Event] = []
    reporting = [r for r in range(world) if rng.random() < 0.9] or ([0] if someone else [])
    outcome = rng.choice(["none", "passed", "failed", "failed"])
    mismatches: list[Mismatch] = []
    for _ in range(rng.randint(1, 4)):
        p = rng.choice(params)
        field = rng.choice(["shape", "present", "stride", "order"])
        bad = tuple(sorted(rng.sample(range(world), min(world, rng.randint(1, 2)))))
        good = tuple(r for r in range(world) if r not in bad)
        value = "missing" if field == "present" else f"v{rng.randrange(3)}"
        mismatches.append(Mismatch(rng.choice(["param", "param", "buffer"]), p.index,
                                   rng.choice([p.name, "bn.mean", "ghost"]), field,
                                   (("ok", good), (value, bad))))
    if rng.random() < 0.3:
        mismatches.append(Mismatch("count", -1, "parameters", "count",
                                   (("8", tuple(range(world - 1))), ("7", (world - 1,)))))
    shared = [tuple(k) for k in kinds]  # one list object per variant, as a trace keeps it
    for r in reporting:
        k = rng.randrange(len(shared)) if rng.random() < 0.5 else 0
        listed = shared[k] if rng.random() < 0.8 else tuple(list(shared[k]))  # equal copy
        events.append(ev.ParamsBuilt(r, -1, 10 + r, 0, listed, rng.choice(buffer_sets), ()))
        events.append(ev.VerificationStarted(r, -1, 20 + r, 1, world, len(listed), 0))
        if outcome == "passed" and rng.random() < 0.8:
            events.append(ev.VerificationPassed(r, -1, 30 + r, 2, world, "abc"))
        elif outcome == "failed" and rng.random() < 0.8:
            events.append(ev.VerificationFailed(r, -1, 30 + r, 2, world, tuple(mismatches)))
    return events
