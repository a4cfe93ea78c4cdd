"""Data flows one way through ddpviz's modules; this test reads every module's imports to hold it.

Imports are read with `ast`: module-level and lazy (inside functions) imports both count;
imports under `if TYPE_CHECKING:` do not (they never run). The layers, bottom up:
- the vocabulary (events, findings, model_mismatch, errors, limits, envvars) imports only
  itself; the utilities (atomic saves, HTML escaping, the lab dependency list) import nothing
  from ddpviz;
- tracefile (the .ddpviz frame format, reader and writer), framecolumns (its decoder of hot
  events into columns), tablebytes (its encoder of columns), columnframe (the COLUMNS frame)
  and the columns they fill and read import only the vocabulary and each other;
- model/ (the run model: the one fold of the event stream) imports only the vocabulary, the
  columns and itself;
- engine/ (the DDP twin) imports only the vocabulary, the recording policy and engine/, and
  never probes/, not even for type checkers: the probes watch it through engine/observers.py;
- probes/ (what runs beside DDP on each rank) never import UI code (widgets/, ipywidgets,
  plotly, IPython): they run on the light rank-side install;
- transport/ never imports what consumes its events (sessions, the launcher, widgets, diagnosis,
  plans, reports, the Trace container, ...);
- widgets/ never import engine/ (they draw plans and events);
- the readers of runs (sessions, traces, widgets, the model) never import the launcher: a
  launch is one source of events among others;
- nothing outside widgets/ imports widgets/, except the convenience methods listed in
  UI_METHODS that open a widget for the object they belong to.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ddpviz

PACKAGE = Path(ddpviz.__file__).parent
VOCABULARY = {"ddpviz.events", "ddpviz.findings", "ddpviz.errors", "ddpviz.limits",
              "ddpviz.model_mismatch", "ddpviz.envvars"}
UTILITIES = {"ddpviz.atomic", "ddpviz.markup", "ddpviz.lab_deps", "ddpviz.private_dir",
             "ddpviz.units", "ddpviz.interrupts", "ddpviz.torch_support"}
FORMAT = {"ddpviz.traces.fileformat", "ddpviz.traces.framecolumns",  # the file format, both ways
          "ddpviz.traces.copies", "ddpviz.traces.tablebytes", "ddpviz.traces.columns",
          "ddpviz.traces.columnframe"}
# What transport/ feeds (it must work without any of them: the light rank-side install).
ABOVE_TRANSPORT = ("ddpviz.session", "ddpviz.launcher", "ddpviz.widgets", "ddpviz._diagnose",
                   "ddpviz.plan", "ddpviz.report", "ddpviz.traces.trace",
                   "ddpviz._postmortem", "ddpviz._preflight", "ddpviz._watch", "ddpviz.record",
                   "ddpviz.magic", "ddpviz.cli", "ddpviz.demo", "ddpviz.advisor")
# (module, function) -> why it may import a widget: each opens the UI for its own object.
UI_METHODS = {
    ("ddpviz.plan", "show"): "BucketPlan.show() returns the BucketMap widget of the plan",
    ("ddpviz.traces.trace", "dashboard"): "Trace.dashboard() opens the Dashboard over the trace",
    ("ddpviz.traces.trace", "view"): "Trace.view() opens the TraceView of the trace",
    ("ddpviz.session.live", "dashboard"): "Session.dashboard() opens the live Dashboard",
    ("ddpviz.launcher.run", "dashboard"): "Run.dashboard() opens the Dashboard of a launch",
    ("ddpviz._postmortem.report", "show"): "PostMortem.show() returns its PostMortemView",
    ("ddpviz.advisor.advice", "show"): "Advice.show() returns its AdviceView",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute ddpviz module names an `from ... import ...` reaches (a submodule when the
    imported name is one, else the module)."""
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if not source.startswith("ddpviz"):
        return []
    out = []
    for alias in node.names:
        full = f"{source}.{alias.name}"
        as_path = PACKAGE.parent / full.replace(".", "/")
        out.append(full if as_path.with_suffix(".py").exists() or as_path.is_dir() else source)
    return out


def _imports(path: Path) -> list[tuple[str, str, int, str]]:
    """(module, imported ddpviz module, line, enclosing function or '') for one file."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    out: list[tuple[str, str, int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child, function)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = function or node.name  # the outermost function names the method
        if isinstance(node, ast.Import):
            out.extend((module, a.name, node.lineno, function) for a in node.names
                       if a.name.split(".")[0] == "ddpviz")
        elif isinstance(node, ast.ImportFrom):
            out.extend((module, t, node.lineno, function)
                       for t in _resolve(module, is_package, node))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def _all_imports() -> list[tuple[str, str, int, str]]:
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if "labextension" not in p.parts]
    return [edge for p in files for edge in _imports(p)]


EDGES = _all_imports()


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _show(bad: list[tuple[str, str, int, str]]) -> str:
    return "\n".join(dict.fromkeys(f"{m}:{line} imports {t}" + (f" (in {f}())" if f else "")
                                   for m, t, line, f in bad))


def test_the_reader_sees_lazy_imports_and_skips_type_checking_blocks() -> None:
    edges = {(m, t, f) for m, t, _, f in EDGES}
    assert ("ddpviz.traces.trace", "ddpviz.widgets.dashboard", "dashboard") in edges  # lazy
    # TYPE_CHECKING only
    assert ("ddpviz.traces.trace", "ddpviz.widgets.dashboard", "") not in edges
    assert len({m for m, *_ in EDGES}) > 50  # every module was read


def test_vocabulary_imports_only_itself() -> None:
    bad = [e for e in EDGES if e[0] in VOCABULARY and e[1] not in VOCABULARY]
    assert not bad, "the vocabulary reaches up:\n" + _show(bad)


def test_utilities_import_nothing_from_ddpviz() -> None:
    bad = [e for e in EDGES if e[0] in UTILITIES]
    assert not bad, "a utility imports ddpviz:\n" + _show(bad)


def test_the_file_format_imports_only_the_vocabulary() -> None:
    bad = [e for e in EDGES if e[0] in FORMAT and e[1] not in VOCABULARY | FORMAT]
    assert not bad, "tracefile reaches up:\n" + _show(bad)


def test_the_model_imports_only_the_vocabulary_the_columns_and_itself() -> None:
    bad = [e for e in EDGES if _under(e[0], "ddpviz.model")
           and not (e[1] in VOCABULARY or e[1] == "ddpviz.traces.columns"
                    or _under(e[1], "ddpviz.model"))]
    assert not bad, "model/ reaches up:\n" + _show(bad)
    assert any(_under(m, "ddpviz.widgets") and _under(t, "ddpviz.model") for m, t, _, _f in EDGES)


def test_the_readers_of_runs_never_import_the_launcher() -> None:
    # whole rooms: a module added to one of them is held too
    readers = ("ddpviz.session", "ddpviz.traces", "ddpviz.widgets", "ddpviz.model",
               "ddpviz.report", "ddpviz._diagnose", "ddpviz.advisor")
    bad = [e for e in EDGES if _under(e[0], *readers) and _under(e[1], "ddpviz.launcher")]
    assert not bad, "a reader of runs imports the launcher:\n" + _show(bad)


def test_nothing_imports_a_private_name_of_another_module() -> None:
    # `from ddpviz.x import _name` from another package: a private helper that grew a user
    # elsewhere belongs in a module of its own (the spans left trace.py this way); siblings in
    # one subpackage (_watch/, launcher/) may share their private helpers
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        package = _module_name(path.parent / "__init__.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("ddpviz"):
                continue
            if package != "ddpviz" and node.module.rpartition(".")[0] == package:
                continue
            private = [a.name for a in node.names
                       if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                bad.append(f"{_module_name(path)}:{node.lineno} imports {private} from "
                           f"{node.module}")
    assert not bad, "\n".join(bad)


def _named_imports(package: str) -> list[tuple[str, int, str]]:
    """(module, line, imported module) of every absolute import in a package's files, those
    under `if TYPE_CHECKING:` and inside functions included (third-party names too)."""
    out = []
    for path in sorted((PACKAGE.parent / package.replace(".", "/")).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out += [(_module_name(path), node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.append((_module_name(path), node.lineno, node.module))
    return out


def test_the_twin_imports_only_the_vocabulary_the_recording_policy_and_itself() -> None:
    # The probes watch the twin through engine/observers.py (See [Note: twin and probes]), so
    # it never imports them; ddpviz_autowatch is the stdlib-only startup hook below
    # everything: its post-import hook also keeps ddpviz's frames out of dynamo (compiler.py)
    below = VOCABULARY | {"ddpviz.recording", "ddpviz_autowatch"}
    bad = [e for e in EDGES if _under(e[0], "ddpviz.engine")
           and not (e[1] in below or _under(e[1], "ddpviz.engine"))]
    assert not bad, "engine/ reaches up:\n" + _show(bad)
    typed = [f"{m}:{line} imports {t}" for m, line, t in _named_imports("ddpviz.engine")
             if _under(t, "ddpviz.probes")]
    assert not typed, "engine/ names probes/ (if only for type checkers):\n" + "\n".join(typed)
    assert any(_under(m, "ddpviz.probes") and t == "ddpviz.engine.observers"
               for m, t, _, _f in EDGES)  # the probes do implement the twin's interface


def test_the_probes_never_import_ui() -> None:
    bad = [e for e in EDGES if _under(e[0], "ddpviz.probes") and _under(e[1], "ddpviz.widgets")]
    bad += [(m, t, line, "") for m, line, t in _named_imports("ddpviz.probes")
            if _under(t, "ipywidgets", "plotly", "IPython")]
    assert not bad, "probes/ import UI code:\n" + _show(bad)


# The debugger's rank side (what runs inside a rank) and its wire protocol.
DEBUGGER_RANK_SIDE = ("ddpviz.debugger.protocol", "ddpviz.debugger.controller",
                      "ddpviz.debugger.agreement", "ddpviz.debugger.tensor_summary",
                      "ddpviz.debugger.run_code", "ddpviz.debugger.predicates")


def test_the_debuggers_rank_side_never_imports_ui_nor_the_notebook_side() -> None:
    rank_side = [m for m in DEBUGGER_RANK_SIDE if m != "ddpviz.debugger.protocol"]
    bad = [e for e in EDGES if e[0] in rank_side and (
        _under(e[1], "ddpviz.widgets", "ddpviz.session", "ddpviz.launcher")
        or (_under(e[1], "ddpviz.debugger") and e[1] not in DEBUGGER_RANK_SIDE
            and e[1] != "ddpviz.debugger"))]
    bad += [(m, t, line, "") for m, line, t in _named_imports("ddpviz.debugger")
            if m in rank_side and _under(t, "ipywidgets", "plotly", "IPython")]
    assert not bad, "the debugger's rank side imports UI or notebook code:\n" + _show(bad)
    # the protocol is shared with the notebook and the transport: the vocabulary only
    bad = [e for e in EDGES if e[0] == "ddpviz.debugger.protocol" and e[1] not in VOCABULARY]
    assert not bad, "debugger/protocol.py reaches up:\n" + _show(bad)
    assert any(e[0] == "ddpviz.debugger.controller" for e in EDGES)  # the rule reads them


def test_transport_never_imports_its_consumers() -> None:
    bad = [e for e in EDGES if _under(e[0], "ddpviz.transport") and _under(e[1], *ABOVE_TRANSPORT)]
    assert not bad, "transport/ reaches up:\n" + _show(bad)


def test_the_advisor_sits_above_the_engine_and_transport() -> None:
    # advise/ reads traces and plans (which use the engine's pure bucket functions); nothing
    # below it (engine, transport, the vocabulary) may import it
    bad = [e for e in EDGES if _under(e[1], "ddpviz.advisor") and _under(
        e[0], "ddpviz.engine", "ddpviz.transport", *VOCABULARY, *FORMAT)]
    assert not bad, "a lower layer imports the advisor:\n" + _show(bad)
    assert any(_under(m, "ddpviz.advisor") and t == "ddpviz.plan" for m, t, _, _f in EDGES)


def test_widgets_never_import_the_engine() -> None:
    bad = [e for e in EDGES if _under(e[0], "ddpviz.widgets") and _under(e[1], "ddpviz.engine")]
    assert not bad, "widgets/ import engine/ (draw plans and events instead):\n" + _show(bad)


def test_only_named_ui_methods_import_widgets() -> None:
    bad = [e for e in EDGES if _under(e[1], "ddpviz.widgets") and not _under(e[0], "ddpviz.widgets")
           and (e[0], e[3]) not in UI_METHODS]
    assert not bad, ("a module outside widgets/ imports a widget (add it to UI_METHODS only if "
                     "it is a method opening the UI of its own object):\n" + _show(bad))


@pytest.mark.parametrize("where", sorted(UI_METHODS))
def test_every_named_exception_is_still_needed(where: tuple[str, str]) -> None:
    assert any((m, f) == where and _under(t, "ddpviz.widgets") for m, t, _, f in EDGES), (
        f"{where} no longer imports a widget: remove it from UI_METHODS")


# --- reading traces never loads torch ---------------------------------------------------------
# Planning a model and running ranks need torch; reading what a run recorded (load, diagnose,
# the report, the Chrome export, the dashboard, the advisor, the CLI's help and its trace verbs)
# does not, and importing torch takes longer than all of those together.

_READERS = {
    "diagnose": "import ddpviz\nfound = ddpviz.diagnose(ddpviz.Trace.load(PATH))\n"
                "assert any(f.kind == 'param_mismatch' for f in found), found",
    "report": "from ddpviz.report.html import render\nfrom ddpviz.traces.trace import Trace\n"
              "assert 'finding-0' in render(Trace.load(PATH))",
    "chrome export": "import ddpviz\nt = ddpviz.Trace.load(PATH)\n"
                     "assert t.to_chrome_trace()['traceEvents']\n"
                     "t.write_chrome_trace(PATH + '.json')",
    "ddpviz --help": "from ddpviz.cli import main\ntry:\n    main(['--help'])\n"
                     "except SystemExit as e:\n    assert e.code == 0",
    "ddpviz diagnose": "from ddpviz.cli import main\nassert main(['diagnose', PATH]) == 1\n"
                       "assert main(['diagnose', '--json', PATH]) == 1",
    "ddpviz report": "from ddpviz.cli import main\n"
                     "assert main(['report', PATH, '-o', PATH + '.html']) == 0",
    "findings and errors": "import ddpviz\nddpviz.Finding, ddpviz.DiagnosisError, "
                           "ddpviz.RankHangError",
}
# on a healthy run with bucket maps and gradient hooks (what the planner and advisor read)
_PLANNERS = {
    # (the dashboard's bucket advice: its advisor thread replans the run's maps)
    "dashboard": "import time, ddpviz\nd = ddpviz.Trace.load(PATH).dashboard()\n"
                 "deadline = time.monotonic() + 120\n"
                 "while not d.advised and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
                 "assert d.advised\nd.close()",
    "advise": "import ddpviz\nassert ddpviz.advise(PATH).rows",
}


def _loads_torch(code: str, path: Path) -> bool:
    """Whether a fresh interpreter has imported torch after running `code` (PATH = path)."""
    import subprocess
    import sys

    probe = (f"import sys\nPATH = {str(path)!r}\n{code}\n"
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "True"


@pytest.fixture(scope="module")
def defective_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ddpviz.traces.trace import Trace
    from tests.diagnose.random_runs import DEFECTS, random_run

    path = tmp_path_factory.mktemp("trace") / "run.ddpviz"
    Trace(random_run(3, DEFECTS), meta={"started_wall_ns": 1_795_566_483_621_739_137}).save(path)
    return path


@pytest.fixture(scope="module")
def healthy_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ddpviz.traces.trace import Trace
    from tests.diagnose.synthetic import Ranks

    ranks = Ranks(2)
    ranks.construct()
    for step in range(4):
        for rank in (0, 1):
            ranks.iteration(rank, step)
    path = tmp_path_factory.mktemp("trace") / "healthy.ddpviz"
    Trace(ranks.events).save(path)
    return path


_WHY = ("imported torch: find the chain with python -X importtime and move the torch-needing "
        "import into the function that plans a module or runs ranks")


@pytest.mark.parametrize("reader", sorted(_READERS))
def test_reading_a_trace_never_imports_torch(reader: str, defective_trace: Path) -> None:
    assert not _loads_torch(_READERS[reader], defective_trace), f"{reader} {_WHY}"


@pytest.mark.parametrize("reader", sorted(_PLANNERS))
def test_replanning_a_recorded_run_never_imports_torch(reader: str, healthy_trace: Path) -> None:
    if reader == "dashboard":
        pytest.importorskip("ipywidgets")
    assert not _loads_torch(_PLANNERS[reader], healthy_trace), f"{reader} {_WHY}"


def test_the_probe_sees_torch_where_a_model_is_planned(defective_trace: Path) -> None:
    code = "from ddpviz.cli import main\nassert main(['buckets', 'ddpviz.zoo:mlp']) == 0"
    assert _loads_torch(code, defective_trace)
