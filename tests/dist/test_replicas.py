"""The replica check (See [Note: replica digests] in ddpviz/probes/replicas.py): real gloo ranks
train torch's DDP under watch() (the default hook-less recording and the guarded one) and
ddpviz's DistributedDataParallel, each with one defect planted on one rank; rank 0's check must
name it (kind, step, ranks, tensor, cause), and healthy runs must report nothing.

Several scenarios run one after the other inside one launch (each on its own DDP), to keep the
number of process launches small.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

EDIT_STEP = 5
NOSYNC_STEP = 10
STEPS = 14
NARROW_FIRST, NARROW_SECOND = 7, 17  # the narrowing run's edits (period 5; steps 12-16 wait)


class _Net(nn.Module):
    def __init__(self, bn: bool = False, unused: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16) if bn else None
        self.fc2 = nn.Linear(16, 4)
        self.spare = nn.Linear(4, 4) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.bn is not None:
            h = self.bn(h)
        return self.fc2(torch.relu(h))


_KEEP: list[Any] = []  # the watches, alive until the rank exits


def _ddp(engine: str, model: nn.Module, replicas: int | None, guard: bool = False,
         **kwargs: Any) -> tuple[Any, Any]:
    """(ddp, replica check): torch's DDP watched, or ddpviz's DDP."""
    import ddpviz

    rec = ddpviz.Recording(guard=guard, replicas=replicas)
    if engine == "ddpviz":
        own = ddpviz.DistributedDataParallel(model, recording=rec, **kwargs)
        return own, own.replicas
    ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
    w = ddpviz.watch(ddp, recording=rec)
    _KEEP.append(w)
    return ddp, w.replicas


def _finish(rank: int, check: Any) -> dict[str, Any]:
    """Rank 0 waits for its check to judge everything; then every rank stops its check."""
    if rank == 0:
        assert check.drain(60.0), f"the replica check did not finish: {check.error!r}"
    dist.barrier()
    found = [] if rank != 0 else [
        {"kind": f.kind, "severity": f.severity, "step": f.step, "ranks": f.ranks,
         "name": f.name, "field": f.field, "text": f.text(), "fix": f.fix,
         "values": f.values} for f in check.findings]
    compared = check.compared
    check.close()
    return {"found": found, "compared": compared}


def _train(rank: int, engine: str, defect: str, replicas: int | None, guard: bool = False,
           steps: int = STEPS, dtype: torch.dtype = torch.float32, hook: str = "",
           **kwargs: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _Net(bn=defect in ("bn_local", "buffer_edit", "buffer_new"),
                 unused="unused" in kwargs.pop("net", "")).to(dtype)
    ddp, check = _ddp(engine, model, replicas, guard, **kwargs)
    if hook:
        _register_hook(ddp, hook)
    lr = 0.05 if defect == "lr" and rank == 1 else 0.1
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        x = torch.randn(6, 8, generator=gen).to(dtype)
        ctx: Any = ddp.no_sync() if defect == "nosync" and rank == 1 and step == NOSYNC_STEP \
            else contextlib.nullcontext()
        with ctx:
            ddp(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if defect == "edit" and rank == 1 and step == EDIT_STEP:
            with torch.no_grad():
                model.fc2.weight[0, 0] += 1e-3
        if defect == "narrow" and step == NOSYNC_STEP + 2:
            _wait_for_window(check)
        if defect == "narrow" and rank == 1 and step in (NARROW_FIRST, NARROW_SECOND):
            with torch.no_grad():
                (model.fc2.weight if step == NARROW_FIRST else model.fc1.bias)[0] += 1e-3
        if defect == "buffer_edit" and rank == 1 and step == EDIT_STEP:
            model.bn.running_var.fill_(2.0)  # type: ignore[union-attr]
        if defect == "buffer_new" and rank == 1 and step == EDIT_STEP:
            # a new tensor: DDP's next broadcast (from rank 0) reaches it all the same
            model.bn.running_var = torch.full_like(  # type: ignore[union-attr]
                model.bn.running_var, 2.0)  # type: ignore[union-attr]
    if defect == "nosync" and rank == 1:  # the all-reduce rank 0 still waits for
        ddp(torch.randn(6, 8, generator=gen)).square().mean().backward()
    out = _finish(rank, check)
    # the NaN check runs beside the replica check (both default on): a healthy run posts
    # nothing to it either (tests/dist/test_nonfinite.py plants the defects)
    out["nonfinite_posted"] = len(ddp._nf._post.bad if engine == "ddpviz" else
                                  _KEEP[-1]._nf._post.bad)
    return out


def _wait_for_window(check: Any) -> None:
    """Every rank waits here until it follows rank 0's every-step window (opened when rank 0
    saw the first divergence), so the second edit lands inside it whatever the timing."""
    from tests.polling import eventually

    assert eventually(lambda: check.precise[1] > 0, 120), "no every-step window opened"


def _register_hook(ddp: Any, hook: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    if hook == "fp16":
        ddp.register_comm_hook(None, dh.fp16_compress_hook)
    elif hook == "bf16":  # (torch refuses the hook by name without NCCL; gloo reduces bf16)
        def bf16_hook(state, bucket):  # (unannotated: torch checks the annotations)
            return dh.bf16_compress_hook(state, bucket)

        ddp.register_comm_hook(None, bf16_hook)
    elif hook == "powersgd":
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                 start_powerSGD_iter=2, min_compression_rate=0.5)
        ddp.register_comm_hook(state, ps.powerSGD_hook)


# --- planted defects -------------------------------------------------------------------------

DEFECTS = [
    # (engine, defect, replicas, guard)
    ("torch", "edit", 1, False),
    ("torch", "lr", None, False),  # None: the default period
    ("torch", "nosync", 5, False),
    ("torch", "bn_local", None, True),
    ("torch", "buffer_edit", 1, False),
    ("torch", "buffer_new", 1, False),
    ("torch", "narrow", 5, False),
    ("ddpviz", "edit", 1, False),
    ("ddpviz", "lr", None, False),
    ("ddpviz", "nosync", 5, False),
    ("ddpviz", "bn_local", None, False),
]


def planted(rank: int, world_size: int) -> dict[str, Any]:
    from ddpviz.recording import REPLICAS_EVERY

    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for engine, defect, replicas, guard in DEFECTS:
            kwargs: dict[str, Any] = {}
            if defect == "bn_local":
                kwargs["broadcast_buffers"] = False
            out[f"{engine}/{defect}"] = _train(
                rank, engine, defect, replicas if replicas is not None else REPLICAS_EVERY,
                guard, steps=22 if defect == "narrow" else STEPS, **kwargs)["found"]
    return out


@pytest.fixture(scope="module")
def found() -> dict[str, list[dict[str, Any]]]:
    return run_ranks(planted, 2, timeout=600)[0]


@pytest.mark.parametrize("engine", ["torch", "ddpviz"])
def test_a_parameter_edited_on_one_rank_is_named_at_its_step(found: Any, engine: str) -> None:
    (f,) = found[f"{engine}/edit"]
    assert f["kind"] == "replicas_diverged" and f["severity"] == "error"
    assert f["step"] == EDIT_STEP and f["ranks"] == (0, 1)
    assert f["name"] == "fc2.weight" and f["field"] == "parameter"
    assert "first differing after step 5" in f["text"]
    assert "1 of 4 parameters" in f["text"]
    assert "gradients were equal" in f["text"]  # the optimizer or a rank-local edit


@pytest.mark.parametrize("engine", ["torch", "ddpviz"])
def test_a_different_learning_rate_on_one_rank_is_named_at_the_first_check(
        found: Any, engine: str) -> None:
    (f,) = found[f"{engine}/lr"]
    assert f["step"] == 0 and f["ranks"] == (0, 1) and f["severity"] == "error"
    assert "4 of 4 parameters" in f["text"] and f["name"] == "fc1.weight"
    assert "gradients were equal" in f["text"] and "learning rate" in f["fix"]


@pytest.mark.parametrize("engine", ["torch", "ddpviz"])
def test_no_sync_on_one_rank_for_one_step_is_named(found: Any, engine: str) -> None:
    first = found[f"{engine}/nosync"][0]
    assert first["step"] == NOSYNC_STEP and first["severity"] == "error"
    assert ("rank 1 ran step 10's backward without gradient sync" in first["text"]
            and "while rank 0 all-reduced" in first["text"])
    assert "no_sync()" in first["fix"]


@pytest.mark.parametrize("engine", ["torch", "ddpviz"])
def test_per_rank_batchnorm_statistics_are_info_not_error(found: Any, engine: str) -> None:
    (f,) = found[f"{engine}/bn_local"]
    assert f["severity"] == "info" and f["field"] == "buffer"
    assert f["name"] in ("bn.running_mean", "bn.running_var")
    assert f["step"] == 0 and "broadcast_buffers=False" in f["text"]


def test_after_a_divergence_every_step_is_checked_and_named_exactly(found: Any) -> None:
    first, second = found["torch/narrow"]
    # seen at the sampled step 10, somewhere after 5: a range, and the advice to narrow it
    assert first["step"] == 10 and first["name"] == "fc2.weight"
    assert "the first differing step is between 6 and 10" in first["text"]
    assert "replicas=1" in first["text"]
    # the next one, at a step the period would skip, falls in the every-step window: exact
    assert second["step"] == NARROW_SECOND and second["name"] == "fc1.bias"
    assert f"first differing after step {NARROW_SECOND}" in second["text"]
    assert "'fc2.weight'" not in second["text"].splitlines()[0]  # reported once


def test_a_buffer_edited_on_one_rank_is_undone_by_the_broadcast(found: Any) -> None:
    # DDP's broadcast_buffers=True overwrites it from rank 0 before the next forward: the
    # replicas agree again where DDP promises they do, so nothing is reported.
    assert found["torch/buffer_edit"] == []


def test_a_buffer_reassigned_on_one_rank_is_synced_again_and_not_reported(found: Any) -> None:
    # torch 2.13 re-reads the module's buffers before each broadcast (_assign_modules_buffers),
    # so rank 1's new running_var tensor receives rank 0's values at the next forward: the
    # replicas agree where DDP promises they do (watch's broadcast takes the same list), and
    # a divergence verdict would be wrong. (BufferIdentity's buffer_reassigned says what
    # happened.)
    assert found["torch/buffer_new"] == []


# --- healthy runs report nothing -------------------------------------------------------------

HEALTHY: list[tuple[str, int, bool, torch.dtype, str, dict[str, Any]]] = [
    # (engine, replicas, guard, dtype, hook, kwargs)
    ("torch", 1, False, torch.float32, "", {}),
    ("torch", 1, False, torch.bfloat16, "", {"gradient_as_bucket_view": True}),
    ("torch", 1, True, torch.float32, "", {"static_graph": True}),
    ("torch", 1, False, torch.float32, "", {"find_unused_parameters": True, "net": "unused"}),
    ("torch", 1, False, torch.float32, "fp16", {}),
    ("torch", 1, True, torch.float32, "bf16", {}),
    ("torch", 1, False, torch.float32, "powersgd", {}),
    ("ddpviz", 1, False, torch.float32, "", {"gradient_as_bucket_view": True}),
    ("ddpviz", 1, False, torch.bfloat16, "", {"find_unused_parameters": True,
                                              "net": "unused"}),
]
HEALTHY_STEPS = 200


def healthy(rank: int, world_size: int) -> list[dict[str, Any]]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for engine, replicas, guard, dtype, hook, kwargs in HEALTHY:
            out.append(_train(rank, engine, "", replicas, guard, steps=HEALTHY_STEPS,
                              dtype=dtype, hook=hook, **kwargs))
    return out


def test_healthy_runs_report_nothing() -> None:
    # 3 ranks: rank 0 judges more than one peer (a healthy job's digests agree on every rank,
    # so 2 ranks take no path that 3 do not; the planted runs above are the 2-rank ones)
    per_rank = run_ranks(healthy, 3, timeout=900)
    results = per_rank[0]  # rank 0 judges the replicas
    assert [r["found"] for r in results] == [[] for _ in HEALTHY]
    # every step was compared (the last one's parameters come with a forward that never ran)
    assert [r["compared"] for r in results] == [HEALTHY_STEPS - 1 for _ in HEALTHY]
    for rank, rows in per_rank.items():
        assert [r["nonfinite_posted"] for r in rows] == [0 for _ in HEALTHY], rank


# --- the job's end, checkpoints, and a DDP driven like Lightning's manual optimization ------
# See [Note: the job's end and checkpoints] (ddpviz/probes/replicas.py)

END_EDIT_STEP = 6  # rank 1 edits fc2.weight after this step's optimizer step
END_STEPS = 20  # fewer than the default period (25): only the final comparison sees it


def _edit_run(rank: int, steps: int, replicas: int | None = None,
              checkpoint_at: int = -1, edit: bool = True) -> tuple[Any, Any, Any]:
    """(ddp, watch, check): torch's DDP watched at the default recording (or `replicas`),
    trained `steps` steps; rank 1 edits a weight after END_EDIT_STEP; rank 0 alone takes a
    state_dict (a checkpoint) after step `checkpoint_at`."""
    import ddpviz

    torch.manual_seed(0)
    model = _Net()
    ddp = nn.parallel.DistributedDataParallel(model)
    rec = ddpviz.Recording() if replicas is None else ddpviz.Recording(replicas=replicas)
    w = ddpviz.watch(ddp, recording=rec)
    _KEEP.append(w)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        if checkpoint_at >= 0 and step == checkpoint_at + 1:
            _wait_for_window(w.replicas)  # (the window the checkpoint asked for)
        ddp(torch.randn(6, 8, generator=gen)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if edit and rank == 1 and step == END_EDIT_STEP:
            with torch.no_grad():
                model.fc2.weight[0, 0] += 1e-3
        if rank == 0 and step == checkpoint_at:
            ddp.state_dict()  # `if rank == 0: torch.save(ddp.state_dict(), ...)`
    return ddp, w, w.replicas


def _texts(check: Any) -> list[dict[str, Any]]:
    return [{"step": f.step, "ranks": f.ranks, "name": f.name, "severity": f.severity,
             "text": f.text()} for f in check.findings]


def ended_by_destroy(rank: int, world_size: int, late_rank: int) -> dict[str, Any]:
    """The job ends with destroy_process_group (ddpviz wraps it while a check is active);
    `late_rank` (>= 0) comes to it 6 s after the others, past the final comparison's bound."""
    import time as _time

    _, _, check = _edit_run(rank, END_STEPS, edit=late_rank < 0)
    if rank == late_rank:
        _time.sleep(6.0)
    start = _time.monotonic()
    dist.destroy_process_group()
    return {"found": _texts(check), "destroy_s": _time.monotonic() - start,
            "restored": dist.destroy_process_group.__module__ == "torch.distributed"
            ".distributed_c10d"}


def test_a_divergence_after_the_last_check_is_named_at_destroy_process_group() -> None:
    per_rank = run_ranks(ended_by_destroy, 2, -1, timeout=300, start_method="forkserver")
    out = per_rank[0]
    (f,) = out["found"]
    assert f["step"] == END_STEPS - 1 and f["ranks"] == (0, 1) and f["name"] == "fc2.weight"
    assert f["severity"] == "error"
    assert f"the first differing step is between 1 and {END_STEPS - 1}" in f["text"]
    assert "found by the final comparison when the job ended" in f["text"]
    assert "last agreed after step 0" in f["text"]  # the periodic check (step 0) did not see it
    assert "checked every step from now on" not in f["text"]  # (the job ends)
    assert all(r["restored"] for r in per_rank.values())  # torch's own function again
    assert per_rank[1]["found"] == []  # (rank 0 judges)


def test_a_rank_late_to_destroy_process_group_delays_the_others_by_the_bound_only() -> None:
    # rank 1 comes 6 s late: rank 0's final comparison gives up after FINAL_S (not waiting
    # for it), reports nothing (a healthy run), and the job ends normally on both ranks
    per_rank = run_ranks(ended_by_destroy, 2, 1, timeout=300, start_method="forkserver")
    assert per_rank[0]["found"] == [] and per_rank[1]["found"] == []
    from ddpviz.probes.replicas import FINAL_S
    # (not a timing assertion on the job: a bound that a hang would break)
    assert per_rank[0]["destroy_s"] < FINAL_S + 30


def _lightning_style(rank: int, replicas: int | None, watched: bool) -> dict[str, Any]:
    """torch's DDP driven as Lightning drives it under manual optimization: the training step
    runs inside DDP's forward (forward redirection), with a manual backward (the reducer
    prepared by hand, as lightning.pytorch.overrides.distributed.prepare_for_backward does) and
    two optimizers; a BatchNorm whose buffers DDP would broadcast (broadcast_buffers=True), but
    does not after the first forward: require_forward_param_sync ends each step off."""
    import ddpviz

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    holder = nn.Module()
    holder.net = net
    ddp = nn.parallel.DistributedDataParallel(holder, broadcast_buffers=True)
    w = None
    if watched:
        rec = ddpviz.Recording() if replicas is None else ddpviz.Recording(replicas=replicas)
        w = ddpviz.watch(ddp, recording=rec)
        _KEEP.append(w)
    opts = [torch.optim.SGD(net[0].parameters(), lr=0.1),
            torch.optim.Adam([*net[1].parameters(), *net[3].parameters()], lr=0.01)]

    def training_step(x: torch.Tensor) -> torch.Tensor:
        loss = net(x).square().mean()
        for o in opts:
            o.zero_grad()
        if ddp.require_backward_grad_sync:  # manual_backward
            ddp.require_forward_param_sync = True
            ddp.reducer._rebuild_buckets()
            ddp.reducer.prepare_for_backward([])
        loss.backward()
        for o in opts:
            o.step()
        ddp.require_backward_grad_sync = False  # Lightning's on_after_inner_forward
        return loss.detach()

    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(60):
        holder.forward = training_step
        ddp(torch.randn(6, 8, generator=gen))
        del holder.forward
        ddp.require_backward_grad_sync = True  # on_after_outer_forward
    state = {k: v.clone() for k, v in ddp.state_dict().items()}  # (through the hook)
    found: list[dict[str, Any]] = []
    if w is not None:
        w.close()  # (the final comparison)
        found = _texts(w.replicas)
    return {"found": found, "state": state}


def ends_and_checkpoints(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # close(): the final comparison too
    _, w, check = _edit_run(rank, END_STEPS)
    w.close()
    out["close"] = _texts(check)
    # a checkpoint on rank 0 only, with the replica check every 100th step: every rank checks
    # the steps after it (nothing else would look before step 100)
    _, w, check = _edit_run(rank, 40, replicas=100, checkpoint_at=10)
    if rank == 0:
        assert check.drain(60.0), check.error
    dist.barrier()
    out["checkpoint"] = _texts(check)
    w.close()
    # a healthy run with a checkpoint: nothing
    _, w, check = _edit_run(rank, 30, checkpoint_at=10, edit=False)
    w.close()
    out["checkpoint_healthy"] = _texts(check)
    # Lightning's manual optimization, BatchNorm, broadcast_buffers=True: healthy
    for name, replicas in (("default", None), ("every_step", 1)):
        got = _lightning_style(rank, replicas, watched=True)
        plain = _lightning_style(rank, replicas, watched=False)
        out[f"lightning_{name}"] = got["found"]
        out[f"lightning_{name}_same"] = list(got["state"]) == list(plain["state"]) and all(
            torch.equal(got["state"][k], plain["state"][k]) for k in plain["state"])
    return out


@pytest.fixture(scope="module")
def ends() -> dict[int, dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_ranks(ends_and_checkpoints, 2, timeout=600, start_method="forkserver")


def test_a_divergence_after_the_last_check_is_named_at_close(ends: Any) -> None:
    (f,) = ends[0]["close"]
    assert f["step"] == END_STEPS - 1 and f["ranks"] == (0, 1) and f["name"] == "fc2.weight"
    assert f"the first differing step is between 1 and {END_STEPS - 1}" in f["text"]


def test_a_checkpoint_saved_on_rank_0_only_has_its_replicas_compared(ends: Any) -> None:
    (f,) = ends[0]["checkpoint"]
    assert f["ranks"] == (0, 1) and f["name"] == "fc2.weight" and f["severity"] == "error"
    assert 10 < f["step"] < 40  # a step of the window the checkpoint opened (not step 100)
    assert "a checkpoint (state_dict) was taken after step 10" in f["text"]
    assert ends[0]["checkpoint_healthy"] == []


@pytest.mark.parametrize("recording", ["default", "every_step"])
def test_lightning_style_manual_optimization_with_batchnorm_reports_nothing(
        ends: Any, recording: str) -> None:
    # buffers that DDP did not broadcast in a forward are not compared there (they differ
    # legitimately: each rank's BatchNorm statistics of its own batches)
    for rank in (0, 1):
        assert ends[rank][f"lightning_{recording}"] == []
        assert ends[rank][f"lightning_{recording}_same"]  # bitwise the unwatched run
