"""Recording policies at the source (`recording=` of ddpviz's DDP and of watch();
recording.py), on 2 real gloo ranks: gradients stay bitwise torch's at every policy, the
per-bucket aggregates of guard with every=None ("buckets") equal the GradReady events of an
every=1 ("full") run of the same deterministic model aggregated per bucket, every=3 ("sampled")
records the documented steps in full, a finding makes its step full after the fact, diagnosis
says which steps' per-parameter events are missing, and the old `detail=` names still work with
a DeprecationWarning (one release)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec
import pytest
import torch
from torch import nn

from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose_events
from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 8
# Result labels (the old level names) and the recording each stands for.
LEVELS = ("full", "buckets", "sampled:3")
WATCH_LEVELS = ("params", "buckets", "sampled:3", "light:3")
RECORDINGS = {"full": (True, 1), "params": (True, 1), "buckets": (True, None),
              "sampled:3": (True, 3), "light:3": (False, 3)}  # (guard, every)
# sampled:3 over 8 steps: 0-2 (the first iterations, the rebuild at step 1), every 3rd (0, 3,
# 6); the rest is aggregated. See [Note: detail levels] in recording.py.
SAMPLED_FULL = {0, 1, 2, 3, 6}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(24, 24) for _ in range(5)], nn.Linear(24, 4))


def _bits(t: torch.Tensor) -> list[int]:
    return t.detach().contiguous().view(torch.int32).flatten().tolist()


def _train(ddp: nn.Module, rank: int, finding_at: int = -1,
           emit: Any = None) -> list[list[int]]:
    """STEPS SGD steps; returns every parameter's and gradient's bits after each step."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    out: list[list[int]] = []
    for step in range(STEPS):
        torch.manual_seed(10 * rank + step)
        ddp(torch.randn(6, 24)).pow(2).sum().backward()
        if step == finding_at and emit is not None:
            emit()
        out += [_bits(p.grad) for p in ddp.parameters() if p.grad is not None]
        opt.step()
        opt.zero_grad()
        out += [_bits(p) for p in ddp.parameters()]
    return out


def _plain(events: list[ev.Event]) -> list[tuple[str, dict[str, Any]]]:
    return [(type(e).__name__, msgspec.to_builtins(e)) for e in events]


def _levels(rank: int, world_size: int) -> dict[str, Any]:
    import warnings

    import ddpviz
    from ddpviz._watch import new_watch
    from ddpviz.findings import Finding

    def rec(level: str) -> ddpviz.Recording:
        return ddpviz.Recording(*RECORDINGS[level])

    out: dict[str, Any] = {}
    cap = {"bucket_cap_mb": 0.004}  # ~1,000 floats a bucket: several buckets after the rebuild
    out["torch"] = _train(nn.parallel.DistributedDataParallel(_model(), **cap), rank)
    for level in LEVELS:
        events: list[ev.Event] = []
        ddp = ddpviz.DistributedDataParallel(_model(), emitter=events.append,
                                             recording=rec(level),
                                             hang_timeout=0, **cap)
        out[level] = (_train(ddp, rank), _plain(events))
    # A finding reported at step 4 (aggregated in sampled:3): step 4 gets its GradReady events
    # after the fact, and step 5 is full.
    events = []
    ddp = ddpviz.DistributedDataParallel(_model(), emitter=events.append,
                                         recording=rec("sampled:3"),
                                         hang_timeout=0, **cap)
    finding = Finding(kind="buffer_reassigned", severity="warning", title="planted", ranks=(rank,))
    out["finding"] = (_train(ddp, rank, 4, lambda: ddp._tap.emit(ev.FindingReported, finding)),
                      _plain(events))
    for level in WATCH_LEVELS:
        events = []
        tddp = nn.parallel.DistributedDataParallel(_model(), **cap)
        user: list[int] = []  # a user's gradient hook on one parameter, before watch()
        first = next(tddp.parameters())
        first.register_hook(lambda g, user=user: user.append(1))
        w = ddpviz.watch(tddp, emitter=events.append, recording=rec(level), hang_timeout=0)
        out["watch-" + level] = (_train(tddp, rank), _plain(events))
        # after an unsampled step, light has left nothing installed on the parameters (a
        # removed hook's dict would still be called by every backward): only the user's, and
        # the gradient-sync contract's post-accumulate-grad hooks (probes/sync_contract.py)
        # (and the backward marks' one hook, on the parameter ready first, for the watch's
        # life: See [Note: backward marks] in probes/backward_marks.py)
        marked = getattr(w, "_marks", None)
        mine = -1 if marked is None else marked.param
        out["residue-" + level] = ([p._backward_hooks is None or (
            i == mine and [getattr(f, "__name__", "") for f in p._backward_hooks.values()]
            == ["_first"]) for i, p in enumerate(tddp.parameters())][1:],
                                   len(first._backward_hooks), len(user),
                                   [None if h is None else sorted(
                                       type(getattr(getattr(f, "func", f), "__self__",
                                                    f)).__name__
                                       for f in h.values())
                                    for p in tddp.parameters()
                                    for h in [p._post_accumulate_grad_hooks]],
                                   len(tddp._forward_pre_hooks) + len(tddp._forward_hooks))
        w.close()
        out["residue-" + level] += ("forward" in tddp.__dict__,)
    for level, name in (("sampled:3", "watch-finding"), ("light:3", "watch-light-finding")):
        events = []
        tddp = nn.parallel.DistributedDataParallel(_model(), **cap)
        w = ddpviz.watch(tddp, emitter=events.append, recording=rec(level), hang_timeout=0)
        out[name] = (_train(tddp, rank, 4, lambda w=w: w.tap.emit(ev.FindingReported, finding)),
                     _plain(events))
        w.close()
    # The old names (one release): the same recording, and a DeprecationWarning naming it;
    # "light" was a ValueError for ddpviz's DDP and is now the same recording for both.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = ddpviz.watch(nn.parallel.DistributedDataParallel(_model()), detail="light:3",
                         hang_timeout=0)
        ddp = ddpviz.DistributedDataParallel(_model(), detail="light", hang_timeout=0)
    out["deprecated"] = (str(w.recording), ddp._detail.describe(),
                         [(c.category.__name__, str(c.message), c.filename) for c in caught])
    w.close()
    # The strategy is chosen once, from the recording, also when the Watch is made without
    # watch() (as `ddpviz record` does: new_watch).
    out["strategies"] = []
    for recording in (ddpviz.Recording(), ddpviz.Recording(every=None),
                      ddpviz.Recording(guard=True), None):
        tddp = nn.parallel.DistributedDataParallel(_model())
        w = (ddpviz.watch(tddp, recording=recording, hang_timeout=0) if recording is not None
             else new_watch(tddp, emitter=None, hook=None, state=None, hang_timeout=0))
        out["strategies"].append((type(w).__name__, str(w.recording),
                                  bool(getattr(tddp, "_comm_hooks", None)) or
                                  "register_comm_hook" in tddp.__dict__))
        w.close()
    return out


@pytest.fixture(scope="module")
def runs() -> dict[int, dict[str, Any]]:
    return run_ranks(_levels, 2, timeout=240)


def _steps(events: list[tuple[str, dict[str, Any]]], kind: str) -> set[int]:
    return {f["step"] for k, f in events if k == kind}


def _aggregated(events: list[tuple[str, dict[str, Any]]]
                ) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """GradReady per (step, bucket) -> (count, bytes, first t, last t), from ParamsBuilt."""
    sizes = {}
    for k, f in events:
        if k == "ParamsBuilt":
            for p in f["params"]:
                n = 1
                for d in p["shape"]:
                    n *= d
                sizes[p["index"]] = n * p["element_size"]
    agg: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for k, f in events:
        if k == "GradReady":
            a = agg[(f["step"], f["bucket"])]
            a[1] += sizes[f["param"]]
            a[2] = f["t_ns"] if not a[0] else min(a[2], f["t_ns"])
            a[3] = max(a[3], f["t_ns"])
            a[0] += 1
    return {key: (a[0], a[1], a[2], a[3]) for key, a in agg.items()}


def _summaries(events: list[tuple[str, dict[str, Any]]]
               ) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    return {(f["step"], f["bucket"]): (f["n_grads"], f["nbytes"], f["first_t_ns"],
                                       f["last_t_ns"])
            for k, f in events if k == "GradsSummarized"}


def test_gradients_and_parameters_bitwise_torch_at_every_level(runs: dict[int, Any]) -> None:
    for rank, res in runs.items():
        for level in (*LEVELS, "finding", "watch-finding", "watch-light-finding",
                      *("watch-" + w for w in WATCH_LEVELS)):
            assert res[level][0] == res["torch"], f"rank {rank}, detail={level}"


@pytest.mark.parametrize(("full", "buckets"), [("full", "buckets"),
                                                ("watch-params", "watch-buckets")])
def test_bucket_aggregates_equal_the_full_runs_grad_ready_events(
        runs: dict[int, Any], full: str, buckets: str) -> None:
    for rank, res in runs.items():
        full_events, bucket_events = res[full][1], res[buckets][1]
        assert not _steps(bucket_events, "GradReady")
        expected = _aggregated(full_events)
        got = _summaries(bucket_events)
        # Every (step, bucket) of the full run, with the same count and bytes.
        assert {k: v[:2] for k, v in got.items()} == {k: v[:2] for k, v in expected.items()}
        assert len({s for s, _ in got}) == STEPS
        # Times: the first and last hook of the bucket, between BackwardStarted and its
        # BucketReady (each run's own clock readings).
        started = {f["step"]: f["t_ns"] for k, f in bucket_events if k == "BackwardStarted"}
        ready = {(f["step"], f["bucket"]): f["t_ns"] for k, f in bucket_events
                 if k == "BucketReady"}
        for (step, b), (_, _, first, last) in got.items():
            assert started[step] <= first <= last <= ready[(step, b)], (rank, step, b)
        # ...and emitted just before that bucket's BucketReady.
        kinds = [(k, f.get("bucket")) for k, f in bucket_events]
        for i, (k, b) in enumerate(kinds):
            if k == "GradsSummarized":
                assert kinds[i + 1] == ("BucketReady", b)


@pytest.mark.parametrize("level", ["sampled:3", "watch-sampled:3"])
def test_sampled_records_the_documented_steps_in_full(runs: dict[int, Any], level: str
                                                      ) -> None:
    for res in runs.values():
        events = res[level][1]
        assert _steps(events, "GradReady") == SAMPLED_FULL
        assert _steps(events, "GradsSummarized") == set(range(STEPS)) - SAMPLED_FULL
        # the full steps carry every hook of the full run at those steps
        full = _aggregated(res["full" if level == "sampled:3" else "watch-params"][1])
        mine = _aggregated(events)
        assert {k: v[:2] for k, v in mine.items()} == \
            {k: v[:2] for k, v in full.items() if k[0] in SAMPLED_FULL}


@pytest.mark.parametrize("run", ["finding", "watch-finding"])
def test_a_finding_makes_its_step_full_after_the_fact_and_the_next_one(
        runs: dict[int, Any], run: str) -> None:
    for res in runs.values():
        events = res[run][1]
        assert _steps(events, "GradReady") == SAMPLED_FULL | {4, 5}
        # step 4 has both: its summaries and, emitted after the finding, its GradReady events
        # with the hook times the summaries were made of.
        assert 4 in _steps(events, "GradsSummarized")
        agg = {k: v for k, v in _aggregated(events).items() if k[0] == 4}
        assert agg == {k: v for k, v in _summaries(events).items() if k[0] == 4}
        seqs = [f["seq"] for _, f in events]
        assert seqs == list(range(len(seqs)))  # no gap, no reordering: fresh seq numbers


def _bucket_steps(events: list[tuple[str, dict[str, Any]]], kind: str
                  ) -> dict[int, list[int]]:
    """step -> the buckets of its `kind` events, in emission order."""
    out: dict[int, list[int]] = defaultdict(list)
    for k, f in events:
        if k == kind:
            out[f["step"]].append(f["bucket"])
    return dict(out)


def test_light_records_the_sampled_steps_in_full_and_nothing_of_the_others(
        runs: dict[int, Any]) -> None:
    """watch(detail="light:3"): no comm hook; per-parameter hooks on the sampled steps only.
    Those steps carry the same GradReady events as a "params" watch, every bucket's
    BucketReady after its last gradient, the launches in bucket order (as torch's reducer
    launches them) and every all-reduce done after the backward's last hook; the other steps
    have no backward events at all, and no GradsSummarized is ever made."""
    for rank, res in runs.items():
        events, full = res["watch-light:3"][1], res["watch-params"][1]
        assert _steps(events, "GradReady") == SAMPLED_FULL
        assert not _steps(events, "GradsSummarized")
        assert {k: v[:2] for k, v in _aggregated(events).items()} == \
            {k: v[:2] for k, v in _aggregated(full).items() if k[0] in SAMPLED_FULL}
        for kind in ("BackwardStarted", "BucketReady", "AllReduceLaunched", "AllReduceDone"):
            assert _steps(events, kind) == SAMPLED_FULL, (rank, kind)
        assert _steps(events, "ForwardStarted") == set(range(STEPS))
        launched = _bucket_steps(events, "AllReduceLaunched")
        done = _bucket_steps(events, "AllReduceDone")
        torch_launched = _bucket_steps(full, "AllReduceLaunched")
        for step in SAMPLED_FULL:
            assert launched[step] == done[step] == torch_launched[step], (rank, step)
            assert launched[step] == sorted(launched[step])
            assert sorted(_bucket_steps(events, "BucketReady")[step]) == launched[step]
        assert max(len(b) for b in launched.values()) > 1  # several buckets after the rebuild
        # each BucketReady comes after its bucket's last GradReady and before any done
        position = {(k, f["step"], f.get("bucket"), f.get("param")): i
                    for i, (k, f) in enumerate(events)}
        assigned = [f for k, f in events if k == "BucketAssigned"]
        for step in SAMPLED_FULL:
            members = assigned[-1]["buckets"] if step >= 1 else assigned[0]["buckets"]
            first_done = min(i for (k, s, _, _), i in position.items()
                             if k == "AllReduceDone" and s == step)
            for b, params in enumerate(members):
                last_grad = max(position[("GradReady", step, b, p)] for p in params)
                assert last_grad < position[("BucketReady", step, b, None)] < first_done


def test_light_leaves_no_hook_installed_between_sampled_steps(runs: dict[int, Any]) -> None:
    for res in runs.values():
        cleared, user_hooks, user_calls, post_hooks, _, _ = res["residue-light:3"]
        assert all(cleared)  # step 7 is not sampled: every dict light made is uninstalled
        assert user_hooks == 1 and user_calls == STEPS  # the user's own hook stays and runs
        # none but the contract's canaries (on at most 2 parameters) and the every-step NaN
        # check's one hook (on the parameter ready last: See [Note: every step, one hook a
        # bucket]); a hook-less parameter between them
        hooks = [None if h is None else tuple(h) for h in post_hooks]
        assert set(hooks) <= {None, ("SyncContract",), ("BucketCheck",),
                              ("BucketCheck", "SyncContract")}, hooks
        assert None in hooks and sum(h is not None and "BucketCheck" in h for h in hooks) == 1


def test_watch_adds_no_forward_hook_and_close_restores_forward(runs: dict[int, Any]) -> None:
    # (a forward hook sends every call through nn.Module's slow path: See [Note: forward
    # wrapped, not hooked] in ddpviz/_watch/base.py)
    for res in runs.values():
        for level in WATCH_LEVELS:
            *_, module_hooks, wrapped_after_close = res["residue-" + level]
            assert module_hooks == 0 and not wrapped_after_close, level


def test_a_finding_under_light_makes_the_next_step_full(runs: dict[int, Any]) -> None:
    # light keeps nothing of an unsampled step (no hooks ran), so only the next one is full
    for res in runs.values():
        assert _steps(res["watch-light-finding"][1], "GradReady") == SAMPLED_FULL | {5}


def test_diagnosis_says_which_light_steps_have_no_gradient_events(runs: dict[int, Any]
                                                                    ) -> None:
    def found(run: str) -> list[Any]:
        events = [msgspec.convert(f, ev.ANY_EVENT) for res in runs.values()
                  for _, f in res[run][1]]
        return [f for f in diagnose_events(events) if f.field == "not_recorded"]

    (f,) = found("watch-light:3")  # steps 4, 5 and 7 unhooked; 7 is each rank's last forward
    assert f.severity == "info" and f.ranks == (0, 1)
    assert "no gradient events at 2 steps (4-5)" in f.title and "Recording.every" in f.detail[0]
    assert found("watch-params") == []


def test_diagnosis_says_which_steps_were_not_recorded(runs: dict[int, Any]) -> None:
    events = [msgspec.convert(f, ev.ANY_EVENT) for res in runs.values()
              for _, f in res["sampled:3"][1]]
    found = [f for f in diagnose_events(events) if f.field == "not_recorded"]
    assert len(found) == 1
    f = found[0]
    assert f.kind == "grad_order" and f.severity == "info" and f.ranks == (0, 1)
    assert "3 steps (4-5, 7)" in f.title and "Recording(every=1)" in f.fix
    full = [msgspec.convert(f, ev.ANY_EVENT) for res in runs.values() for _, f in res["full"][1]]
    assert not [f for f in diagnose_events(full) if f.field == "not_recorded"]


def test_old_detail_names_still_work_with_a_deprecation_naming_the_new_spelling(
        runs: dict[int, Any]) -> None:
    for rank, res in runs.items():
        recording, engine_level, caught = res["deprecated"]
        assert recording == "every=3", rank  # light:3 is the hook-less every=3
        assert engine_level == "sampled:100", rank  # light: no longer a ValueError here
        assert [c[0] for c in caught] == ["DeprecationWarning", "DeprecationWarning"], caught
        assert "watch() detail='light:3' is deprecated" in caught[0][1]
        assert "recording=ddpviz.Recording(guard=False, every=3)" in caught[0][1]
        assert "DistributedDataParallel() detail='light' is deprecated" in caught[1][1]
        assert "recording=ddpviz.Recording(guard=False, every=100)" in caught[1][1]
        assert all(c[2] == __file__ for c in caught), caught  # points at the caller's line


def test_the_strategy_is_chosen_from_the_recording(runs: dict[int, Any]) -> None:
    for res in runs.values():
        assert res["strategies"] == [("HooklessWatch", "every=100", False),
                                     ("ForwardsOnlyWatch", "every=never", False),
                                     ("GuardedWatch", "guard,every=100", True),
                                     ("HooklessWatch", "every=100", False)]  # new_watch(...)
