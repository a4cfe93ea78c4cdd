"""The replica check's pieces without processes: bitwise digests (probes/digest.py) and the
verdict in words (probes/replica_verdict.py). The multi-rank behaviour: tests/dist/
test_replicas.py."""

from __future__ import annotations

import pytest
import torch

from ddpviz.findings import Finding
from ddpviz.probes.digest import NO_TENSOR, digest_tensors
from ddpviz.probes.replica_verdict import RankState, judge
from ddpviz.recording import Recording


def _rows(*tensors: torch.Tensor | None) -> list[tuple[int, int]]:
    d, _ = digest_tensors(list(tensors))
    return [(int(a), int(b)) for a, b in d.tolist()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16])
def test_a_digest_sees_every_bit(dtype: torch.dtype) -> None:
    base = torch.tensor([1.0, 0.0, 2.0, 3.0], dtype=dtype)
    signed = torch.tensor([1.0, -0.0, 2.0, 3.0], dtype=dtype)  # == base, other bits
    swapped = torch.tensor([2.0, 0.0, 1.0, 3.0], dtype=dtype)  # same words, other order
    nan = torch.tensor([float("nan")] * 4, dtype=dtype)
    payload = nan.clone()
    ints = payload.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[payload.element_size()])
    ints[1] += 1  # another NaN payload: still NaN, other bits
    assert torch.equal(base, signed) and torch.isnan(payload).all()
    rows = _rows(base, signed, swapped, nan, payload, base.clone())
    assert len(set(rows[:5])) == 5
    assert rows[5] == rows[0]


def test_a_tensors_digest_does_not_depend_on_the_others_digested_with_it() -> None:
    t = torch.randn(7)
    alone = _rows(t)[0]
    assert _rows(torch.randn(3), None, torch.zeros(0), t)[-1] == alone
    assert _rows(torch.randn(3), None, torch.zeros(0), t)[1:3] == [NO_TENSOR, NO_TENSOR]
    assert _rows(t.double(), t)[1] == alone  # (another dtype: another group)


def test_sizes_are_norms_per_tensor_and_a_nan_stays_in_its_tensor() -> None:
    _, stats = digest_tensors([torch.tensor([3.0, float("nan")]), torch.tensor([3.0, -4.0]),
                               torch.tensor([7], dtype=torch.int64)])
    assert stats is not None
    assert torch.isnan(stats[0]).all()
    assert stats[1:].tolist() == [[5.0, 7.0], [0.0, 0.0]]


def _state(params: list[int], grads: list[int] | None = None, buffers: tuple[int, ...] = (),
           synced: bool = True) -> RankState:
    def pairs(xs: list[int]) -> list[tuple[int, int]]:
        return [(x, x) for x in xs]

    return RankState(params=pairs(params), param_stats=[(float(x), float(x)) for x in params],
                     grads=None if grads is None else pairs(grads),
                     grad_stats=None if grads is None else [(0.0, 0.0)] * len(grads),
                     buffers=pairs(list(buffers)), buffer_stats=[(0.0, 0.0)] * len(buffers),
                     buffer_names=[f"b{i}" for i in range(len(buffers))], synced=synced)


NAMES = ["w", "v"]


def _judge(states: dict[int, RankState], *, broadcast_buffers: bool = True,
           last_agreed: int = 4, step: int = 5) -> Finding:
    found = judge(step, states, param_names=NAMES, broadcast_buffers=broadcast_buffers,
                  last_agreed=last_agreed, precise=False, world_size=len(states))
    assert found is not None, "no finding"
    return found


def test_equal_replicas_are_not_a_finding() -> None:
    assert judge(5, {r: _state([1, 2], [3, 4], (5,)) for r in range(3)}, param_names=NAMES,
                 broadcast_buffers=True, last_agreed=4, precise=False, world_size=3) is None


def test_the_odd_rank_its_tensor_and_the_optimizer_are_named() -> None:
    f = _judge({0: _state([1, 2], [3, 4]), 1: _state([1, 9], [3, 4]), 2: _state([1, 2], [3, 4])})
    assert f.kind == "replicas_diverged" and f.severity == "error"
    assert f.ranks == (1,) and f.name == "v" and f.param == 1
    assert [rs for _, rs in f.values] == [(0, 2), (1,)]
    text = f.text()
    assert "first differing after step 5" in text and "gradients were equal" in text
    assert "v norm 2" in text and "v norm 9" in text


def test_a_range_when_steps_between_were_not_checked() -> None:
    f = _judge({0: _state([1, 2], [3, 4]), 1: _state([1, 9], [3, 4])}, last_agreed=0, step=100)
    assert "between 1 and 100" in f.text()


def test_differing_gradients_and_no_sync_are_told_apart() -> None:
    grads = _judge({0: _state([1, 2], [3, 4]), 1: _state([1, 9], [3, 8])})
    assert "reduced gradients differed" in grads.text()
    nosync = _judge({0: _state([1, 2], [3, 4]), 1: _state([1, 9], [3, 8], synced=False)})
    assert "rank 1 ran step 5's backward without gradient sync" in nosync.text()
    assert "while rank 0 all-reduced" in nosync.text()


@pytest.mark.parametrize("precise", [False, True])
def test_a_micro_step_without_sync_on_every_rank_is_never_the_cause(precise: bool) -> None:
    """Gradient accumulation: the checked step ran its backward without sync on every rank,
    so its gradients differ by design; the cause is not no_sync, and with 2 ranks neither rank
    is named as the odd one."""
    states = {0: _state([1, 2], [3, 4], synced=False), 1: _state([1, 9], [3, 8], synced=False)}
    f = judge(5, states, param_names=NAMES, broadcast_buffers=True, last_agreed=4 if precise
              else 0, precise=precise, world_size=2)
    assert f is not None
    text = f.text()
    assert "no_sync() on" not in text and "ranks 0,1 ran step" not in text
    assert "reduced gradients differed" not in text
    assert "without gradient sync on every rank" in text and "not the cause" in text
    assert f.ranks == (0, 1) and "cannot be told" in text
    assert "clipping" in text and "clipping" in f.fix


def test_with_three_ranks_the_rank_off_the_common_value_is_named() -> None:
    states = {r: _state([1, 9 if r == 0 else 2], [3, r], synced=False) for r in range(3)}
    f = _judge(states)
    assert f.ranks == (0,) and "cannot be told" not in f.text()
    assert "not the cause" in f.text()


def test_per_rank_buffers_without_broadcast_are_info() -> None:
    states = {0: _state([1, 2], None, (5, 6)), 1: _state([1, 2], None, (5, 7))}
    f = _judge(states, broadcast_buffers=False)
    assert f.severity == "info" and f.name == "b1" and f.field == "buffer"
    assert _judge(states).severity == "error"
    excluded = judge(5, states, param_names=NAMES, broadcast_buffers=False, last_agreed=4,
                     precise=False, world_size=2, exclude=frozenset({"b1"}))
    assert excluded is None


def test_the_recording_spells_the_replica_period() -> None:
    assert Recording.parse("replicas=1").replicas == 1
    assert Recording.parse("guard, replicas=never") == Recording(guard=True, replicas=None)
    assert str(Recording(replicas=7)) == "every=100,replicas=7"
    assert str(Recording()) == "every=100"  # the default is left out
    with pytest.raises(ValueError, match="replicas=N"):
        Recording.parse("replicas=0")
    with pytest.raises(ValueError, match="replicas=None"):
        Recording(replicas=0)
