"""A notebook host other than JupyterLab (marimo, Notebook 7) run by a browser test: a server
process on 127.0.0.1 behind a random token, its output in a log the failures quote."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class ServedProcess:
    """`command` started in `cwd`; `wait(url)` until `url` answers, `close()` ends it."""

    def __init__(self, name: str, command: list[str], *, cwd: Path, env: dict[str, str],
                 log: Path) -> None:
        self.name, self._log = name, log
        self._proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log.open("wb"),
                                      stderr=subprocess.STDOUT)

    def wait(self, url: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self._log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        raise AssertionError(f"{self.name} did not answer in {timeout} s: "
                             f"{self._log.read_text()[-3000:]}")

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@contextmanager
def logged_page(browser: Any, console: Any, *, height: int = 1500,
                timeout_ms: float | None = None) -> Iterator[Any]:
    """A page of its own (1280 px wide, `height` tall, device scale 1) whose console errors
    and uncaught errors go to `console` (conftest.ConsoleLog), each wait within `timeout_ms`
    (None: Playwright's default); closed after."""
    context = browser.new_context(viewport={"width": 1280, "height": height},
                                  device_scale_factor=1)
    page = context.new_page()
    page.on("console", console.on_console)
    page.on("pageerror", console.on_page_error)
    if timeout_ms is not None:
        page.set_default_timeout(timeout_ms)
    try:
        yield page
    finally:
        context.close()
