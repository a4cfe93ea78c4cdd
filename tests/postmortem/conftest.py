"""The browser suite's fixtures (JupyterLab server, Chromium page), for test_lab_viewer.py."""

from tests.browser.conftest import browser, console, lab, lab_root, page  # noqa: F401
