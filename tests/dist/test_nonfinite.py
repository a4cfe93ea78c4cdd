"""Where a NaN starts (probes/nonfinite.py, nonfinite_buckets.py): real gloo ranks, torch's DDP
watched at the default (hook-less), forwards-only (`every=None`) and guarded levels and ddpviz's
DDP, each with a NaN planted on one rank: in one layer's gradient (a tensor hook) or in the
rank's input batch, at a sampled step and at an unsampled one. Every case runs in the same rank
processes (one launch per world size), each on a fresh DDP, and must name the kind, step,
rank(s) and parameter; healthy runs (fp32, bf16, gradient_as_bucket_view, static_graph,
find_unused_parameters, no_sync accumulation) must post nothing and, at the default, end with
the parameters bitwise those of an unwatched DDP."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import msgspec
import pytest
import torch
from torch import nn

from tests.dist.harness import run_ranks
from tests.polling import eventually

STEPS = 14
DEFAULT_STEPS = 28  # the default checks forward outputs on steps 0-2 and every 25th step
HEALTHY_STEPS = 201  # healthy runs: sampled steps 0-2, 100, 200 and 11 output checks each
THIN_STEPS = 40  # "thin": the default with its check's budget forced to every 32nd step from 8


def _model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)


def _one_case(rank: int, world: int, engine: str, plant: str, at: int,
              dtype: torch.dtype = torch.float32, **options: Any) -> dict[str, Any]:
    """Train STEPS steps with `plant` ("grad": rank 1's gradient of '2.weight' made NaN;
    "grad0": of '0.weight', the one ready last; "input": rank 1's batch made NaN; "lr": every
    rank's learning rate made inf; "": none) at step `at`; return the nonfinite findings, what
    this rank posted and its parameters' bytes. `options`: DDP's (and accumulate=N: no_sync on
    N-1 of every N steps)."""
    import ddpviz
    from ddpviz import events as ev

    if engine == "thin":  # See [Note: the check's budget]: the multiples of 32 from step 8 on
        from ddpviz.probes import check_budget

        saved = {k: getattr(check_budget, k) for k in ("WARMUP", "WINDOW", "SHARE")}
        for k, v in {"WARMUP": 8, "WINDOW": 8, "SHARE": 1e-9}.items():
            setattr(check_budget, k, v)
        try:
            return _one_case(rank, world, "default", plant, at, dtype, steps=THIN_STEPS,
                             **options)
        finally:
            for k, v in saved.items():
                setattr(check_budget, k, v)
    events: list[Any] = []
    model = _model(dtype)
    accumulate = options.pop("accumulate", 1)
    steps = options.pop("steps", None) or (
        HEALTHY_STEPS if not plant else DEFAULT_STEPS if engine in ("default", "forwards")
        else STEPS)
    if engine == "plain":
        ddp: Any = nn.parallel.DistributedDataParallel(model, **options)
        check: Any = None
    elif engine == "ddpviz":
        ddp = ddpviz.DistributedDataParallel(model, emitter=events.append)
        check = ddp._nf
    else:
        ddp = nn.parallel.DistributedDataParallel(model, **options)
        w = ddpviz.watch(ddp, emitter=events.append, recording=ddpviz.Recording(
            guard=engine == "guarded", every=None if engine == "forwards" else
            1 if engine == "every1" else 100))
        check = w._nf
    step = {"n": 0}
    bad_steps = {at, at + 1, at + 5, at + 8} if plant == "skip" else {at}
    if plant in ("grad", "grad0", "skip") and rank == 1:
        target = dict(model.named_parameters())["0.weight" if plant == "grad0" else "2.weight"]
        target.register_hook(lambda g: g * float("nan") if step["n"] in bad_steps else g)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for i in range(steps):
        step["n"] = i
        x = torch.randn(4, 6, generator=gen).to(dtype)
        if (plant == "input" and rank == 1 and i == at) or (
                plant == "skip-input" and (rank, i) in ((1, at), (2, at + 2))):
            x[0, 0] = float("nan")
        if i % accumulate == 0:
            opt.zero_grad()
        sync = (i + 1) % accumulate == 0
        with contextlib.nullcontext() if sync else ddp.no_sync():
            ddp(x).float().pow(2).mean().backward()
        if not sync:
            continue
        if plant == "lr" and i == at:
            opt.param_groups[0]["lr"] = float("inf")
        if plant == "skip-input" and i == at:  # (time passes: the others learn of it)
            eventually(lambda: check.precise(at + 1), limit=90)
        if plant in ("skip", "skip-input") and not all(
                bool(p.grad.isfinite().all()) for p in ddp.parameters()):
            continue  # what GradScaler does with a non-finite step: skip the update
        opt.step()
        if plant == "lr" and i == at:
            opt.param_groups[0]["lr"] = 0.01
    bits = b"".join(p.detach().float().numpy().tobytes() for p in model.parameters())
    if engine == "plain":
        return {"bits": bits}
    if engine != "ddpviz":
        w.close()
    else:
        check.close()
    if plant:
        # every rank's last step composed (so later occurrences are counted too)
        eventually(lambda: check._composed >= steps - 1, limit=90)
    found = [msgspec.to_builtins(e.finding) for e in events
             if isinstance(e, ev.FindingReported) and e.finding.kind.startswith("nonfinite")]
    out = {"findings": found, "posted": len(check._post.bad), "repeats": check.repeats,
           "bits": bits}
    if (engine, plant) == ("guarded", "grad"):  # what a trace of this rank holds
        out["events"] = events
    return out


CASES = [  # (engine, plant, step)
    ("default", "grad", 2),  # a sampled step: the hooks see rank 1's gradient
    ("default", "grad", 5),  # unsampled: the every-step bucket check sees it
    ("default", "grad0", 7),  # the parameter whose post-accumulate-grad hook checks
    ("forwards", "grad", 5),  # every=None: seen from step 25's forward, origin not seen
    ("default", "input", 25),  # unsampled, an output-checked step: arms the hooks at once
    ("default", "input", 9),  # unsampled: the bucket check and the output's sum
    ("default", "lr", 4),  # the update made the parameters non-finite
    ("guarded", "grad", 5),
    ("guarded", "input", 5),
    ("guarded", "lr", 4),  # finite gradients, the update made the parameters non-finite
    ("ddpviz", "grad", 5),
    ("guarded", "skip", 3),  # NaN at steps 3, 4, 8, 11; the job skips those updates
    ("default", "skip-input", 25),  # rank 1's input at 25, rank 2's at 27; updates skipped
    ("ddpviz", "input", 5),
    ("every1", "input", 9),  # every step's hooks armed: the loss is checked with them
    ("thin", "grad", 12),  # the budget's skipped step: seen at step 25's forward check
    ("thin", "grad", 32),  # the budget's checked step (a multiple of 32): named exactly
    ("default", "", 0),
    ("guarded", "", 0),
    ("ddpviz", "", 0),
]


# DDP's options (and accumulate): healthy runs at the default, bitwise as unwatched
HEALTHY_DEFAULT: list[dict[str, Any]] = [
    {"gradient_as_bucket_view": True}, {"static_graph": True},
    {"find_unused_parameters": True}, {"accumulate": 2},
    {"gradient_as_bucket_view": True, "accumulate": 2}]


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    warnings.simplefilter("ignore")  # (the one warning per DDP goes to stderr)
    out = [_one_case(rank, world, *case) for case in CASES]
    out += [_one_case(rank, world, engine, "", 0, torch.bfloat16)
            for engine in ("default", "guarded", "ddpviz")]
    out += [_one_case(rank, world, engine, "", 0, **options)
            for options in HEALTHY_DEFAULT for engine in ("default", "plain")]
    return out


@pytest.fixture(scope="module")
def results() -> dict[int, list[dict[str, Any]]]:
    return run_ranks(_all_cases, 3, timeout=600)


def _finding(results: dict[int, list[dict[str, Any]]], case: int) -> dict[str, Any]:
    per_rank = [results[r][case]["findings"] for r in sorted(results)]
    assert all(len(f) == 1 for f in per_rank), per_rank
    assert all(f == per_rank[0] for f in per_rank), "every rank composes the same finding"
    return per_rank[0][0]


def test_every_step_recording_checks_the_loss_it_names(
        results: dict[int, list[dict[str, Any]]]) -> None:
    # Recording(every=1): a NaN in rank 1's input at step 9 is named with the loss flagged,
    # never "loss finite" for a loss that was not checked (issue #36)
    f = _finding(results, _case("every1", "input", 9))
    assert (f["kind"], f["step"], f["ranks"], f["field"]) == (
        "nonfinite_gradient", 9, (1,), "loss")
    states = dict((r, v) for v, rs in f["values"] for r in rs)
    assert states[1].startswith("loss non-finite, local gradient non-finite")
    assert states[0].startswith("loss finite") and states[2].startswith("loss finite")


def _case(engine: str, plant: str, at: int) -> int:
    return CASES.index((engine, plant, at))


@pytest.mark.parametrize("engine", ["default", "guarded", "ddpviz"])
def test_a_nan_in_one_ranks_gradient_is_named_with_rank_step_and_parameter(
        results: dict[int, list[dict[str, Any]]], engine: str) -> None:
    at = 2 if engine == "default" else 5
    f = _finding(results, _case(engine, "grad", at))
    assert (f["kind"], f["step"], f["ranks"], f["name"]) == (
        "nonfinite_gradient", at, (1,), "2.weight")
    assert f["field"] == "gradient"  # the loss was finite there
    states = dict((r, v) for v, rs in f["values"] for r in rs)
    assert states[1].startswith("loss finite, local gradient non-finite: '2.weight'")
    assert states[0] == states[2] == "loss finite, local gradients finite"


@pytest.mark.parametrize("engine", ["default", "guarded", "ddpviz"])
def test_a_nan_in_one_ranks_input_is_named_and_the_loss_flagged(
        results: dict[int, list[dict[str, Any]]], engine: str) -> None:
    at = 25 if engine == "default" else 5
    f = _finding(results, _case(engine, "input", at))
    assert (f["kind"], f["step"], f["ranks"], f["field"]) == (
        "nonfinite_gradient", at, (1,), "loss")
    assert f["name"] == "2.bias"  # the first gradient ready (last layer, bias first)
    states = dict((r, v) for v, rs in f["values"] for r in rs)
    assert states[1].startswith("loss non-finite, local gradient non-finite: '2.bias'")
    assert states[0].startswith("loss finite")


@pytest.mark.parametrize(("plant", "at", "name"), [("grad", 5, "2.weight"),
                                                   ("grad0", 7, "0.weight")])
def test_an_unsampled_gradient_nan_at_the_default_is_named_at_its_step(
        results: dict[int, list[dict[str, Any]]], plant: str, at: int, name: str) -> None:
    # the every-step bucket check: See [Note: every step, one hook a bucket]
    f = _finding(results, _case("default", plant, at))
    assert (f["kind"], f["step"], f["ranks"], f["name"], f["field"]) == (
        "nonfinite_gradient", at, (1,), name, "gradient")
    states = dict((r, v) for v, rs in f["values"] for r in rs)
    assert states[0] == states[2] == "loss finite, local gradients finite"
    assert states[1] == f"loss finite, local gradient non-finite: '{name}'"


def test_an_unsampled_input_nan_at_the_default_is_named_at_its_step_with_the_loss(
        results: dict[int, list[dict[str, Any]]]) -> None:
    f = _finding(results, _case("default", "input", 9))
    assert (f["kind"], f["step"], f["ranks"], f["field"], f["name"]) == (
        "nonfinite_gradient", 9, (1,), "loss", "2.bias")


def test_an_update_that_makes_the_parameters_non_finite_is_named_at_the_default(
        results: dict[int, list[dict[str, Any]]]) -> None:
    f = _finding(results, _case("default", "lr", 4))
    assert (f["kind"], f["step"], f["ranks"]) == ("nonfinite_parameter", 4, (0, 1, 2))
    assert "gradients were finite on every rank" in " ".join(f["detail"])


def test_an_unsampled_gradient_nan_without_gradient_hooks_says_what_was_not_seen(
        results: dict[int, list[dict[str, Any]]]) -> None:
    # every=None: no gradient is checked; outputs on steps 0-2 and at step 25, where every
    # rank's parameters are non-finite: somewhere in steps 3-24, origin not seen
    f = _finding(results, _case("forwards", "grad", 5))
    assert (f["kind"], f["step"], f["ranks"]) == ("nonfinite_parameter", 3, (0, 1, 2))
    assert "between step 2's forward and step 25's forward" in f["title"]
    text = " ".join(f["detail"])
    assert "not checked" in text and "from step 25 on" in text
    assert "Recording(guard=True)" in f["fix"]


def test_a_nan_on_a_step_the_checks_budget_skipped_says_what_was_not_checked_and_why(
        results: dict[int, list[dict[str, Any]]]) -> None:
    # See [Note: the check's budget]: checked every step up to 7, then every 32nd; rank 1's
    # gradient NaN at step 12 reaches every rank through the all-reduce and is seen at step
    # 25's forward check (the default's every 25th, of the parameters): no origin claimed,
    # the period said
    f = _finding(results, _case("thin", "grad", 12))
    assert (f["kind"], f["ranks"]) == ("nonfinite_parameter", (0, 1, 2))
    assert "between step 7's forward and step 25's forward" in f["title"]
    text = " ".join(f["detail"])
    assert "ran every 32nd step on ranks 0,1,2" in text, text
    assert "whether a gradient (on which rank) or the optimizer step" in text


def test_a_nan_on_a_step_the_checks_budget_checked_is_named_exactly(
        results: dict[int, list[dict[str, Any]]]) -> None:
    f = _finding(results, _case("thin", "grad", 32))
    assert (f["kind"], f["step"], f["ranks"], f["name"], f["field"]) == (
        "nonfinite_gradient", 32, (1,), "2.weight", "gradient")


def test_an_update_that_makes_finite_gradients_non_finite_blames_the_update(
        results: dict[int, list[dict[str, Any]]]) -> None:
    f = _finding(results, _case("guarded", "lr", 4))
    assert (f["kind"], f["step"], f["ranks"]) == ("nonfinite_parameter", 4, (0, 1, 2))
    assert "gradients were finite on every rank" in " ".join(f["detail"])


def test_healthy_runs_post_nothing(results: dict[int, list[dict[str, Any]]]) -> None:
    healthy = [i for i, c in enumerate(CASES) if not c[1]]
    healthy += list(range(len(CASES), len(CASES) + 3))  # bf16
    healthy += list(range(len(CASES) + 3, len(CASES) + 3 + 2 * len(HEALTHY_DEFAULT), 2))
    for r, per_case in results.items():
        for i in healthy:
            got = {k: v for k, v in per_case[i].items() if k != "bits"}
            assert got == {"findings": [], "posted": 0, "repeats": 0}, (r, i)


@pytest.mark.parametrize("options", HEALTHY_DEFAULT, ids=str)
def test_the_default_leaves_the_parameters_bitwise_as_unwatched(
        results: dict[int, list[dict[str, Any]]], options: dict[str, Any]) -> None:
    i = len(CASES) + 3 + 2 * HEALTHY_DEFAULT.index(options)
    for per_case in results.values():
        assert per_case[i]["bits"] == per_case[i + 1]["bits"]  # watched == plain


def test_a_job_that_skips_non_finite_steps_gets_one_finding_and_a_count(
        results: dict[int, list[dict[str, Any]]]) -> None:
    f = _finding(results, _case("guarded", "skip", 3))
    assert (f["kind"], f["step"], f["ranks"], f["name"]) == (
        "nonfinite_gradient", 3, (1,), "2.weight")
    # step 4 continues step 3's episode; steps 8 and 11 repeat its origin
    assert {r: results[r][_case("guarded", "skip", 3)]["repeats"] for r in results} == {
        0: 3, 1: 3, 2: 3}


def test_ddpviz_diagnose_of_the_ranks_events_reports_the_origin_once(
        results: dict[int, list[dict[str, Any]]]) -> None:
    from ddpviz._diagnose.diagnosis import diagnose_events

    case = _case("guarded", "grad", 5)
    events = [e for r in sorted(results) for e in results[r][case]["events"]]
    found = [f for f in diagnose_events(events) if f.kind.startswith("nonfinite")]
    assert [(f.kind, f.step, f.ranks, f.name) for f in found] == [
        ("nonfinite_gradient", 5, (1,), "2.weight")]
    assert "non-finite local gradient '2.weight' on rank 1 at step 5" in str(found[0])


def test_after_a_non_finite_step_the_default_checks_every_step_and_names_the_next_origin(
        results: dict[int, list[dict[str, Any]]]) -> None:
    per_rank = [results[r][_case("default", "skip-input", 25)]["findings"] for r in results]
    assert all(f == per_rank[0] for f in per_rank)
    assert [(f["kind"], f["step"], f["ranks"], f["field"], f["name"]) for f in per_rank[0]] == [
        ("nonfinite_gradient", 25, (1,), "loss", "2.bias"),
        ("nonfinite_gradient", 27, (2,), "loss", "2.bias")]  # step 27: not sampled, precise
    first, second = ({r: v for v, rs in f["values"] for r in rs} for f in per_rank[0])
    assert first[0] == second[0] == "loss finite, local gradients finite"


def _one_rank(rank: int, world: int) -> dict[str, Any]:
    """World size 1 (no board: the rank composes alone): a NaN in '0.weight''s gradient at
    step 7 of 40, at the default. Returns the findings and how many forwards took the short
    path (See [Note: plain steps])."""
    import ddpviz
    from ddpviz import events as ev

    events: list[Any] = []
    model = _model()
    ddp = nn.parallel.DistributedDataParallel(model)
    w = ddpviz.watch(ddp, emitter=events.append)
    step = {"n": 0}
    model[0].weight.register_hook(lambda g: g * float("nan") if step["n"] == 7 else g)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    plain = 0
    for i in range(40):
        step["n"] = i
        plain += i < w._plain_until
        ddp(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    w.close()
    found = [msgspec.to_builtins(e.finding) for e in events
             if isinstance(e, ev.FindingReported) and e.finding.kind.startswith("nonfinite")]
    return {"findings": found, "plain": plain}


def test_one_rank_names_the_nan_at_its_step_and_runs_plain_steps_until_then() -> None:
    out = run_ranks(_one_rank, 1, timeout=300)[0]
    assert [(f["kind"], f["step"], f["ranks"], f["name"], f["field"]) for f in
            out["findings"]][:1] == [("nonfinite_gradient", 7, (0,), "0.weight", "gradient")]
    assert out["plain"] >= 3  # (steps 3-6 are usual steps: the short path)
