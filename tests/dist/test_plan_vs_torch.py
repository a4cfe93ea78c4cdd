"""The bucket planner against the buckets torch's real DDP reduces, on 2 gloo ranks.

Each case wraps a model in `torch.nn.parallel.DistributedDataParallel`, registers a comm hook
that records, per iteration, bucket.index() -> the DDP parameter indices of
bucket.parameters() (then all-reduces as usual), and runs 4 iterations. The parent compares
iteration 0 with `plan.initial` and each later iteration with `plan.rebuilt` (or `plan.initial`
where torch never rebuilds). All cases of one environment run inside one spawn.

Facts this file pins down (torch 2.13, measured):
- default, explicit bucket_cap_mb, bucket_cap_mb_list: iteration 0 uses the initial map and
  iterations 1+ the rebuilt map (rebuilt before the 2nd forward).
- static_graph=True: iterations 0 *and 1* use the initial map; the rebuilt map from iteration 2
  (rebuilt before the 3rd forward).
- find_unused_parameters=True: the initial map in every iteration.
- DDP_SET_LAST_BUCKET_CAP=1 is honoured by the rebuild as engine/buckets.py assumes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

ITERATIONS = 4


# --- models (module level: the spawned ranks import them) -------------------------------------


class MLP(nn.Module):
    """fc2.weight is exactly 1 MiB: the default rebuild's 1 MiB first bucket closes after it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        return self.head(h.mean(dim=(2, 3)))


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.mix = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.lm_head = nn.Linear(32, 64, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(torch.tanh(self.mix(self.embed(tokens)))))


class SparseEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16, sparse=True)
        self.proj = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.proj(self.embed(tokens).mean(dim=1))))


class MixedPrecision(nn.Module):
    """fp32 and bf16 layers interleaved: two bucket keys."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 64).to(torch.bfloat16)
        self.c = nn.Linear(64, 64)
        self.d = nn.Linear(64, 8).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x)).to(torch.bfloat16)
        h = torch.relu(self.b(h)).float()
        h = torch.relu(self.c(h)).to(torch.bfloat16)
        return self.d(h).float()


class Partial(nn.Module):
    """An ignored parameter, a frozen one and a branch that never runs (find_unused finds it)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.unused = nn.Linear(32, 32)
        self.mid = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)
        self.mid.weight.requires_grad_(False)
        self._ddp_params_and_buffers_to_ignore = ["inp.bias"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mid(torch.relu(self.inp(x)))))


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return {"mlp": MLP, "cnn": SmallCNN, "tied": TiedLM, "sparse": SparseEmbed,
            "mixed": MixedPrecision, "partial": Partial}[name]()


def make_input(name: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if name == "cnn":
        return torch.randn(4, 3, 8, 8, generator=g)
    if name in ("tied", "sparse"):
        return torch.randint(0, 64, (4, 6), generator=g)
    return torch.randn(4, 16, generator=g)


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), torch.zeros_like(out, dtype=torch.float32))


MODELS = ["mlp", "cnn", "tied", "sparse", "mixed"]
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "cap": {"bucket_cap_mb": 0.001},
    "cap_list": {"bucket_cap_mb_list": [0.0005, 0.002, 0.03]},
    "find_unused": {"find_unused_parameters": True},
    "find_unused_cap": {"find_unused_parameters": True, "bucket_cap_mb": 0.02},
    "static_graph": {"static_graph": True},
    "static_graph_cap": {"static_graph": True, "bucket_cap_mb": 0.001},
    "find_unused_cap_list": {"find_unused_parameters": True,
                             "bucket_cap_mb_list": [0.0005, 0.002, 0.03]},
    "static_graph_cap_list": {"static_graph": True, "bucket_cap_mb_list": [0.0005, 0.002, 0.03]},
}
# MLP is 1.07 MiB: with these caps (in MiB) it splits differently in every map.
MLP_SETTINGS: dict[str, dict[str, Any]] = {
    "mlp_cap_list_large": {"bucket_cap_mb_list": [0.5, 1.5]},
    "mlp_cap_1": {"bucket_cap_mb": 1},
    "mlp_find_unused_default_caps": {"find_unused_parameters": True, "bucket_cap_mb": None},
}
CASES = ([(m, s) for m in MODELS for s in SETTINGS] + [("mlp", s) for s in MLP_SETTINGS]
         + [("partial", s) for s in SETTINGS if "find_unused" in s or "static" in s])
ALL_SETTINGS = {**SETTINGS, **MLP_SETTINGS}


# --- the rank side ----------------------------------------------------------------------------


def _recording_hook(state, bucket):
    # (unannotated: torch rejects a string annotation that is not dist.GradBucket)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    position = state["position"]
    state["maps"][state["iteration"]].append(
        (bucket.index(), [position[id(p)] for p in bucket.parameters()]))
    buffer = bucket.buffer()
    if buffer.is_sparse:
        # gloo's sparse all_reduce returns a new tensor; average it and hand it back
        import torch.distributed as dist

        work = dist.all_reduce(buffer.coalesce(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0].div_(dist.get_world_size()))
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]


def _run_case(rank: int, model_name: str, settings: dict[str, Any]) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from ddpviz.engine.params import build_params_for_reducer

    model = make_model(model_name)
    ddp = DistributedDataParallel(model, **settings)
    torch_params, torch_sparse = ddp._build_params_for_reducer()
    ours = build_params_for_reducer(model)
    state: dict[str, Any] = {
        "position": {id(p): i for i, p in enumerate(torch_params)},
        "maps": [[] for _ in range(ITERATIONS)],
        "iteration": 0,
    }
    ddp.register_comm_hook(state, _recording_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for it in range(ITERATIONS):
        state["iteration"] = it
        opt.zero_grad()
        loss_of(ddp(make_input(model_name, 100 * it + rank))).backward()
        opt.step()
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "maps": [[indices for _, indices in recorded] for recorded in state["maps"]],
        "bucket_index": [[i for i, _ in recorded] for recorded in state["maps"]],
        "same_params_as_ddpviz": [id(e.param) for e in ours] == [id(p) for p in torch_params],
        "sparse": [bool(s) for s in torch_sparse],
        "names": [names[id(p)] for p in torch_params],
        "grad_ready_order": ddp._get_ddp_logging_data().get(
            "prev_iteration_grad_ready_order_indices", ""),
    }


def record_cases(rank: int, world_size: int, cases: list[tuple[str, str]]) -> dict[str, Any]:
    return {f"{m}/{s}": _run_case(rank, m, ALL_SETTINGS[s]) for m, s in cases}


# --- the comparison ---------------------------------------------------------------------------


def _expected(model_name: str, settings: dict[str, Any], set_last: bool) -> list[list[list[int]]]:
    from ddpviz import bucket_plan

    plan = bucket_plan(make_model(model_name), example_inputs=make_input(model_name, 0),
                       set_last_bucket_cap=set_last, **settings)
    initial = plan.bucket_indices("initial")
    if not plan.rebuilds:
        return [initial] * ITERATIONS
    rebuilt = plan.bucket_indices("rebuilt")
    # static_graph: the rebuild happens before the 3rd forward, not the 2nd
    first_rebuilt = 2 if settings.get("static_graph") else 1
    return [initial if it < first_rebuilt else rebuilt for it in range(ITERATIONS)]


def _mismatches(results: dict[int, dict[str, Any]], cases: list[tuple[str, str]],
                set_last: bool) -> list[str]:
    from ddpviz import bucket_plan

    failures = []
    for model_name, setting in cases:
        key = f"{model_name}/{setting}"
        settings = ALL_SETTINGS[setting]
        expected = _expected(model_name, settings, set_last)
        plan_names = [p.name for p in bucket_plan(make_model(model_name)).params]
        for rank, per_case in results.items():
            got = per_case[key]
            if not got["same_params_as_ddpviz"] or got["names"] != plan_names:
                failures.append(f"[{key}] rank {rank}: parameter list differs: torch "
                                f"{got['names']} vs ddpviz {plan_names}")
            for it, indices in enumerate(got["bucket_index"]):
                # the hook runs for buckets 0, 1, 2, ... in order, except static_graph's
                # iteration 0: its delayed all-reduce reports index 0 for every bucket
                want_index = ([0] * len(indices) if settings.get("static_graph") and it == 0
                              else list(range(len(indices))))
                if indices != want_index:
                    failures.append(f"[{key}] rank {rank} iteration {it}: hook saw bucket "
                                    f"indices {indices}, expected {want_index}")
            for it, (want, seen) in enumerate(zip(expected, got["maps"], strict=True)):
                if want != seen:
                    failures.append(f"[{key}{' DDP_SET_LAST_BUCKET_CAP=1' if set_last else ''}] "
                                    f"rank {rank} iteration {it}: torch {seen} != plan {want}")
    return failures


def _check(env: dict[str, str] | None, cases: list[tuple[str, str]]) -> dict[int, Any]:
    results = run_ranks(record_cases, 2, cases, timeout=120, env=env)
    failures = _mismatches(results, cases, set_last=bool(env))
    assert not failures, f"{len(failures)} mismatch(es):\n" + "\n".join(failures)
    return results


def test_plans_equal_torch_buckets_for_every_model_and_setting():
    results = _check(None, CASES)
    # the cases really exercise several buckets, a sparse bucket and two dtypes
    maps = results[0]
    assert len(maps["mlp/default"]["maps"][1]) == 2  # [1 MiB, 25 MiB] rebuild splits the MLP
    assert len(maps["mlp/default"]["maps"][0]) == 1
    assert len(maps["cnn/cap"]["maps"][1]) == 2 and len(maps["mixed/cap"]["maps"][1]) >= 3
    assert maps["partial/find_unused"]["names"] == ["inp.weight", "unused.weight",
                                                    "unused.bias", "mid.bias", "out.weight",
                                                    "out.bias"]
    assert maps["sparse/default"]["sparse"] == [True, False, False, False, False]
    assert len(maps["mixed/default"]["maps"][0]) == 2
    assert maps["tied/default"]["names"] == ["embed.weight", "mix.weight", "mix.bias",
                                             "norm.weight", "norm.bias"]
    # static_graph keeps the initial map one iteration longer than the default
    assert maps["cnn/static_graph_cap"]["maps"][1] == maps["cnn/static_graph_cap"]["maps"][0]
    assert maps["cnn/static_graph_cap"]["maps"][2] != maps["cnn/static_graph_cap"]["maps"][1]


def test_plans_equal_torch_buckets_with_set_last_bucket_cap():
    cases = [("mlp", "default"), ("mlp", "mlp_cap_list_large"), ("cnn", "cap"),
             ("cnn", "cap_list"), ("mixed", "cap"), ("sparse", "cap"), ("cnn", "static_graph_cap"),
             ("mlp", "find_unused")]
    results = _check({"DDP_SET_LAST_BUCKET_CAP": "1"}, cases)
    # the small first bucket really moved to the end of the rebuilt MLP map
    rebuilt = results[0]["mlp/default"]["maps"][1]
    assert len(rebuilt) == 2 and 2 in rebuilt[-1]  # fc2.weight (1 MiB) closes the small bucket
