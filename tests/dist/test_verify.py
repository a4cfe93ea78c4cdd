"""verify_module_across_ranks on real gloo ranks: one defect planted on one rank at a time.

Each spawn runs every scenario in turn on the same process group (the exchange has a fixed
shape, so a failed verification leaves the group usable). What must hold: a correct model costs
exactly one collective; any defect makes EVERY rank raise RankMismatchError with the same
message naming exactly what differs; no rank hangs or crashes. Torch's own DDP on the shape
defect is run too, as the baseline ddpviz must beat.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from ddpviz.engine.verify import verify_module_across_ranks
from ddpviz.errors import RankMismatchError
from ddpviz.events import Tap
from tests.dist.harness import RankFailed, run_ranks

pytestmark = pytest.mark.dist

DEFECTS = ("none", "extra", "renamed", "order", "shape", "stride", "dtype", "requires_grad",
           "device", "buffer", "ignored")


class Net(nn.Module):
    """Parameters: conv.weight 0, conv.bias 1, fc1.weight 2, fc1.bias 3, fc2.weight 4,
    fc2.bias 5, bn.weight 6, bn.bias 7. Buffers: stats 0, then bn's three."""

    def __init__(self, defect: str, odd: bool) -> None:
        super().__init__()
        d = defect if odd else "none"
        self.register_buffer("stats", torch.zeros(4 if d == "buffer" else 3))
        self.conv = nn.Conv2d(3, 4, 3)
        fc1, fc2 = nn.Linear(8, 16), nn.Linear(16, 5 if d in ("shape", "ignored") else 4)
        if d == "order":
            self.fc2 = fc2
            self.fc1 = fc1
        else:
            self.fc1 = fc1
            if d == "extra":
                self.extra = nn.Linear(16, 16)
            self.add_module("head" if d == "renamed" else "fc2", fc2)
        self.bn = nn.BatchNorm1d(4)
        if d == "stride":
            w = self.conv.weight.detach().to(memory_format=torch.channels_last)
            self.conv.weight = nn.Parameter(w)
        if d == "dtype":
            self.fc1.to(torch.bfloat16)
        if d == "requires_grad":
            self.fc1.bias.requires_grad_(False)
        if d == "device":
            self.fc1.to("meta")
        if defect == "ignored":  # on every rank: the differing fc2 is ignored, so it passes
            self._ddp_params_and_buffers_to_ignore = ["fc2.weight", "fc2.bias"]


def _split(usual: str, odd_value: str, world_size: int, odd: int) -> tuple[Any, ...]:
    """Grouped values: the usual value on all ranks but `odd`, most common first."""
    others = tuple(r for r in range(world_size) if r != odd)
    groups = [(usual, others), (odd_value, (odd,))]
    if len(others) == 1:
        groups.sort(key=lambda g: g[1][0])
    return tuple(groups)


def expected(defect: str, world_size: int, odd: int) -> list[tuple[Any, ...]]:
    """(kind, index, name, field, grouped values) of every mismatch, in report order."""
    s = lambda usual, value: _split(usual, value, world_size, odd)  # noqa: E731
    return {
        "none": [],
        "ignored": [],
        "extra": [("count", -1, "parameters", "count", s("8", "10")),
                  ("param", 4, "extra.weight", "present", s("missing", "present")),
                  ("param", 5, "extra.bias", "present", s("missing", "present"))],
        "renamed": [("param", 4, "fc2.weight", "name", s("'fc2.weight'", "'head.weight'")),
                    ("param", 5, "fc2.bias", "name", s("'fc2.bias'", "'head.bias'"))],
        "order": [("param", 2, "fc1.weight", "order", s("2", "4")),
                  ("param", 3, "fc1.bias", "order", s("3", "5")),
                  ("param", 4, "fc2.weight", "order", s("4", "2")),
                  ("param", 5, "fc2.bias", "order", s("5", "3"))],
        "shape": [("param", 4, "fc2.weight", "shape", s("(4, 16)", "(5, 16)")),
                  ("param", 5, "fc2.bias", "shape", s("(4,)", "(5,)"))],
        "stride": [("param", 0, "conv.weight", "stride", s("(27, 9, 3, 1)", "(27, 1, 9, 3)"))],
        "dtype": [("param", 2, "fc1.weight", "dtype", s("float32", "bfloat16")),
                  ("param", 3, "fc1.bias", "dtype", s("float32", "bfloat16"))],
        "requires_grad": [("param", 3, "fc1.bias", "requires_grad", s("True", "False"))],
        "device": [("param", 2, "fc1.weight", "device", s("cpu", "meta")),
                   ("param", 3, "fc1.bias", "device", s("cpu", "meta"))],
        "buffer": [("buffer", 0, "stats", "shape", s("(3,)", "(4,)"))],
    }[defect]


def _odd_rank(defect: str, world_size: int) -> int:
    return 0 if defect == "dtype" else world_size - 1  # rank 0 is not special either


def _collectives(prof: Any) -> list[str]:
    return sorted(e.name for e in prof.events() if e.name.startswith("gloo:"))


def scenarios(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for defect in DEFECTS:
        torch.manual_seed(0)
        model = Net(defect, rank == _odd_rank(defect, world_size))
        events: list[Any] = []
        with torch.profiler.profile() as prof:
            try:
                report = verify_module_across_ranks(model, tap=Tap(events.append, rank))
                result: dict[str, Any] = {"raised": None, "ok": report.ok,
                                          "collectives": report.collectives}
            except RankMismatchError as e:
                result = {"raised": "RankMismatchError", "message": str(e),
                          "mismatches": [(m.kind, m.index, m.name, m.field, m.values)
                                         for m in e.report.mismatches],
                          "collectives": e.report.collectives,
                          "n_metadata": len(e.report.metadata)}
            except Exception as e:  # reported, so that the test names the crash
                result = {"raised": repr(e)}
        result["profiled"] = _collectives(prof)
        result["events"] = [(type(e).__name__, getattr(e, "mismatches", None)) for e in events]
        out[defect] = result
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def world(request: pytest.FixtureRequest) -> tuple[int, dict[int, dict[str, Any]]]:
    return request.param, run_ranks(scenarios, request.param, timeout=120)


def test_a_correct_model_passes_with_one_collective(
        world: tuple[int, dict[int, dict[str, Any]]]) -> None:
    _, results = world
    for rank, r in results.items():
        for defect in ("none", "ignored"):
            assert r[defect]["raised"] is None and r[defect]["ok"], (rank, defect, r[defect])
            assert r[defect]["collectives"] == 1
            assert r[defect]["profiled"] == ["gloo:all_gather"]
            assert [name for name, _ in r[defect]["events"]] == [
                "VerificationStarted", "VerificationPassed"]


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d not in ("none", "ignored")])
def test_every_rank_raises_naming_exactly_the_defect(
        world: tuple[int, dict[int, dict[str, Any]]], defect: str) -> None:
    world_size, results = world
    odd = _odd_rank(defect, world_size)
    want = expected(defect, world_size, odd)
    messages = set()
    for rank, r in results.items():
        got = r[defect]
        assert got["raised"] == "RankMismatchError", (rank, got)
        assert got["mismatches"] == want, rank
        assert got["collectives"] == 2 and got["n_metadata"] == world_size
        assert got["profiled"] == ["gloo:all_gather", "gloo:all_gather"]
        assert got["events"] == [("VerificationStarted", None),
                                 ("VerificationFailed", tuple(
                                     _as_struct(m) for m in want))]
        messages.add(got["message"])
    assert len(messages) == 1  # every rank says the same thing
    message = messages.pop()
    assert message.startswith("ddpviz: ") and f"world_size={world_size}" in message
    for _, _, name, _, _ in want:
        assert f"'{name}'" in message or name == "parameters"
        assert f"rank {odd}:" in message
    assert message.endswith("look for rank-dependent construction.")


def _as_struct(m: tuple[Any, ...]) -> Any:
    from ddpviz.events import Mismatch

    return Mismatch(*m)


def test_shape_message_reads_like_house_style(
        world: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world_size, results = world
    others = ",".join(str(r) for r in range(world_size - 1))
    label = f"rank {others}:" if world_size == 2 else f"ranks {others}:"
    odd = f"rank {world_size - 1}:".ljust(len(label))
    assert results[0]["shape"]["message"] == "\n".join([
        f"ddpviz: the model differs across ranks in 2 places (world_size={world_size}):",
        "parameter 4 'fc2.weight' differs across ranks:",
        f"  {label} shape=(4, 16) dtype=float32",
        f"  {odd} shape=(5, 16) dtype=float32",
        "parameter 5 'fc2.bias' differs across ranks:",
        f"  {label} shape=(4,) dtype=float32",
        f"  {odd} shape=(5,) dtype=float32",
        "All ranks must build the same model; look for rank-dependent construction.",
    ])


# --- torch's baseline on the same defect ----------------------------------------------------


def torch_ddp_on_shape_defect(rank: int, world_size: int) -> str:
    torch.manual_seed(0)
    nn.parallel.DistributedDataParallel(Net("shape", rank == world_size - 1))
    return "constructed"


def test_torch_fails_on_one_rank_only_where_ddpviz_names_the_parameter_everywhere() -> None:
    # ddp-facts.md, "How torch fails": one shape differs -> only the odd rank's verification
    # errors; rank 0 compares rank 0's sizes with its own, passes, and goes on into the state
    # broadcast, where it fails only when the peer's connection closes (or at the timeout).
    results = run_ranks(torch_ddp_on_shape_defect, 2, timeout=60, allow_failures=True)
    assert isinstance(results[0], RankFailed) and isinstance(results[1], RankFailed)
    odd_text, rank0_text = results[1].failures[1], results[0].failures[0]
    assert "appears not to match" in odd_text
    assert "appears not to match" not in rank0_text and "_sync_module_states" in rank0_text
    assert "fc2" not in odd_text and "fc2" not in rank0_text  # torch never names it
