"""`import ddpviz` is the one import users need, and it stays light: names load on first use."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import ddpviz

HEAVY = ("zmq", "cloudpickle", "ipywidgets", "plotly")


def _loaded_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter has loaded after running `code`."""
    probe = f"import sys\n{code}\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.parametrize("code", [
    "import ddpviz; ddpviz.DistributedDataParallel",
    "import ddpviz.engine.buckets",
    "from ddpviz import DistributedDataParallel, bucket_plan, diagnose, Trace",
    "import ddpviz; ddpviz.advise",
    "from ddpviz import DiagnosisError, Finding, RankHangError",
])
def test_the_engine_and_analysis_load_no_transport_or_widgets(code: str) -> None:
    assert _loaded_after(code) == []


def test_the_probe_sees_what_a_session_loads() -> None:
    assert "zmq" in _loaded_after("import ddpviz; ddpviz.connect")


def _type_checking_names() -> set[str]:
    tree = ast.parse(Path(ddpviz.__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    return {a.asname or a.name for n in block.body if isinstance(n, ast.ImportFrom)
            for a in n.names}


def test_all_names_the_lazy_table_and_the_type_checking_block_agree() -> None:
    lazy = set(ddpviz._WHERE)
    assert set(ddpviz.__all__) - {"__version__"} == lazy
    assert _type_checking_names() == lazy
    assert lazy <= set(dir(ddpviz))


@pytest.mark.parametrize("name", sorted(ddpviz._WHERE))
def test_every_public_name_resolves_to_its_owner(name: str) -> None:
    owner = importlib.import_module(ddpviz._WHERE[name])
    assert getattr(ddpviz, name) is getattr(owner, name)


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ddpviz.nope  # noqa: B018


def test_functions_keep_their_name_when_their_module_is_imported() -> None:
    # Importing a submodule binds it to the package attribute of its name: a function's module
    # is named apart from it, so these imports (in this order) leave every function in place.
    code = ("import ddpviz, ddpviz._diagnose.diagnosis, ddpviz._preflight, ddpviz._postmortem, "
            "ddpviz.advisor, ddpviz._watch, ddpviz._postmortem.dumps, ddpviz.advisor.measure\n"
            "names = ('watch', 'diagnose', 'preflight', 'postmortem', 'advise')\n"
            "print(all(callable(getattr(ddpviz, n)) and not isinstance(getattr(ddpviz, n), "
            "type(sys)) for n in names))")
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True,
                         text=True, timeout=300, check=True)
    assert out.stdout.strip() == "True"


def test_no_module_is_named_like_a_public_name() -> None:
    # Importing a module binds it to the package attribute of its name, replacing a function
    # of that name: so no module is named like a public function.
    package = Path(ddpviz.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir()
                                                        if (p / "__init__.py").exists()}
    assert set(ddpviz._WHERE) & modules == set()


def test_no_function_carries_attributes_but_a_deprecated_alias() -> None:
    for name in ddpviz.__all__:
        value = getattr(ddpviz, name)
        if isinstance(value, types.FunctionType):
            assert set(vars(value)) <= ({"measure"} if name == "advise" else set()), name


@pytest.mark.parametrize("old", sorted(ddpviz._MOVED))
def test_a_moved_name_still_resolves_with_a_warning_naming_the_new_spelling(old: str) -> None:
    owner, attr, spelling = ddpviz._MOVED[old]
    with pytest.warns(DeprecationWarning, match=re.escape(f"use {spelling}")):
        value = getattr(ddpviz, old)
    assert value is getattr(importlib.import_module(owner), attr)
    assert old not in ddpviz.__all__ and old not in dir(ddpviz)
    with pytest.warns(DeprecationWarning):  # every access warns, not only the first
        getattr(ddpviz, old)


def test_bucket_primitives_live_in_plan_and_load_from_the_one_import() -> None:
    from ddpviz.engine import buckets

    code = ("import ddpviz\nspec = ddpviz.plan.TensorSpec(4, 4, 'float32', 'cpu')\n"
            "print(ddpviz.plan.compute_bucket_assignment_by_size([spec] * 3, [32]))")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=300, check=True)
    spec = buckets.TensorSpec(4, 4, "float32", "cpu")
    assert out.stdout.strip() == str(buckets.compute_bucket_assignment_by_size([spec] * 3, [32]))
    import ddpviz.plan as plan

    assert plan.compute_bucket_assignment_by_size is buckets.compute_bucket_assignment_by_size
    assert plan.replay_bucket_assignment is buckets.replay_bucket_assignment
    assert plan.TensorSpec is buckets.TensorSpec


def test_the_old_advise_measure_spelling_warns_and_calls_the_new_one() -> None:
    from ddpviz.advisor import AdviceError

    with pytest.warns(DeprecationWarning, match="use ddpviz.advisor.measure"), \
            pytest.raises(AdviceError, match="needs an initialized process group"):
        ddpviz.advise.measure()  # type: ignore[attr-defined]


def test_public_verification_report_is_preflights() -> None:
    from ddpviz._preflight import VerificationReport
    from ddpviz.engine.verify import ModelComparison

    assert ddpviz.VerificationReport is VerificationReport
    assert ModelComparison is not VerificationReport


def test_the_lazy_package_pickles_by_name_so_launched_functions_can_use_it() -> None:
    # A notebook function that refers to `ddpviz` is shipped to launch()'s ranks by cloudpickle.
    import cloudpickle

    def uses_ddpviz() -> str:
        return ddpviz.__version__

    assert cloudpickle.loads(cloudpickle.dumps(uses_ddpviz))() == ddpviz.__version__


def test_the_reference_counts_the_top_level_names() -> None:
    # docs/reference/index.md ("Names: Python and the shell") lists the top level in words.
    readme = (Path(ddpviz.__file__).parents[1] / "docs" / "reference" / "index.md").read_text(
        encoding="utf-8")
    counted = re.search(r"\((\d+) names, `ddpviz.__all__`\)", readme)
    assert counted is not None and int(counted.group(1)) == len(ddpviz._WHERE)
    named = set(re.findall(r"`(\w+)`", readme[counted.start():readme.index("The rest is in")]))
    assert named == set(ddpviz._WHERE)
