"""Fixtures for the real-browser tests: one JupyterLab server per session on a temporary copy
of notebooks/ (plus trace files), Debian's Chromium driven by Playwright, and a page that
records every console error and uncaught exception (each test asserts there were none).

Never `playwright install`: the tests use the system browser at /usr/bin/chromium and fail,
not skip, without it (`.ci/run` installs it from Debian's packages)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpviz.traces.trace import Trace
from tests.browser.lab import CHROMIUM, CHROMIUM_ARGS, ROOT, LabServer
from tests.browser.served import logged_page

# Screenshots land in out/screenshots (ignored by git); DDPVIZ_UPDATE_SCREENSHOTS=1 writes them
# into docs/screenshots instead, which is how the README's and the docs site's pictures are
# refreshed.
SCREENSHOTS = ROOT / ("docs" if os.environ.get("DDPVIZ_UPDATE_SCREENSHOTS") == "1" else "out") / (
    "screenshots")


@pytest.fixture(scope="session")
def lab_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lab-root")
    for path in (ROOT / "notebooks").iterdir():
        if path.suffix in (".ipynb", ".py"):
            shutil.copy2(path, root / path.name)
    return root


@pytest.fixture(scope="session")
def lab(lab_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with LabServer(lab_root, tmp_path_factory.mktemp("lab-home")) as server:
        if "ddpviz" not in server.federated_extensions():
            pytest.fail("ddpviz's JupyterLab extension is not installed in this environment "
                        f"({server.federated_extensions()} are).\nBuild and install it: "
                        "`pip install -e .` with node on PATH (make test does).")
        yield server


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium.\n"
                    "Install it: apt-get install -y chromium (.ci/run does).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        yield browser
        browser.close()


class ConsoleLog:
    """Console errors and uncaught page errors of one page."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def on_console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console.error: {message.text} ({message.location})")

    def on_page_error(self, error: Any) -> None:
        self.errors.append(f"uncaught: {error}\n{getattr(error, 'stack', '')}")


@pytest.fixture
def console() -> ConsoleLog:
    return ConsoleLog()


@pytest.fixture
def page(browser: Any, lab: LabServer, console: ConsoleLog) -> Iterator[Any]:
    lab.delete_sessions()
    with logged_page(browser, console, height=800, timeout_ms=60_000) as page:
        yield page


def screenshot(page: Any, name: str, locator: Any = None) -> Path:
    """Save a PNG into SCREENSHOTS (docs/screenshots feeds the README and the docs site)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    (locator or page).screenshot(path=str(path))
    return path


@pytest.fixture(scope="session")
def real_trace(lab_root: Path) -> Trace:
    """3 SGD steps of a small MLP under ddpviz's DDP on 2 gloo ranks, saved as run.ddpviz in
    the lab's root: the file the viewer, TraceView and marimo tests all draw (one launch)."""
    import ddpviz
    from tests.browser import rank_fns

    run = ddpviz.launch(rank_fns.train, 2, args=(3, 0.01), timeout=120)
    run.wait(timeout=150)
    run.trace.save(lab_root / "run.ddpviz")
    return Trace.load(lab_root / "run.ddpviz")
