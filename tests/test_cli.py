"""The command line: `ddpviz buckets TARGET`, `ddpviz demo` and `ddpviz diagnose TRACE`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import ddpviz
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
        ("ddpviz.units:human_bytes", "calling ddpviz.units:human_bytes() failed"),
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


# --- ddpviz diagnose, on traces of real 2-rank gloo runs ------------------------------------


def _record(fn: Any, folder: Path) -> Path:
    """Run `fn` on 2 ranks (ddpviz.launch) and save each rank's events in its own file, as
    `ddpviz record --out` or per-rank `ddpviz.connect()` files would be."""
    with ddpviz.listen(show=False) as session:
        run = ddpviz.launch(fn, 2, session=session, timeout=120)
        # the planted defect stops the ranks (RankError): their events are what we want
        with contextlib.suppress(ddpviz.RankError):
            run.wait()
        trace = session.trace
    folder.mkdir()
    for rank in trace.ranks:
        Trace(trace.events(rank), meta={**trace.meta, "rank": rank},
              clock={rank: trace.clock.get(rank, (0, 0))}).save(folder / f"rank{rank}.ddpviz")
    return folder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.widgets import rank_fns

    root = tmp_path_factory.mktemp("runs")
    return {"healthy": _record(rank_fns.torch_then_ddpviz, root / "healthy"),
            "planted": _record(rank_fns.rank_1_builds_another_head, root / "planted")}


@pytest.mark.dist
def test_diagnose_names_the_shape_planted_on_rank_1_and_exits_1(
        recorded: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(recorded["planted"])]) == 1  # a folder: its per-rank files
    out = capsys.readouterr().out
    assert out.startswith("ddpviz: errors: 2 errors.\n")  # the verdict first
    assert "from ranks 0,1 (world size 2)" in out
    assert "- parameter 4 '4.weight' has a different shape across ranks (rank 1):" in out
    assert re.search(r"rank 0: +\(1, 16\)\n +rank 1: +\(3, 16\)", out)
    assert "fix: All ranks must build the same model" in out
    files = sorted(str(p) for p in recorded["planted"].glob("*.ddpviz"))
    assert main(["diagnose", *files]) == 1  # the files themselves read the same
    assert capsys.readouterr().out.split("\n", 2)[2] == out.split("\n", 2)[2]


@pytest.mark.dist
def test_diagnose_json_carries_every_field_of_the_findings(
        recorded: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--json", str(recorded["planted"])]) == 1
    doc = json.loads(capsys.readouterr().out)
    findings = ddpviz.diagnose(Trace.merge(Trace.load(p) for p in
                                           sorted(recorded["planted"].glob("*.ddpviz"))))
    assert doc["schema"] == 1 and doc["verdict"] == "errors"
    assert doc["counts"] == {"error": 2, "warning": 0, "info": 0}
    assert [(f["kind"], f["name"], f["ranks"], f["field"]) for f in doc["findings"]] == [
        ("param_mismatch", "4.weight", [1], "shape"), ("param_mismatch", "4.bias", [1], "shape")]
    assert [f["text"] for f in doc["findings"]] == [f.text() for f in findings]
    assert set(doc["findings"][0]) == {*ddpviz.Finding.__struct_fields__, "text"}
    summary = doc["trace"]
    assert summary["ranks"] == [0, 1] and summary["world_size"] == 2
    assert len(summary["files"]) == 2 and summary["truncated"] is False
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d.*\+00:00", summary["started"])


@pytest.mark.dist
def test_diagnose_a_healthy_run_says_so_in_one_line_and_exits_0(
        recorded: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(recorded["healthy"])]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and out[0] == "ddpviz: healthy: no problems found."
    assert main(["diagnose", "--json", str(recorded["healthy"])]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "healthy" and doc["findings"] == []
    assert doc["trace"]["steps"] == 3


@pytest.mark.dist
def test_report_of_a_folder_opens_with_the_findings(recorded: dict[str, Path],
                                                    tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(recorded["planted"]), "-o", str(out)]) == 0
    page = out.read_text()
    findings = page.index("<section id='findings'>")
    assert findings < page.index("<section id='summary'>")
    assert "4.weight" in page[findings:page.index("</section>", findings)]
    assert "started_wall_ns" not in page


def test_diagnose_garbage_exits_2_and_says_what_is_wrong(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ddpviz"
    bad.write_bytes(b"not a trace at all")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [([str(bad)], "is not a ddpviz trace"),
             ([str(tmp_path / "nope.ddpviz")], "no file"),
             ([str(empty)], "holds no *.ddpviz file")]
    for args, what in cases:
        assert main(["diagnose", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ddpviz: ") and what in err and args[0] in err, err
        assert len(err.strip().splitlines()) >= 2  # then how to fix it


def test_diagnose_is_on_the_help_and_runs_as_a_command(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ddpviz", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "diagnose" in r.stdout
    path = tmp_path / "t.ddpviz"
    Trace().save(path)
    r = subprocess.run([sys.executable, "-m", "ddpviz", "diagnose", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "healthy" in r.stdout, r.stdout + r.stderr


def test_diagnose_never_prints_a_traces_control_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ddpviz import events as ev

    sneaky = ddpviz.Finding(kind="rank_hang", severity="error",
                            title="\x1b[2K\x1b[1Ahidden\x07", detail=("a\rb",))
    path = tmp_path / "t.ddpviz"
    Trace([ev.FindingReported(0, 0, 1, 0, sneaky)]).save(path)
    assert main(["diagnose", str(path)]) == 1
    out = capsys.readouterr().out
    assert "\\x1b[2K\\x1b[1Ahidden\\x07" in out and "a\\x0db" in out
    assert not any(c in out for c in "\x1b\x07\r")


@pytest.mark.parametrize("verb", [["diagnose"], ["diagnose", "--json"], ["--help"]])
def test_a_reader_that_left_ends_the_command_quietly(tmp_path: Path, verb: list[str]) -> None:
    # `ddpviz diagnose DIR | head`: head leaves early. The pipe's read end is closed before
    # the command starts, so every write meets a pipe without a reader (deterministically).
    from ddpviz import events as ev

    finding = ddpviz.Finding(kind="rank_hang", severity="error", title="a hang",
                             detail=tuple(f"line {i}" for i in range(1000)))
    path = tmp_path / "t.ddpviz"
    Trace([ev.FindingReported(0, 0, 1, 0, finding)]).save(path)
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "ddpviz", *verb,
                            *([str(path)] if verb[0] == "diagnose" else [])],
                           stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert r.stderr == ""  # no BrokenPipeError traceback
    if verb[0] == "diagnose":
        assert r.returncode == 128 + 13  # as a command killed by SIGPIPE


def test_the_help_maps_every_command_to_a_python_name_that_exists() -> None:
    import argparse
    import re

    from ddpviz.cli import PYTHON_NAMES, build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    mapped = dict(re.findall(r"^  ddpviz (\w+) .*?\s(ddpviz\.[\w.]+)\(", PYTHON_NAMES, re.M))
    assert set(mapped) == set(commands) - {"demo"}
    for spelling in mapped.values():
        obj: Any = ddpviz
        for part in spelling.split(".")[1:]:
            obj = getattr(obj, part)
        assert callable(obj), spelling
    assert PYTHON_NAMES in parser.format_help()
