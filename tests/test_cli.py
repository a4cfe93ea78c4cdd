"""The command line: `ddpviz buckets TARGET` and `ddpviz demo`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ddpviz import Trace, bucket_plan
from ddpviz.cli import TargetError, load_target, main
from ddpviz.zoo import convnet, mlp


def test_buckets_table_names_every_parameter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["buckets", "ddpviz.zoo:convnet", "--bucket-cap-mb", "0.01"]) == 0
    out = capsys.readouterr().out
    model, _ = convnet()
    for name, _ in model.named_parameters():
        assert name in out
    assert "Rebuilt buckets" in out
    assert "bucket_cap_mb=0.01" in out


def test_buckets_json_equals_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["buckets", "ddpviz.zoo:mlp", "--bucket-cap-mb", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    model, x = mlp()
    plan = bucket_plan(model, bucket_cap_mb=1, example_inputs=x)
    assert data["buckets"] == plan.to_records()
    assert data["order_source"] == "measured"


def test_find_unused_flag_means_no_rebuild(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["buckets", "ddpviz.zoo:mlp", "--find-unused", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["limits"]["rebuild"] is None
    assert {r["map"] for r in data["buckets"]} == {"initial"}
    assert data["limits"]["initial"] == [1024 * 1024, 25 * 1024 * 1024]


def test_file_target(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "mymodel.py"
    f.write_text(textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    """))
    assert main(["buckets", f"{f}:build"]) == 0
    out = capsys.readouterr().out
    assert "1.weight" in out and "predicted" in out


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("nocolon", "must be 'package.module:callable'"),
        ("ddpviz.zoo:", "must be 'package.module:callable'"),
        ("no_such_pkg_xyz.mod:f", "cannot import module 'no_such_pkg_xyz.mod'"),
        ("ddpviz.zoo:nothing", "has no attribute 'nothing'; callables there: "),
        ("ddpviz.events:SCHEMA_VERSION", "not a callable"),
        ("missing/file.py:f", "no file 'missing/file.py'"),
        ("ddpviz.plan_table:human_bytes", "calling ddpviz.plan_table:human_bytes() failed"),
    ],
)
def test_bad_targets_say_what_is_wrong(target: str, fragment: str) -> None:
    with pytest.raises(TargetError) as e:
        load_target(target)
    assert fragment in str(e.value)
    assert str(e.value).startswith("ddpviz: ")


def test_factory_returning_a_non_module(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.py"
    f.write_text("def build():\n    return 42\n")
    assert main(["buckets", f"{f}:build"]) == 2
    assert "returned a int; it must return an nn.Module" in capsys.readouterr().err


def test_module_without_trainable_parameters(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "frozen.py"
    f.write_text("import torch\ndef build():\n    m = torch.nn.Linear(2, 2)\n"
                 "    m.requires_grad_(False)\n    return m\n")
    assert main(["buckets", f"{f}:build"]) == 2
    assert "doesn't have any parameter that requires a gradient" in capsys.readouterr().err


@pytest.mark.dist
def test_demo_plans_then_runs_a_real_two_rank_job(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "ddpviz", "demo", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BucketPlan for TinyTransformer" in r.stdout
    # the tied LM head is reduced once: 28 parameters, not 29
    assert "28 parameters" in r.stdout
    assert "replicas identical after 3 steps: yes" in r.stdout
    trace = Trace.load(tmp_path / "ddpviz-demo.ddpviz")
    assert sorted(trace.ranks) == [0, 1]
    kinds = {type(e).__name__ for e in trace}
    assert {"VerificationPassed", "BucketsRebuilt", "AllReduceDone"} <= kinds
    html = (tmp_path / "ddpviz-demo.html").read_text()
    assert "<html" in html.lower() and "ddpviz demo" in html


def test_demo_plan_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--plan-only"]) == 0
    out = capsys.readouterr().out
    assert "why: 'encoder.layers.0.linear2.weight' brought its bucket to 1.0 MiB" in out
    assert "2/2" not in out
