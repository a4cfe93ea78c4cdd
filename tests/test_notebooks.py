"""Every notebook in notebooks/ runs top to bottom in a fresh python3 kernel without errors, and
is stored without outputs. Notebook-specific checks look at what the run printed and at the
widget state nbclient stored."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def stream_text(nb: Any) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream")


def widget_state(nb: Any) -> dict[str, Any]:
    state: dict[str, Any] = nb.metadata["widgets"][WIDGET_STATE]["state"]
    return state


def check_01_buckets(nb: Any) -> None:
    text = stream_text(nb)
    assert "BucketPlan for TinyLM: 52 parameters" in text  # print(plan)
    assert "Initial buckets (iteration 0), in reduction order: 1" in text
    assert "Rebuilt buckets (iteration 1 on; gradient-ready order measured)" in text
    assert "bucket closed at step" in text  # the replay section
    state = widget_state(nb)
    figures = [m for m in state.values() if m["model_module"] == "anywidget"
               and m["state"].get("_anywidget_id", "").startswith("plotly.")]
    assert len(figures) == 1  # one BucketMap, shown twice, has one FigureWidget
    traces = figures[0]["state"]["_widget_data"]
    assert {t["type"] for t in traces[:-1]} == {"bar"} and traces[-1]["type"] == "scatter"
    assert sum(len(t["x"]) for t in traces[:-1]) == 52  # one segment per parameter
    maps = [m for m in state.values() if m["model_name"] == "VBoxModel"]
    assert len(maps) == 1
    print(f"\n01_buckets widget state: {len(json.dumps(nb.metadata['widgets'])):,} bytes")


def check_00_tour(nb: Any) -> None:
    text = stream_text(nb)
    assert "✔ identical on all 2 ranks: 6 parameters, 0 buffers" in text
    assert "{'4.weight': ('same', 'differs'), '4.bias': ('same', 'differs')}" in text
    assert "rebuilt: [[5, 4, 3, 2], [1, 0]] planner: [[5, 4, 3, 2], [1, 0]]" in text
    state = widget_state(nb)
    figures = [m for m in state.values() if m["model_module"] == "anywidget"
               and m["state"].get("_anywidget_id", "").startswith("plotly.")]
    assert figures == []  # the dashboards draw in the browser, with no plotly figure
    boards = [m for m in state.values() if "events_sent" in m["state"]]
    assert len(boards) == 3  # the live run's, the failing run's and the replay's
    assert all(m["state"]["events_sent"] > 0 for m in boards)


def check_04_debugging(nb: Any) -> None:
    text = stream_text(nb)
    assert "rank 1: shape=(4, 32) dtype=float64" in text  # 1: dtype, named on every rank
    assert "error: parameter 2 '2.weight' has a different shape across ranks:" in text  # 2
    assert "parameter 4 'aux.weight' (4, 32): not used in forward on rank 1" in text  # 3
    assert "ddpviz: rank 1 did not reach the all-reduce of bucket 0 at step 2 within 3s" in text
    assert "gradients became ready in a different order on rank 1" in text  # 5
    assert text.count("every rank got the same message:") == 4


def check_06_postmortem(nb: Any) -> None:
    text = stream_text(nb)
    assert "Flight Recorder dumped to" in text and "['fr_0', 'fr_1']" in text
    # without the model: collective terms; with it: the bucket, step and parameters
    # (the pickle form has stacks: rank 0's all-reduce was launched from inside backward)
    assert "ddpviz: rank 1 never launched collective #13 (DDP's all_reduce [4810] float32)" \
        in text
    assert ("ddpviz: rank 1 never launched bucket 0 of step 4 (5.bias … 3.weight, 4 params, "
            "18.8 KiB); rank 0 waits in it") in text
    assert "rank 1: last completed: bucket 1 of step 3 (1.bias … 0.weight" in text
    assert "rank_hang | ranks (1,) | step 4 | bucket 0" in text
    assert "exit status 1" in text
    assert "refused to load posix.system" in text
    views = [m for m in widget_state(nb).values() if m["model_name"] == "HTMLModel"
             and "never launched bucket 0 of step 4" in m["state"].get("value", "")]
    # rank 0 launched both buckets of step 4 and waits in them: two red cells
    assert len(views) == 1 and views[0]["state"]["value"].count("background:#f04438") == 2


def check_07_debugger(nb: Any) -> None:
    check_07_debugger_text(stream_text(nb))


def check_07_debugger_text(text: str) -> None:
    """07_debugger's printed results (run here through nbclient, and in JupyterLab by
    tests/browser/test_lab_notebook.py)."""
    # every bucket of step 1 stopped at, its buffer before (each rank's own gradients, scaled)
    # and after (bitwise equal on both ranks, the mean); a launched bucket refused meanwhile
    buckets = text.count("before its all-reduce (")
    assert buckets >= 2
    assert text.count("each rank's own gradients x 1/world_size: True | the ranks differ: "
                      "True") == buckets
    assert text.count("bitwise equal on every rank: True | the mean of the local gradients: "
                      "True | the sum of the buffers before: True") == buckets
    assert "may still be running on rank 0" in " ".join(text.split())  # (wrapped)
    assert "final parameters bitwise equal to the unpaused run's: True" in text
    assert "and equal on every rank: True" in text
    assert "False" not in text


CHECKS: dict[str, Callable[[Any], None]] = {"00_tour.ipynb": check_00_tour,
                                             "06_postmortem.ipynb": check_06_postmortem,
                                             "07_debugger.ipynb": check_07_debugger,
                                             "04_debugging.ipynb": check_04_debugging,
                                             "01_buckets.ipynb": check_01_buckets}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_saved_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient import NotebookClient

    # the kernel imports this checkout's ddpviz, installed or not
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=True,
                            allow_errors=True, resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [f"cell {i}: {o.ename}: {o.evalue}" for i, c in enumerate(nb.cells)
              if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    shown = [o.data[WIDGET_VIEW]["model_id"] for c in nb.cells if c.cell_type == "code"
             for o in c.outputs if WIDGET_VIEW in o.get("data", {})]
    if shown:
        assert set(shown) <= set(widget_state(nb))  # every displayed widget's state was stored
    check = CHECKS.get(path.name)
    if check is not None:
        check(nb)
