"""`import ddpviz` is the one import users need, and it stays light: names load on first use."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
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
    code = ("import ddpviz, ddpviz.watch, ddpviz.diagnose, ddpviz.preflight, ddpviz.postmortem\n"
            "print(all(callable(getattr(ddpviz, n)) and not isinstance(getattr(ddpviz, n), "
            "type(sys)) for n in ('watch', 'diagnose', 'preflight', 'postmortem')))")
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True,
                         text=True, timeout=300, check=True)
    assert out.stdout.strip() == "True"


def test_public_verification_report_is_preflights() -> None:
    from ddpviz.engine.verify import ModelComparison
    from ddpviz.preflight import VerificationReport

    assert ddpviz.VerificationReport is VerificationReport
    assert ModelComparison is not VerificationReport


def test_the_lazy_package_pickles_by_name_so_launched_functions_can_use_it() -> None:
    # A notebook function that refers to `ddpviz` is shipped to launch()'s ranks by cloudpickle.
    import pickle

    import cloudpickle

    def uses_ddpviz() -> str:
        return ddpviz.__version__

    assert cloudpickle.loads(cloudpickle.dumps(uses_ddpviz))() == ddpviz.__version__
    assert pickle.loads(pickle.dumps(ddpviz)) is ddpviz
