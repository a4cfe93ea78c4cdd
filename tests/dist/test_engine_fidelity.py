"""ddpviz.DistributedDataParallel against torch's own DDP, on real gloo process groups.

Inside the same rank processes, both implementations start from the same state (rank-dependent
initial values, so the constructor's broadcast matters), see the same per-rank batches and run
one after the other on the shared process group. Compared, per case and per rank:
- gradients, parameters and buffers BITWISE after each of 5 SGD steps (first difference named),
  with the built-in reduction, and for 3 steps through a Python comm hook;
- which parameters' gradients share storage (gradient_as_bucket_view makes them bucket views);
- the bucket maps of iterations 0, 1 and 2 seen by a recording comm hook (it then calls the
  case's hook, allreduce_hook by default), and ddpviz's `bucket_indices()` after each backward;
- the collectives (op, dtype, numel, in order) issued during training, and the constructor's
  state broadcast. The constructor's verification is deliberately different: torch all-gathers
  the parameter count and broadcasts rank 0's sizes and strides (an all_gather int64[1] and a
  broadcast int64[...] before the state broadcast); ddpviz exchanges digests of every rank's
  metadata so it can name what differs. So only the state-broadcast collectives are compared:
  torch's constructor minus its two verification collectives must be the tail of ddpviz's.

One spawn per group of cases (a spawn costs seconds on 2 cores); the tests are per case and read
the group's cached results. `DDPVIZ_FIDELITY_CANDIDATE=torch` points the candidate at torch's
DDP itself (the suite then passes trivially) and `=package.module:Class` at any DDP-like class
(e.g. a deliberately broken one): both check the suite, not ddpviz.
"""

from __future__ import annotations

import copy
import math
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    fp16_compress_hook,
)

from tests.dist.collectives import Collective, CollectiveRecorder, first_difference
from tests.dist.harness import RankFailed, run_ranks
from tests.dist.models import ZOO

pytestmark = pytest.mark.dist

CANDIDATE = os.environ.get("DDPVIZ_FIDELITY_CANDIDATE", "ddpviz")
STEPS = 5  # SGD steps compared bitwise
MAP_ITERATIONS = 3  # iterations whose bucket maps are compared (covers static_graph's rebuild)
SEED = 1234


class Setting(NamedTuple):
    """DDP constructor keywords plus how the training loop drives it."""

    kwargs: dict[str, Any]
    hook: str | None = None  # comm hook registered after construction
    micro_steps: int = 0  # no_sync micro-steps before each synced one
    unused_aux: bool = False  # the aux head is skipped on some ranks/steps


SETTINGS: dict[str, Setting] = {
    "default": Setting({}),
    "caps": Setting({"bucket_cap_mb": 0.002}),  # 2 KiB: several buckets per model and dtype
    "cap_list": Setting({"bucket_cap_mb_list": [0.002, 0.004, 0.3]}),
    "find_unused": Setting({"find_unused_parameters": True}, unused_aux=True),
    "static_graph": Setting({"static_graph": True}),
    "grad_view": Setting({"gradient_as_bucket_view": True, "bucket_cap_mb": 0.002}),
    "no_sync": Setting({}, micro_steps=2),
    "fp16_hook": Setting({"bucket_cap_mb": 0.002}, hook="fp16"),
}

HOOKS: dict[str, Callable[..., Any]] = {"fp16": fp16_compress_hook}

# The aux head's use per step: globally unused, used by rank 0 only, used, unused, used by the
# others only. Exercises the used-map all-reduce with partial use across ranks.
_AUX_PATTERN: tuple[Callable[[int], bool], ...] = (
    lambda r: False, lambda r: r == 0, lambda r: True, lambda r: False, lambda r: r != 0,
)


class Case(NamedTuple):
    model: str
    setting: str
    world_size: int

    @property
    def id(self) -> str:
        return f"{self.model}-{self.setting}-ws{self.world_size}"


def _group(world_size: int, pairs: list[tuple[str, str]]) -> list[Case]:
    return [Case(m, s, world_size) for m, s in pairs]


# Every model with the default settings; every setting with the MLP and another model; each
# case once. A representative subset on 3 ranks (a 3-rank ring sums in a position-dependent
# order, so a bucket layout difference shows up in the bits), the others on 2 (cheaper on 2
# cores). No case runs at both: the engine depends on the world size only as 1 vs more, so
# 2 ranks add no path to 3.
GROUPS: dict[str, list[Case]] = {
    "ws2": _group(2, [
        ("sparse_embed", "caps"), ("mlp", "caps"), ("mlp", "cap_list"),
        ("cnn_bn", "find_unused"), ("cnn_bn", "grad_view"), ("cnn_bn", "no_sync"),
        ("mixed_bf16", "fp16_hook"),
    ]),
    "ws3": _group(3, [(m, "default") for m in ZOO] + [
        ("mixed_bf16", "caps"), ("cnn_bn", "cap_list"), ("mlp", "find_unused"),
        ("mlp", "static_graph"), ("tied_lm", "static_graph"), ("mlp", "no_sync"),
        ("mlp", "grad_view"), ("mlp", "fp16_hook"),
    ]),
}
CASES = [(g, c) for g, cases in GROUPS.items() for c in cases]
CHECKS = ("params", "buffers", "hook_params", "grad_storage", "bucket_maps", "bucket_indices",
          "ctor_state_broadcast", "training_collectives")


# --- rank side ----------------------------------------------------------------------------------


def _ddp_classes(candidate: str) -> tuple[type, type]:
    torch_ddp = torch.nn.parallel.DistributedDataParallel
    if candidate == "torch":
        return torch_ddp, torch_ddp
    if ":" in candidate:  # "package.module:Class", e.g. a deliberately broken DDP
        import importlib

        module_name, _, attr = candidate.partition(":")
        return torch_ddp, getattr(importlib.import_module(module_name), attr)
    import ddpviz

    cls = getattr(ddpviz, "DistributedDataParallel", None)
    if cls is None:
        raise RuntimeError("ddpviz.DistributedDataParallel does not exist: the engine under test "
                           "is missing (ddpviz/engine/ddp.py must export it via ddpviz).")
    return torch_ddp, cls


class Snapshot(NamedTuple):
    """What one step left behind on one rank."""

    grads: dict[str, torch.Tensor | None]  # after the synced backward, before the step
    params: dict[str, torch.Tensor]  # after the optimizer step
    buffers: dict[str, torch.Tensor]


class TrainRun(NamedTuple):
    snapshots: list[Snapshot]
    ctor_calls: list[Collective]
    train_calls: list[Collective]
    grad_storage: list[list[str]]  # parameter names grouped by shared gradient storage
    bucket_indices: list[list[list[int]] | str | None]  # per step, from ddp.bucket_indices()


def _grads(module: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.detach().clone()
            for n, p in module.named_parameters()}


def _snapshot(grads: dict[str, torch.Tensor | None], module: nn.Module) -> Snapshot:
    return Snapshot(grads, {n: p.detach().clone() for n, p in module.named_parameters()},
                    {n: b.detach().clone() for n, b in module.named_buffers()})


def _use_aux(setting: Setting, rank: int, step: int) -> bool:
    return _AUX_PATTERN[step % len(_AUX_PATTERN)](rank) if setting.unused_aux else True


def _grad_storage_groups(module: nn.Module) -> list[list[str]]:
    groups: dict[Any, list[str]] = {}
    for name, p in module.named_parameters():
        g = p.grad
        if g is None:
            key: Any = ("none", name)
        elif g.is_sparse:
            key = ("sparse", name)
        else:
            key = g.untyped_storage().data_ptr()
        groups.setdefault(key, []).append(name)
    return sorted(groups.values())


def _bucket_indices(ddp: Any, candidate_side: bool) -> list[list[int]] | str | None:
    """ddpviz's current map; None on torch (it has no bucket_indices(); the hook shows its
    maps); a message if the candidate lacks the method."""
    if not candidate_side or CANDIDATE == "torch":
        return None
    if not callable(getattr(ddp, "bucket_indices", None)):
        return f"{type(ddp).__qualname__} has no bucket_indices()"
    return [list(b) for b in ddp.bucket_indices()]


def _train(cls: type, case: Case, base: nn.Module, rank: int, candidate_side: bool) -> TrainRun:
    zoo, setting = ZOO[case.model], SETTINGS[case.setting]
    module = copy.deepcopy(base)
    snapshots: list[Snapshot] = []
    indices: list[list[list[int]] | str | None] = []
    with CollectiveRecorder() as rec:
        ddp = cls(module, **setting.kwargs)
        ctor_calls = rec.take()
        if setting.hook:
            ddp.register_comm_hook(None, HOOKS[setting.hook])
        opt = torch.optim.SGD(module.parameters(), lr=0.05)
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            aux = _use_aux(setting, rank, step)
            for micro in range(setting.micro_steps):
                with ddp.no_sync():
                    batch = zoo.batch(SEED, rank, 100 + step * 10 + micro)
                    zoo.loss(ddp, batch, aux).backward()
            zoo.loss(ddp, zoo.batch(SEED, rank, step), aux).backward()
            indices.append(_bucket_indices(ddp, candidate_side))
            grads = _grads(module)
            opt.step()
            snapshots.append(_snapshot(grads, module))
        train_calls = rec.take()
    return TrainRun(snapshots, ctor_calls, train_calls, _grad_storage_groups(module), indices)


class MapRun(NamedTuple):
    maps: list[list[list[int]]]  # per iteration: param indices per bucket, by bucket.index()
    firing: list[list[int]]  # per iteration: bucket.index() in the order the hook was called
    bucket_indices: list[list[list[int]] | str | None]
    snapshots: list[Snapshot]  # training through the recording hook (the comm-hook path)


def _observe_buckets(cls: type, case: Case, base: nn.Module, rank: int,
                     candidate_side: bool) -> MapRun:
    """Iterations 0..MAP_ITERATIONS-1 with a recording comm hook around the case's hook."""
    zoo, setting = ZOO[case.model], SETTINGS[case.setting]
    module = copy.deepcopy(base)
    ddp = cls(module, **setting.kwargs)
    index_of = {p.data_ptr(): i for i, p in enumerate(module.parameters())}
    inner = HOOKS[setting.hook] if setting.hook else allreduce_hook
    seen: list[dict[int, list[int]]] = []
    firing: list[list[int]] = []

    # Unannotated: torch's _check_comm_hook rejects string annotations (this module has
    # `from __future__ import annotations`).
    def recording_hook(process_group, bucket):
        seen[-1][bucket.index()] = [index_of[p.data_ptr()] for p in bucket.parameters()]
        firing[-1].append(bucket.index())
        return inner(process_group, bucket)

    ddp.register_comm_hook(None, recording_hook)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    indices: list[list[list[int]] | str | None] = []
    snapshots: list[Snapshot] = []
    for step in range(MAP_ITERATIONS):
        opt.zero_grad(set_to_none=True)
        aux = _use_aux(setting, rank, step)
        for micro in range(setting.micro_steps):
            with ddp.no_sync():
                zoo.loss(ddp, zoo.batch(SEED, rank, 100 + step * 10 + micro), aux).backward()
        seen.append({})
        firing.append([])
        zoo.loss(ddp, zoo.batch(SEED, rank, step), aux).backward()
        indices.append(_bucket_indices(ddp, candidate_side))
        grads = _grads(module)
        opt.step()
        snapshots.append(_snapshot(grads, module))
    maps = [[m[i] for i in sorted(m)] for m in seen]
    return MapRun(maps, firing, indices, snapshots)


def _tensor_difference(kind: str, name: str, a: torch.Tensor | None,
                       b: torch.Tensor | None) -> str | None:
    if a is None or b is None:
        return None if a is None and b is None else (
            f"{kind} '{name}': torch {'None' if a is None else 'set'}, "
            f"ddpviz {'None' if b is None else 'set'}")
    if a.is_sparse or b.is_sparse:
        if a.is_sparse != b.is_sparse:
            return f"{kind} '{name}': torch layout {a.layout}, ddpviz {b.layout}"
        a, b = a.to_dense(), b.to_dense()
    if a.dtype != b.dtype or a.shape != b.shape:
        return (f"{kind} '{name}': torch {a.dtype}{list(a.shape)}, "
                f"ddpviz {b.dtype}{list(b.shape)}")
    if torch.equal(a, b):
        return None
    diff = (a.double() - b.double()).abs()
    n = int((a != b).sum())
    return (f"{kind} '{name}': {n} of {a.numel()} elements differ, max |diff| "
            f"{float(diff.max()):.3g}")


def _first_state_difference(ref: list[Snapshot], cand: list[Snapshot],
                            field: str) -> str | None:
    for step, (s_ref, s_cand) in enumerate(zip(ref, cand, strict=True)):
        # Gradients come before parameters in time: report the earliest cause.
        kinds = ("grads", "params") if field == "params" else (field,)
        for kind in kinds:
            a, b = getattr(s_ref, kind), getattr(s_cand, kind)
            if a.keys() != b.keys():
                return f"step {step}: {kind} names differ: {sorted(a)} vs {sorted(b)}"
            for name in a:
                d = _tensor_difference(kind[:-1], name, a[name], b[name])
                if d:
                    return f"step {step}: {d}"
    return None


def _ctor_state_difference(ref: list[Collective], cand: list[Collective]) -> str | None:
    verification = ref[:2]
    if (len(ref) < 2 or verification[0][:2] != ("allgather", "int64")
            or verification[1][:2] != ("broadcast", "int64")):
        return ("torch's constructor no longer starts with all_gather int64 + broadcast int64 "
                f"(its shape verification); the test's assumption is out of date: "
                f"{[str(c) for c in ref]}")
    state = ref[2:]
    tail = cand[len(cand) - len(state):] if len(cand) >= len(state) else cand
    d = first_difference(state, tail)
    if d:
        return (f"state broadcast: {d} (torch's constructor: {[str(c) for c in ref]}, "
                f"ddpviz's: {[str(c) for c in cand]})")
    return None


def _map_difference(ref: MapRun, cand: MapRun, cand_train: TrainRun) -> dict[str, str | None]:
    maps: str | None = None
    for it in range(MAP_ITERATIONS):
        if ref.maps[it] != cand.maps[it]:
            maps = f"iteration {it}: torch {ref.maps[it]} vs ddpviz {cand.maps[it]}"
            break
        if ref.firing[it] != cand.firing[it]:
            maps = (f"iteration {it}: hook called for buckets {ref.firing[it]} on torch, "
                    f"{cand.firing[it]} on ddpviz")
            break
    indices: str | None = None
    for label, got in (("with a comm hook", cand.bucket_indices),
                       ("without a hook", cand_train.bucket_indices[:MAP_ITERATIONS])):
        for it, bi in enumerate(got):
            if isinstance(bi, str):
                indices = bi
                break
            if bi is not None and bi != ref.maps[it]:
                indices = (f"{label}, iteration {it}: bucket_indices() {bi}, torch's hook saw "
                           f"{ref.maps[it]}")
                break
        if indices:
            break
    return {"bucket_maps": maps, "bucket_indices": indices}


def _compare_case(case: Case, rank: int, classes: tuple[type, type]) -> dict[str, str | None]:
    torch_cls, cand_cls = classes
    base = ZOO[case.model].build(seed=SEED + 17 * rank)  # rank-dependent: the broadcast matters
    ref = _train(torch_cls, case, base, rank, candidate_side=False)
    cand = _train(cand_cls, case, base, rank, candidate_side=True)
    ref_maps = _observe_buckets(torch_cls, case, base, rank, candidate_side=False)
    cand_maps = _observe_buckets(cand_cls, case, base, rank, candidate_side=True)
    out: dict[str, str | None] = {
        "params": _first_state_difference(ref.snapshots, cand.snapshots, "params"),
        "buffers": _first_state_difference(ref.snapshots, cand.snapshots, "buffers"),
        "hook_params": _first_state_difference(ref_maps.snapshots, cand_maps.snapshots,
                                               "params"),
        "grad_storage": None if ref.grad_storage == cand.grad_storage else (
            f"gradients sharing storage: torch {ref.grad_storage} vs ddpviz "
            f"{cand.grad_storage}"),
        "ctor_state_broadcast": _ctor_state_difference(ref.ctor_calls, cand.ctor_calls),
        "training_collectives": first_difference(ref.train_calls, cand.train_calls),
    }
    out.update(_map_difference(ref_maps, cand_maps, cand))
    return out


def _rank_main(rank: int, world_size: int, cases: list[Case],
               candidate: str) -> dict[str, dict[str, str | None]]:
    classes = _ddp_classes(candidate)
    results: dict[str, dict[str, str | None]] = {}
    for case in cases:
        try:
            results[case.id] = _compare_case(case, rank, classes)
        except Exception as e:  # recorded per case; the next case still runs
            msg = f"raised {type(e).__name__}: {e}".splitlines()[0]
            results[case.id] = dict.fromkeys(CHECKS, msg)
    return results


def _inside_c10d_op(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("c10d::"):
            return True
        parent = parent.cpu_parent
    return False


def _rank_recorder_vs_profiler(rank: int, world_size: int,
                               candidate: str) -> dict[str, str | None]:
    """The recorder's view of both DDPs against torch.profiler's: the op sequence of the
    profiler's `c10d::` events (issuing thread, in order, no shapes) and the multiset of its
    `gloo:*` events' (op, numel) (worker threads, so unordered)."""
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, str | None] = {}
    for label, cls in zip(("torch", "ddpviz"), _ddp_classes(candidate), strict=True):
        for model in ("cnn_bn", "mixed_bf16"):
            case = Case(model, "default", world_size)
            base = ZOO[model].build(seed=SEED + rank)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                run = _train(cls, case, base, rank, candidate_side=False)
            calls = run.ctor_calls + run.train_calls
            events = sorted(prof.events(), key=lambda e: e.time_range.start)
            # Under the recorder's dispatch mode the profiler sees each c10d op twice, the
            # second nested in the first (the mode re-dispatches it): count the outer ones.
            ops = [e.name.partition("::")[2].rstrip("_") for e in events
                   if e.name.startswith("c10d::") and not _inside_c10d_op(e)]
            seen = Counter((e.name.removeprefix("gloo:").replace("_", ""),
                            math.prod(e.input_shapes[0])) for e in events
                           if e.name.startswith("gloo:"))
            mine = Counter((c.op, c.numel) for c in calls)
            problems = []
            if ops != [c.op for c in calls]:
                problems.append(f"ops: profiler {ops} vs recorder {[c.op for c in calls]}")
            if seen != mine or not calls:
                problems.append(f"(op, numel): profiler {sorted(seen.items())} vs recorder "
                                f"{sorted(mine.items())}")
            out[f"{label} {model}"] = "; ".join(problems) or None
    return out


# --- test side ----------------------------------------------------------------------------------

_RESULTS: dict[str, dict[int, Any] | RankFailed] = {}


def _results(group: str) -> dict[int, dict[str, dict[str, str | None]]]:
    if group not in _RESULTS:
        cases = GROUPS[group]
        try:
            _RESULTS[group] = run_ranks(_rank_main, cases[0].world_size, cases, CANDIDATE,
                                        timeout=150)
        except RankFailed as e:
            _RESULTS[group] = e
    got = _RESULTS[group]
    if isinstance(got, RankFailed):
        pytest.fail(f"the ranks of case group {group!r} failed:\n{got}", pytrace=False)
    return got


def _check(group: str, case: Case, check: str) -> None:
    per_rank = _results(group)
    failures = {r: res[case.id][check] for r, res in sorted(per_rank.items())
                if res[case.id][check] is not None}
    if failures:
        lines = [f"rank {r}: {msg}" for r, msg in failures.items()]
        pytest.fail(f"{case.id}: '{check}' does not match torch's DDP\n" + "\n".join(lines),
                    pytrace=False)


def _params(cases: list[tuple[str, Case]]) -> Any:
    return pytest.mark.parametrize(("group", "case"), cases, ids=[c.id for _, c in cases])


@_params(CASES)
def test_parameters_and_gradients_bitwise_equal(group: str, case: Case) -> None:
    _check(group, case, "params")


@_params(CASES)
def test_parameters_bitwise_equal_through_a_comm_hook(group: str, case: Case) -> None:
    """The run that records bucket maps trains through a Python comm hook (allreduce_hook or
    the case's hook): GradBucket's buffer, future and write-back must match torch's too."""
    _check(group, case, "hook_params")


@_params([(g, c) for g, c in CASES if c.model == "cnn_bn"])
def test_buffers_bitwise_equal(group: str, case: Case) -> None:
    _check(group, case, "buffers")


@_params(CASES)
def test_gradients_share_storage_like_torch(group: str, case: Case) -> None:
    _check(group, case, "grad_storage")


@_params(CASES)
def test_bucket_maps_of_iterations_0_to_2(group: str, case: Case) -> None:
    _check(group, case, "bucket_maps")


@_params(CASES)
def test_bucket_indices_match_torch_maps(group: str, case: Case) -> None:
    _check(group, case, "bucket_indices")


@_params(CASES)
def test_constructor_state_broadcast_collectives(group: str, case: Case) -> None:
    _check(group, case, "ctor_state_broadcast")


@_params(CASES)
def test_training_collectives_in_order(group: str, case: Case) -> None:
    _check(group, case, "training_collectives")


def test_collective_recorder_agrees_with_the_profiler() -> None:
    """The instrument itself: what CollectiveRecorder sees of torch's C++ reducer and of
    ddpviz's Python engine is what torch.profiler sees (buffer broadcasts, bucket all-reduces,
    rebuild broadcasts, two dtypes)."""
    results = run_ranks(_rank_recorder_vs_profiler, 2, CANDIDATE, timeout=120)
    problems = [f"rank {r} {what}: {msg}" for r, res in sorted(results.items())
                for what, msg in res.items() if msg]
    assert not problems, "\n".join(problems)
