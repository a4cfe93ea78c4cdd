"""ddpviz.plan.compute_bucket_assignment_by_size against torch's own C++ function, by property.

torch's `dist._compute_bucket_assignment_by_size` is the oracle: every input torch accepts must
give the same `(bucket_indices, per_bucket_size_limits)`. Inputs that crash torch (empty tensor
list, empty limits) are only given to ddpviz, which must raise a ValueError instead.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpviz.engine.buckets import CloseReason
from ddpviz.plan import TensorSpec, compute_bucket_assignment_by_size, replay_bucket_assignment

COMMON_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
]
EXTRA_DTYPE_NAMES = [
    "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
    "complex32", "uint16", "uint32", "uint64", "float4_e2m1fn_x2",
]
DEVICES = [torch.device("cpu"), torch.device("meta")]


def _allocatable(dtype: torch.dtype) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex32 warns that it is experimental
            torch.empty(1, dtype=dtype)
            torch.empty(1, dtype=dtype, device="meta")
    except (RuntimeError, TypeError):
        return False
    return True


DTYPES = COMMON_DTYPES + [
    dt for dt in (getattr(torch, n, None) for n in EXTRA_DTYPE_NAMES)
    if isinstance(dt, torch.dtype) and _allocatable(dt)
]
KEYS = [(dt, dev) for dt in DTYPES for dev in DEVICES]
HUGE = [2**63 - 1, sys.maxsize, 2**64 - 1]
CPU_MAX_NUMEL = 64  # real memory on cpu; meta tensors get any size

settings.register_profile("ddpviz-buckets", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ddpviz-buckets")


def _make(dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.empty(numel, dtype=dtype, device=device)


def torch_answer(tensors, limits, flags=(), indices=()):
    return dist._compute_bucket_assignment_by_size(list(tensors), list(limits), list(flags),
                                                   list(indices))


limit_values = st.one_of(
    st.sampled_from([0, 1, 2, 7, 64, 1024, 1024 * 1024, *HUGE]),
    st.integers(0, 4096),
    st.integers(0, 2**64 - 1),
)
limits_strategy = st.lists(limit_values, min_size=1, max_size=3)


@st.composite
def tensor_lists(draw, min_size=1, max_size=40, keys=KEYS):
    n = draw(st.integers(min_size, max_size))
    key_ids = draw(st.lists(st.integers(0, len(keys) - 1), min_size=n, max_size=n))
    tensors = []
    for k in key_ids:
        dtype, device = keys[k]
        if device.type == "meta":
            numel = draw(st.one_of(st.integers(0, 300), st.sampled_from([0, 2**20, 2**33])))
        else:
            numel = draw(st.integers(0, CPU_MAX_NUMEL))
        tensors.append(_make(dtype, device, numel))
    return tensors


@st.composite
def full_inputs(draw, tensors_strategy):
    tensors = draw(tensors_strategy)
    n = len(tensors)
    limits = draw(limits_strategy)
    flags: list[bool] = []
    if draw(st.booleans()):
        flags = draw(st.lists(st.sampled_from([False, False, False, True]), min_size=n,
                              max_size=n))
    indices: list[int] = []
    if draw(st.booleans()):
        indices = draw(st.permutations(range(n)))
    return tensors, limits, flags, indices


def _check_same(tensors, limits, flags, indices) -> None:
    expected = torch_answer(tensors, limits, flags, indices)
    got = compute_bucket_assignment_by_size(tensors, limits, flags, indices)
    assert got == (expected[0], expected[1]), (
        f"limits={limits} flags={flags} indices={indices} "
        f"tensors={[(t.dtype, t.device.type, t.numel()) for t in tensors]}")
    specs = [TensorSpec.of(t) for t in tensors]
    assert compute_bucket_assignment_by_size(specs, limits, flags, indices) == got


@settings(max_examples=300)
@given(full_inputs(tensor_lists()))
def test_matches_torch_on_random_inputs(case):
    _check_same(*case)


@settings(max_examples=120)
@given(full_inputs(tensor_lists(min_size=14, max_size=90)))
def test_matches_torch_with_many_tensors(case):
    _check_same(*case)


@st.composite
def many_keys(draw):
    # A chosen number of distinct keys, each used at least once, in a shuffled order: crosses
    # libstdc++'s rehash at the 14th and the 30th key (see [Note: partly filled buckets]).
    n_keys = draw(st.sampled_from([13, 14, 15, 29, 30, 31, len(KEYS)]) | st.integers(1, len(KEYS)))
    chosen = draw(st.permutations(KEYS))[:n_keys]
    extra = draw(st.lists(st.sampled_from(chosen), max_size=30))
    keys = draw(st.permutations(list(chosen) + extra))
    sizes = draw(st.lists(st.integers(0, 40), min_size=len(keys), max_size=len(keys)))
    return [_make(dt, dev, s) for (dt, dev), s in zip(keys, sizes, strict=True)]


@settings(max_examples=150)
@given(full_inputs(many_keys()))
def test_matches_torch_with_many_dtype_device_keys(case):
    _check_same(*case)


@settings(max_examples=60)
@given(many_keys(), st.randoms(use_true_random=False))
def test_rebuild_path_leftovers_follow_hash_table_order(tensors, rnd):
    # The rebuild path (tensor_indices given, huge limit: every bucket is a leftover) is where
    # the unordered_map iteration order shows through unsorted.
    order = list(range(len(tensors)))
    rnd.shuffle(order)
    walked = [tensors[i] for i in order]
    for limits in ([sys.maxsize], [2**64 - 1], [1024 * 1024, 25 * 1024 * 1024]):
        _check_same(walked, limits, [], order)


def test_all_keys_at_once_in_each_rotation():
    # Deterministic: every key (>29 of them) alone in a bucket, in every rotation of the list.
    assert len(KEYS) > 29
    tensors = [_make(dt, dev, 3) for dt, dev in KEYS]
    n = len(tensors)
    for shift in range(0, n, 5):
        order = list(range(shift, n)) + list(range(shift))
        _check_same([tensors[i] for i in order], [sys.maxsize], [], order)
        _check_same(tensors[shift:] + tensors[:shift], [sys.maxsize], [], [])


@pytest.mark.parametrize("limits", [[0], [1], [0, 0, 0], [2**63 - 1], [sys.maxsize],
                                    [2**64 - 1], [1, 2**63 - 1], [0, 1, sys.maxsize]])
def test_edge_limits_with_empty_tensors(limits):
    sizes = [0, 1, 0, 5, 0, 0, 2, 0, 3, 0, 1, 0]
    tensors = [_make(dt, dev, s) for (dt, dev), s in zip(KEYS[:12], sizes, strict=True)]
    _check_same(tensors, limits, [], [])
    _check_same(tensors, limits, [], list(reversed(range(len(tensors)))))


def test_sparse_flag_gets_its_own_bucket_and_consumes_no_limit():
    t = [_make(torch.float32, DEVICES[0], 10) for _ in range(4)]  # 40 bytes each
    flags = [False, True, False, False]
    got = compute_bucket_assignment_by_size(t, [40, 80, 40], flags)
    assert got == torch_answer(t, [40, 80, 40], flags)
    # tensor 0 closes a bucket at limit 40; had the sparse tensor 1 advanced the limits, tensor 2
    # would have met the third limit (40) and closed alone.
    assert got == ([[0], [1], [2, 3]], [40, 0, 80])


# --- errors: ddpviz raises a clear ValueError where torch asserts or crashes -----------------


def _tensors(n: int) -> list[torch.Tensor]:
    return [_make(torch.float32, DEVICES[0], 4) for _ in range(n)]


def test_empty_tensor_list_raises():
    with pytest.raises(ValueError, match=r"^ddpviz: no tensors"):
        compute_bucket_assignment_by_size([], [1024])


def test_empty_limits_raises():
    with pytest.raises(ValueError, match=r"^ddpviz: bucket_size_limits is empty"):
        compute_bucket_assignment_by_size(_tensors(2), [])


@pytest.mark.parametrize("n_flags", [1, 3])
def test_flag_length_mismatch_raises(n_flags):
    with pytest.raises(ValueError, match=rf"expect_sparse_gradient has {n_flags} flags for 2"):
        compute_bucket_assignment_by_size(_tensors(2), [1024], [False] * n_flags)


@pytest.mark.parametrize("n_indices", [1, 3])
def test_tensor_indices_length_mismatch_raises(n_indices):
    with pytest.raises(ValueError, match=rf"tensor_indices has {n_indices} entries for 2"):
        compute_bucket_assignment_by_size(_tensors(2), [1024], [], list(range(n_indices)))


def test_sparse_tensor_raises_like_torch():
    tensors = [_make(torch.float32, DEVICES[0], 3), torch.zeros(4).to_sparse()]
    with pytest.raises(RuntimeError, match="No support for sparse tensors"):
        torch_answer(tensors, [1024])
    with pytest.raises(ValueError, match=r"^ddpviz: tensor 1 has layout torch.sparse_coo"):
        compute_bucket_assignment_by_size(tensors, [1024])


def test_negative_or_too_large_limit_raises():
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="bucket size limits must be in"):
            compute_bucket_assignment_by_size(_tensors(2), [1024, bad])


def test_out_of_range_index_with_flags_raises():
    with pytest.raises(ValueError, match="tensor index 5 is out of range"):
        compute_bucket_assignment_by_size(_tensors(2), [1024], [False, False], [0, 5])


def test_non_tensor_input_raises_type_error():
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor or a ddpviz TensorSpec"):
        compute_bucket_assignment_by_size([[1.0, 2.0]], [1024])  # type: ignore[list-item]


# --- replay: every decision is explained consistently -----------------------------------------


@settings(max_examples=200)
@given(full_inputs(tensor_lists(max_size=50)))
def test_replay_steps_are_consistent(case):
    tensors, limits, flags, indices = case
    a = replay_bucket_assignment(tensors, limits, flags, indices)
    assert (a.bucket_indices, a.per_bucket_size_limits) == torch_answer(*case)
    assert a.sorted_by_min_index == (not indices)
    assert [s.position for s in a.steps] == list(range(len(tensors)))

    per_key_pos: dict[tuple[str, str], int] = {}
    open_bytes: dict[tuple[str, str], int] = {}
    for s, t in zip(a.steps, tensors, strict=True):
        assert s.tensor_index == (indices[s.position] if indices else s.position)
        assert s.nbytes == t.numel() * t.element_size()
        if flags and flags[s.tensor_index]:
            assert s.key[0] == "sparse"
            assert (s.limit, s.limit_position, s.closed) == (0, -1, CloseReason.SPARSE)
            continue
        assert s.key == (str(t.dtype).removeprefix("torch."), str(t.device))
        # each key walks the limits on its own; the last entry repeats
        pos = per_key_pos.get(s.key, 0)
        assert s.limit_position == pos
        assert s.limit == limits[pos]
        assert s.bucket_bytes == open_bytes.get(s.key, 0) + s.nbytes
        # LIMIT_REACHED iff the bucket's bytes reached the limit
        assert (s.closed is CloseReason.LIMIT_REACHED) == (s.bucket_bytes >= s.limit)
        if s.closed is CloseReason.LIMIT_REACHED:
            open_bytes[s.key] = 0
            per_key_pos[s.key] = min(pos + 1, len(limits) - 1)
        else:
            open_bytes[s.key] = s.bucket_bytes

    # emitted buckets partition the indices; leftovers come after all closed buckets, and a
    # leftover's bytes stayed below its limit
    all_indices = sorted(i for b in a.emitted for i in b.indices)
    assert all_indices == sorted(s.tensor_index for s in a.steps)
    reasons = [b.reason for b in a.emitted]
    first_leftover = (reasons.index(CloseReason.LEFTOVER) if CloseReason.LEFTOVER in reasons
                      else len(reasons))
    assert CloseReason.LEFTOVER not in reasons[:first_leftover]
    assert all(r is CloseReason.LEFTOVER for r in reasons[first_leftover:])
    nbytes = {s.tensor_index: s.nbytes for s in a.steps}
    for b in a.emitted:
        size = sum(nbytes[i] for i in b.indices)
        if b.reason is CloseReason.LEFTOVER:
            assert size < b.limit
        elif b.reason is CloseReason.LIMIT_REACHED:
            assert size >= b.limit
            # only the last tensor may have pushed it over: without it the bucket was below
            assert len(b.indices) == 1 or size - nbytes[b.indices[-1]] < b.limit
        else:
            assert len(b.indices) == 1 and b.limit == 0
    if not indices:
        assert a.bucket_indices == sorted(a.bucket_indices, key=min)


def test_specs_by_name_assign_as_specs_by_torch_object() -> None:
    # a recorded run has only names ("float16", "cuda:1"): the same keys, order and buckets
    import random

    from ddpviz.engine.buckets import key_hash

    rng = random.Random(0)
    kinds = [("float32", "cpu"), ("float16", "cpu"), ("bfloat16", "cuda:1"), ("float64", "meta"),
             ("float16", "cuda")]
    for _ in range(50):
        picked = [rng.choice(kinds) for _ in range(rng.randint(1, 30))]
        sizes = [rng.randint(1, 4000) for _ in picked]
        named = [TensorSpec(n, 2, d, v) for n, (d, v) in zip(sizes, picked, strict=True)]
        objects = [TensorSpec(n, 2, getattr(torch, d), torch.device(v))
                   for n, (d, v) in zip(sizes, picked, strict=True)]
        limits = [rng.randint(1, 9000) for _ in range(rng.randint(1, 3))]
        order = list(range(len(named)))
        rng.shuffle(order)
        for indices in ((), order):
            ours = replay_bucket_assignment(named, limits, tensor_indices=indices)
            theirs = replay_bucket_assignment(objects, limits, tensor_indices=indices)
            assert ours == theirs
    for d, v in kinds:
        assert key_hash(d, v) == key_hash(getattr(torch, d), torch.device(v))
