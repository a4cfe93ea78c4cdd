"""Every ddpviz error that carries a diagnosis is a `ddpviz.DiagnosisError` with `.findings`
(tuples of `ddpviz.Finding`), still a RuntimeError, and keeps its findings across pickling."""

from __future__ import annotations

import ast
import importlib
import pickle
from pathlib import Path

import pytest

import ddpviz
from ddpviz import errors
from ddpviz.findings import Finding, fix_for

PACKAGE = Path(ddpviz.__file__).parent
FINDING = Finding(kind="rank_hang", severity="error", title="ranks 1 did not arrive",
                  ranks=(1,), step=3, fix=fix_for("rank_hang"), world_size=2)


def _classes_with_findings() -> list[tuple[str, str]]:
    """(module, class) of every exception class in ddpviz whose body mentions `findings`."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(b) for b in node.bases]
            exceptional = any(b.endswith(("Error", "Exception")) for b in bases)
            if exceptional and "findings" in ast.unparse(node):
                out.append((module, node.name))
    return out


def test_every_exception_with_findings_is_a_diagnosis_error() -> None:
    found = _classes_with_findings()
    assert {n for _, n in found} >= {"RankMismatchError", "RankHangError",
                                     "GradientGraphError", "UnusedParametersError"}
    for module, name in found:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, ddpviz.DiagnosisError), f"{module}.{name}"


@pytest.mark.parametrize("cls", [errors.RankMismatchError, errors.RankHangError,
                                 errors.GradientGraphError, errors.UnusedParametersError])
def test_each_is_caught_as_a_diagnosis_error_with_its_findings(cls: type) -> None:
    with pytest.raises(ddpviz.DiagnosisError) as info:
        raise cls("ddpviz: something is wrong", (FINDING,))
    e = info.value
    assert type(e) is cls and isinstance(e, RuntimeError)  # old `except RuntimeError` still works
    assert e.findings == (FINDING,) and str(e) == "ddpviz: something is wrong"
    again = pickle.loads(pickle.dumps(e))  # raised on a rank, read in the notebook
    assert type(again) is cls and again.findings == (FINDING,) and str(again) == str(e)
    assert cls("no findings").findings == ()


def test_a_real_model_mismatch_is_caught_with_one_finding_per_difference() -> None:
    from tests.engine.test_verify_report import MLP, rank, report

    comparison = report([rank(0, MLP), rank(1, MLP[:3])])
    try:
        comparison.raise_if_failed()
    except ddpviz.DiagnosisError as e:
        assert isinstance(e, ddpviz.RankMismatchError)
        assert e.findings == tuple(comparison.findings()) and e.findings
        assert e.report is comparison
        assert pickle.loads(pickle.dumps(e)).findings == e.findings
    else:
        pytest.fail("the differing model raised nothing")


def test_hang_error_keeps_positions() -> None:
    e = errors.RankHangError("m", (FINDING,), {1: {"step": 3}})
    again = pickle.loads(pickle.dumps(e))
    assert again.positions == {1: {"step": 3}} and again.findings == (FINDING,)
