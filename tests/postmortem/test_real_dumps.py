"""Post-mortems of real hung torch DDP jobs on gloo (tests/postmortem/jobs.py): each names the
rank at fault, the step, the bucket and its parameters, from Flight Recorder dumps alone."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.cli import main
from tests.postmortem import jobs
from tests.postmortem.jobs import FAULT_STEP, SMALL_CAP_MB, make_model, run_job

pytestmark = pytest.mark.dist


def _one(pm: ddpviz.PostMortem, kind: str) -> ddpviz.Finding:
    found = [f for f in pm.findings if f.kind == kind]
    assert len(found) == 1, str(pm)
    return found[0]


def _plan_bucket(pm: ddpviz.PostMortem, index: int) -> tuple[str, ...]:
    assert pm.plan is not None and pm.plan.rebuilt is not None
    return pm.plan.rebuilt[index].names


def test_rank_skips_backward(tmp_path: Path) -> None:
    run_job("skip_backward", 3, tmp_path)
    pm = ddpviz.postmortem(tmp_path, make_model(), settings={"bucket_cap_mb": SMALL_CAP_MB})
    f = _one(pm, "rank_hang")
    assert f.ranks == (2,) and f.step == FAULT_STEP and f.bucket == 0
    assert "head.weight" in _plan_bucket(pm, 0)  # the last layer's bucket is reduced first
    assert f.text().startswith(f"ddpviz: rank 2 never launched bucket 0 of step {FAULT_STEP} (")
    assert dict(f.values)[f"last completed: the buffer broadcast of step {FAULT_STEP} "
                          "(broadcast of 1 int64) (#19)"] == (2,)
    # every collective of every rank is one of DDP's, in DDP's order
    rows = pm.to_records()
    assert {r["ddp_phase"] for r in rows} == {"verify", "state_broadcast", "buffer_broadcast",
                                              "rebuild", "bucket"}
    assert {r["step"] for r in rows if r["ddp_phase"] == "rebuild"} == {1}
    assert {r["step"] for r in rows if r["ddp_phase"] in ("verify", "state_broadcast")} == {-1}
    buckets_per_step = {(r["rank"], r["step"]): 0 for r in rows if r["step"] >= 0}
    for r in rows:
        if r["ddp_phase"] == "bucket":
            buckets_per_step[(r["rank"], r["step"])] += 1
    assert pm.plan is not None and pm.plan.rebuilt is not None
    assert buckets_per_step[(0, 0)] == len(pm.plan.initial) == 1
    assert buckets_per_step[(0, 2)] == len(pm.plan.rebuilt) > 1
    # without a model: the same collective, in collective terms
    bare = ddpviz.postmortem(sorted(tmp_path.iterdir()))
    g = _one(bare, "rank_hang")
    assert g.ranks == (2,) and g.step == -1
    assert "never launched collective #20 (all_reduce [" in g.title and "float32)" in g.title


def test_the_rank_at_fault_is_named_the_same_when_dumped_after_the_timeout(
        tmp_path: Path) -> None:
    # After the group's timeout gloo retires the waiting ranks' timed-out entries, so their
    # oldest pending one is a later bucket; the first collective rank 2 never launched is not.
    run_job("skip_backward_late", 3, tmp_path, timeout=180)
    pm = ddpviz.postmortem(tmp_path, make_model(), settings={"bucket_cap_mb": SMALL_CAP_MB})
    f = _one(pm, "rank_hang")
    assert f.ranks == (2,) and f.step == FAULT_STEP and f.bucket == 0, str(pm)
    assert f.text().startswith(f"ddpviz: rank 2 never launched bucket 0 of step {FAULT_STEP} (")
    assert any(line.startswith("rank 2 also never launched: bucket 1 of step 3")
               for line in f.detail), f.detail


def test_rank_stops_mid_step(tmp_path: Path) -> None:
    run_job("stop_mid_step", 2, tmp_path)
    pm = ddpviz.postmortem(tmp_path, make_model(), settings={"bucket_cap_mb": SMALL_CAP_MB})
    f = _one(pm, "rank_hang")
    assert f.ranks == (1,) and f.step == FAULT_STEP
    names = _plan_bucket(pm, f.bucket)
    assert "body.0.weight" in names  # the parameter whose hook blocked
    assert pm.plan is not None and pm.plan.rebuilt is not None
    assert f.bucket == len(pm.plan.rebuilt) - 1
    last = dict(f.values)
    assert any(v.startswith(f"last completed: bucket {f.bucket - 1} of step {FAULT_STEP}")
               and rs == (1,) for v, rs in last.items())
    # as a .ddpviz trace (the JupyterLab viewer and the dashboard open those)
    out = tmp_path / "pm.ddpviz"
    assert main(["postmortem", str(tmp_path), "--model", "tests.postmortem.jobs:make_model",
                 "--bucket-cap-mb", str(SMALL_CAP_MB), "--trace", str(out)]) == 1
    trace = ddpviz.Trace.load(out)
    launched = {(e.rank, e.step, e.bucket) for e in trace.events()
                if isinstance(e, ev.AllReduceLaunched)}
    done = {(e.rank, e.step, e.bucket) for e in trace.events() if isinstance(e, ev.AllReduceDone)}
    assert (0, FAULT_STEP, f.bucket) in launched - done  # rank 0 waits in it
    assert (1, FAULT_STEP, f.bucket) not in launched
    assert (1, FAULT_STEP, f.bucket - 1) in done
    assert [g.title for g in ddpviz.diagnose(trace)] == [f.title]


def test_unused_parameter_on_one_rank(tmp_path: Path) -> None:
    run_job("unused", 2, tmp_path)
    pm = ddpviz.postmortem(tmp_path, make_model(), settings={"bucket_cap_mb": SMALL_CAP_MB})
    f = _one(pm, "rank_hang")
    assert f.ranks == (1,) and f.step == FAULT_STEP
    assert {"aux.weight", "aux.bias"} <= set(_plan_bucket(pm, f.bucket))
    assert "aux.weight" in f.text()


def test_rank_runs_an_extra_collective(tmp_path: Path) -> None:
    run_job("extra_collective", 2, tmp_path)
    pm = ddpviz.postmortem(tmp_path, make_model(), settings={"bucket_cap_mb": SMALL_CAP_MB})
    # rank 1's dump (the pickle form) has stacks: its all_reduce is named by its call site
    lines, first = inspect.getsourcelines(jobs._rank)
    line = first + next(i for i, text in enumerate(lines) if "dist.all_reduce(" in text)
    site = f"jobs.py:{line} in _rank"
    extra = _one(pm, "collective_mismatch")
    assert extra.ranks == (1,) and extra.field == "extra"
    assert extra.title.startswith("rank 1 launched the job's all_reduce [1] float32 at ")
    assert site in extra.title and "which rank 0 never launched" in extra.title
    assert f"after bucket 1 of step {FAULT_STEP - 1}" in extra.title
    assert extra.values[0][0].endswith(site)
    hang = _one(pm, "rank_hang")
    assert hang.ranks == (0,) and "(the job's all_reduce [1] float32 at " in hang.title
    assert site in hang.title
    # rank 0's dump (the JSON form) has no stacks, so without the model nobody can tell
    # whether rank 0 ever launched that collective: the hang alone is said
    bare = ddpviz.postmortem(tmp_path)
    assert [f.kind for f in bare.findings] == ["rank_hang"], str(bare)


def test_ranks_with_different_bucket_caps(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    run_job("caps", 2, tmp_path)  # rank 0: bucket_cap_mb=None; rank 1: 0.0003
    unused = {"find_unused_parameters": True}
    pm = ddpviz.postmortem(tmp_path, make_model(), settings=unused)  # rank 0's settings
    f = _one(pm, "plan_mismatch")
    assert f.ranks == (1,) and f.step == 0 and f.bucket == 0
    sizes = f.values[0][0]
    assert sizes.startswith("all_reduce sizes [")
    # the sizes rank 1 reduced add up to the whole model, in more than one bucket
    total = sum(p.numel() for p in make_model().parameters())
    assert sum(int(x) for x in sizes.split("[")[1].split("]")[0].split(", ")) == total
    # planned with rank 1's settings, rank 1's buckets are DDP's own
    pm1 = ddpviz.postmortem(tmp_path, make_model(), settings={"bucket_cap_mb": 0.0003, **unused})
    assert not [g for g in pm1.findings if g.kind == "plan_mismatch"]
    phases = [r["ddp_phase"] for r in pm1.to_records() if r["rank"] == 1 and r["step"] == 0]
    assert phases[-1] == "used_map" and phases.count("bucket") > 1  # after the last bucket
    assert main(["postmortem", str(tmp_path), "--model", "tests.postmortem.jobs:make_model",
                 "--find-unused", "--json"]) == 1  # exit status 1: errors found
    assert '"kind": "plan_mismatch"' in capsys.readouterr().out
