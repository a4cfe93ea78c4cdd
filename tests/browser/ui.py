"""Driving JupyterLab's UI from Playwright: open a file, run every cell (retrying the racy
first 'Run All'), read prompts and error outputs, open a trace in the ddpviz viewer."""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from tests.browser.lab import LabServer

ERROR_MIME = "application/vnd.jupyter.error"

_PROMPTS = "[...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) " \
           ".jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"
_STARTED = f"() => {_PROMPTS}.some(t => /\\[(\\*|\\d+)\\]/.test(t))"
_FINISHED = f"() => {{ const p = {_PROMPTS}; " \
            "return p.length > 0 && p.every(t => /^\\[\\d+\\]:$/.test(t)); }"


def write_notebook(path: Path, cells: Sequence[str]) -> None:
    """A notebook of these code cells on the python3 kernel, written to `path`."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


def open_lab(page: Any, lab: LabServer, path: str = "") -> None:
    """Load JupyterLab in a new workspace (nothing open but the launcher) and wait until the
    file browser lists files and the launcher shows the kernels (their specs loaded); then
    open `path`, if given, from the file browser."""
    page.goto(lab.url(f"lab/workspaces/test-{secrets.token_hex(4)}"))
    page.wait_for_selector(".jp-DirListing-content .jp-DirListing-item")
    page.wait_for_selector(".jp-LauncherCard[data-category='Notebook']")
    if path:
        double_click_file(page, path)


def menu(page: Any, top: str, command: str) -> None:
    """Click a main-menu entry by its command id (e.g. 'runmenu:run-all')."""
    page.locator("#jp-MainMenu").get_by_role("menuitem", name=top, exact=True).click()
    page.locator(f"li[data-command='{command}']").click()


def run_all_cells(page: Any, timeout_s: float = 240) -> None:
    """Run every cell of the notebook in front and wait until each has its number."""
    start_all_cells(page)
    page.wait_for_function(_FINISHED, timeout=timeout_s * 1000)


def start_all_cells(page: Any) -> None:
    """Start running every cell of the notebook in front ('Run All'), not waiting for them.

    'Run All' before the kernel is connected opens a "Select Kernel" dialog, and right after
    connecting it is sometimes dropped: wait for the status bar's "| Idle", then repeat it
    until a prompt shows [*] or a number."""
    page.locator(".jp-StatusBar-Widget").get_by_text(re.compile(r"\| Idle$")).wait_for()
    for _ in range(8):
        no_dialog(page)
        menu(page, "Run", "runmenu:run-all")
        try:
            page.wait_for_function(_STARTED, timeout=8_000)
            break
        except Exception:  # playwright's TimeoutError: not started, try again
            continue
    else:
        raise AssertionError("'Run All Cells' never started the kernel (8 tries)")


def no_dialog(page: Any) -> None:
    """Fail with its text if a dialog (kernel choice, error) covers the page."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() > 0:
        raise AssertionError(f"JupyterLab shows a dialog: {dialog.first.inner_text()!r}")


def error_outputs(page: Any) -> list[str]:
    """Texts of the error outputs (tracebacks) in the page."""
    texts: list[str] = page.locator(f"[data-mime-type='{ERROR_MIME}']").all_inner_texts()
    return texts


def stream_text(page: Any) -> str:
    """All stdout text of the notebook in front."""
    texts = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) "
                         "[data-mime-type='application/vnd.jupyter.stdout']").all_inner_texts()
    return "\n".join(texts)


def double_click_file(page: Any, name: str) -> None:
    """Open a file the way a user does: double-click it in the file browser."""
    page.locator(".jp-DirListing-item", has=page.locator(
        f".jp-DirListing-itemText span:text-is('{name}')")).dblclick()


def wait_for_viewer(page: Any, name: str) -> Any:
    """The ddpviz viewer panel showing `name`, once rendered."""
    viewer = page.locator(".ddpviz-viewer:visible", has=page.locator(
        f".ddpviz-summary h2:text-is('{name}')"))
    viewer.wait_for()
    return viewer
