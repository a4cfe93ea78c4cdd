"""broadcast_coalesced against torch's own `dist._broadcast_coalesced` on real gloo ranks.

Every scenario runs inside one spawn (3 ranks) to keep the file fast. The broadcast order is
read with the profiler on a gloo group with a single worker thread, so that the order of the
"gloo:broadcast" records is the order the broadcasts were issued in.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddpviz.engine.broadcast import broadcast_coalesced, chunk_indices
from ddpviz.events import Tap
from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

# What gloo's profiler records call each dtype.
_PROFILER_DTYPE = {"float": "float32", "long int": "int64", "c10::BFloat16": "bfloat16",
                   "bool": "bool", "c10::Half": "float16", "double": "float64"}
_SMALL_CHUNK = 64  # bytes: several chunks per dtype for the tensors below


def one_thread_group(rank: int, world_size: int, tag: str) -> dist.ProcessGroup:
    """A gloo group with one worker thread: collectives run (and are profiled) in issue order."""
    from torch._C._distributed_c10d import ProcessGroup, ProcessGroupGloo

    store = dist.PrefixStore(f"ddpviz_one_thread_{tag}",
                             dist.distributed_c10d._get_default_store())
    opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._threads = 1
    opts._devices = [ProcessGroupGloo.create_default_device()]
    opts._timeout = datetime.timedelta(seconds=60)
    backend = ProcessGroupGloo(store, rank, world_size, opts)
    group = ProcessGroup(store, rank, world_size)
    group._set_default_backend(ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, backend)
    return group


def make_tensors(seed: int) -> list[torch.Tensor]:
    """Mixed dtypes, interleaved, some non-contiguous, special float values; seed-dependent."""
    g = torch.Generator().manual_seed(seed)
    w = nn.Parameter(torch.randn(3, 4, generator=g))
    special = torch.tensor([float("nan"), -0.0, float("inf"), seed + 0.5])
    conv = torch.randn(2, 3, 3, 3, generator=g).to(memory_format=torch.channels_last)
    return [
        w,
        torch.randn(5, generator=g).to(torch.bfloat16),
        torch.randint(-(2**40), 2**40, (2, 3), generator=g),
        torch.randn(6, 4, generator=g).t(),  # non-contiguous
        torch.rand(7, generator=g) > 0.5,  # bool
        torch.tensor(seed * 7, dtype=torch.int64),  # 0-dim, like num_batches_tracked
        special,
        torch.randn(9, generator=g).half(),
        conv,
        torch.empty(0, 3),
        torch.randn(20, generator=g),
        torch.randn(3, generator=g).to(torch.bfloat16),
        torch.randn(4, generator=g).double(),
    ]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def _same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[bool]:
    return [x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))
            for x, y in zip(a, b, strict=True)]


def _clone(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for t in ts:
        c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        c.copy_(t.detach())
        out.append(nn.Parameter(c) if isinstance(t, nn.Parameter) else c)
    return out


def _detached(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach() for t in ts]  # torch's oracle writes in place, like DDP's callers


def _profiled(fn: Any) -> list[tuple[str, str, tuple[int, ...]]]:
    with torch.profiler.profile(record_shapes=True) as prof:
        fn()
    return [(e.name.removeprefix("gloo:"), _PROFILER_DTYPE.get(e.input_dtypes[0],
                                                               e.input_dtypes[0]),
             tuple(e.input_shapes[0]))
            for e in prof.events() if e.name.startswith("gloo:")]


def _event_row(e: Any) -> tuple[Any, ...]:
    return (type(e).__name__, *(getattr(e, f) for f in e.__struct_fields__[4:]))


def _lbl() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))


def scenarios(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    group = one_thread_group(rank, world_size, "bc")
    for src in (0, world_size - 1):
        original = make_tensors(rank)
        mine, theirs = _clone(original), _clone(original)
        events: list[Any] = []
        broadcast_coalesced(mine, group, src=src, chunk_bytes=_SMALL_CHUNK,
                            tap=Tap(events.append, rank))
        dist._broadcast_coalesced(group, _detached(theirs), _SMALL_CHUNK, src)
        out[f"src{src}"] = {
            "equals_src": _same_bits(mine, make_tensors(src)),
            "equals_torch": _same_bits(mine, theirs),
            "strides_kept": [m.stride() == o.stride() for m, o in zip(mine, original,
                                                                       strict=True)],
            "still_params": [isinstance(m, nn.Parameter) == isinstance(o, nn.Parameter)
                             for m, o in zip(mine, original, strict=True)],
            "events": [_event_row(e) for e in events],
        }
    # The sequence of collectives, ours and torch's, on the same inputs.
    out["ours_seq"] = _profiled(lambda: broadcast_coalesced(make_tensors(rank), group,
                                                            chunk_bytes=_SMALL_CHUNK))
    out["torch_seq"] = _profiled(lambda: dist._broadcast_coalesced(
        group, _detached(make_tensors(rank)), _SMALL_CHUNK, 0))
    out["ours_default_seq"] = _profiled(lambda: broadcast_coalesced(make_tensors(rank), group))
    out["torch_default_seq"] = _profiled(lambda: dist._broadcast_coalesced(
        group, _detached(make_tensors(rank)), 250 * 2**20, 0))
    # Linear-BatchNorm-Linear: torch's DDP constructor vs our broadcast of the same state.
    torch.manual_seed(rank)
    model = _lbl()
    out["ddp_seq"] = _profiled(lambda: nn.parallel.DistributedDataParallel(
        model, process_group=group))
    torch.manual_seed(rank)
    model = _lbl()
    state = [p.detach() for p in model.parameters()] + [b.detach() for b in model.buffers()]
    out["ours_lbl_seq"] = _profiled(lambda: broadcast_coalesced(state, group))
    torch.manual_seed(0)
    reference = _lbl()
    out["lbl_equals_rank0"] = _same_bits([*model.parameters(), *model.buffers()],
                                         [*reference.parameters(), *reference.buffers()])
    # A disabled tap must not build a single event.
    calls = []

    def spy(self: Tap, cls: type, *fields: object) -> None:
        calls.append(cls.__name__)

    Tap.emit = spy  # type: ignore[method-assign]
    broadcast_coalesced(make_tensors(rank), group, chunk_bytes=_SMALL_CHUNK, tap=Tap(None, rank))
    out["disabled_tap_calls"] = calls
    return out


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    return run_ranks(scenarios, 3, timeout=150)


def test_every_rank_ends_with_the_source_ranks_bits(results: dict[int, dict[str, Any]]) -> None:
    n = len(make_tensors(0))
    for rank, r in results.items():
        for src in (0, 2):
            assert r[f"src{src}"]["equals_src"] == [True] * n, (rank, src)
            assert r[f"src{src}"]["strides_kept"] == [True] * n, (rank, src)
            assert r[f"src{src}"]["still_params"] == [True] * n, (rank, src)
    # Ranks really started different, so the equality above is the broadcast's doing.
    assert not all(_same_bits(make_tensors(1), make_tensors(0))[:5])


def test_results_equal_torchs_broadcast_coalesced(results: dict[int, dict[str, Any]]) -> None:
    n = len(make_tensors(0))
    for rank, r in results.items():
        for src in (0, 2):
            assert r[f"src{src}"]["equals_torch"] == [True] * n, (rank, src)


def test_collective_sequence_equals_torchs(results: dict[int, dict[str, Any]]) -> None:
    for rank, r in results.items():
        assert r["ours_seq"] == r["torch_seq"], rank
        assert r["ours_default_seq"] == r["torch_default_seq"], rank
    seq = results[0]["ours_seq"]
    # Several chunks per dtype, interleaved by first tensor: coalescing really happened.
    assert [d for _, d, _ in seq].count("float32") >= 3
    assert {op for op, _, _ in seq} == {"broadcast"}
    # One flat buffer per dtype with the default 250 MiB chunks (the empty float tensor is
    # coalesced with the other float32 tensors).
    default = results[0]["ours_default_seq"]
    assert sorted(d for _, d, _ in default) == sorted(
        {"float32", "bfloat16", "int64", "bool", "float16", "float64"})


def test_linear_batchnorm_linear_matches_torchs_ddp_constructor(
        results: dict[int, dict[str, Any]]) -> None:
    for rank, r in results.items():
        ddp, ours = r["ddp_seq"], r["ours_lbl_seq"]
        # torch: all_gather of the parameter count, broadcast of sizes/strides (verification),
        # then the state broadcast, which must be exactly ours (ddp-facts.md).
        assert ours == [("broadcast", "float32", (276,)), ("broadcast", "int64", (1,))], rank
        assert ddp[:2] == [("all_gather", "int64", (1,)), ("broadcast", "int64", (16,))], rank
        assert ddp[2:] == ours, rank
        assert r["lbl_equals_rank0"] == [True] * 9, rank  # 6 params, 3 buffers


def test_events_report_every_chunk(results: dict[int, dict[str, Any]]) -> None:
    elem = {"float32": 4, "bfloat16": 2, "int64": 8, "bool": 1, "float16": 2, "float64": 8}
    total = sum(t.numel() * t.element_size() for t in make_tensors(0))
    for r in results.values():
        for src in (0, 2):
            rows = r[f"src{src}"]["events"]
            kinds = [row[0] for row in rows]
            assert kinds[0] == "BroadcastStarted" and kinds[-1] == "BroadcastFinished"
            _, ev_src, n_tensors, started_total, n_chunks = rows[0]
            sent = [row for row in rows if row[0] == "BroadcastChunkSent"]
            done = [row for row in rows if row[0] == "BroadcastChunkDone"]
            assert (ev_src, n_tensors, started_total) == (src, len(make_tensors(0)), total)
            assert len(sent) == len(done) == n_chunks == len(r["torch_seq"])
            assert sum(row[4] for row in sent) == sum(row[2] for row in done) == total
            assert rows[-1][1] == total
            assert sum(row[5] for row in sent) == len(make_tensors(0))
            # Chunk by chunk, what we announced is what torch broadcast.
            assert [(row[2], row[4]) for row in sent] == [
                (d, shape[0] * elem[d]) for _, d, shape in r["torch_seq"]]
            in_flight, peak = 0, 0
            for kind in kinds:
                in_flight += (kind == "BroadcastChunkSent") - (kind == "BroadcastChunkDone")
                peak = max(peak, in_flight)
            assert peak == 2  # torch keeps at most 2 broadcasts in flight
            assert [row[1] for row in done] == list(range(n_chunks))


def test_disabled_tap_builds_no_events(results: dict[int, dict[str, Any]]) -> None:
    for r in results.values():
        assert r["disabled_tap_calls"] == []


def test_chunks_equal_torchs_bucket_assignment_with_one_limit() -> None:
    # No processes: the grouping alone, against torch's C++ on many mixed-dtype lists.
    g = torch.Generator().manual_seed(0)
    dtypes = (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float64)
    cases = 0
    for _ in range(300):
        n = int(torch.randint(1, 30, (1,), generator=g))
        ts = [torch.empty(int(torch.randint(0, 40, (1,), generator=g)),
                          dtype=dtypes[int(torch.randint(0, len(dtypes), (1,), generator=g))])
              for _ in range(n)]
        for limit in (0, 1, 17, 64, 200, 250 * 2**20):
            torch_chunks, _ = dist._compute_bucket_assignment_by_size(ts, [limit])
            assert chunk_indices(ts, limit) == torch_chunks, (limit, [t.dtype for t in ts])
            cases += 1
    assert cases == 1800
