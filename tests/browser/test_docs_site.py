"""The documentation site (`make docs`, out/docs/html) in Debian's Chromium: pages render with
the theme, their images load, the navigation reaches the user guide, the atlas and the
references, and no page logs a console error. Skipped, saying why, when the site was not built
(`make test` builds it beside pytest: these wait for it, tests/docs_build.py)."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import ROOT
from tests.browser.served import logged_page
from tests.docs_build import MARKS, wait_for_docs_build

pytestmark = [pytest.mark.browser, *MARKS]

SITE = ROOT / "out" / "docs" / "html"


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (as a reader's browser gets it, not file://)."""
    wait_for_docs_build()
    if not (SITE / "index.html").exists():
        pytest.skip(f"the docs site is not built ({SITE}/index.html is missing): run `make docs`")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/favicon.ico":  # what a browser asks any host for; the site has none
            self.send_response(204)
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def docs_page(browser: Any, console: ConsoleLog) -> Iterator[Any]:
    with logged_page(browser, console, height=900, timeout_ms=30_000) as page:
        yield page


def images(page: Any) -> list[dict[str, Any]]:
    """Every image in the article: its source and whether the browser decoded it."""
    result: list[dict[str, Any]] = page.eval_on_selector_all(
        "article img", "els => els.map(e => ({src: e.getAttribute('src'), "
        "loaded: e.complete && e.naturalWidth > 0, width: e.naturalWidth}))")
    return result


@pytest.mark.parametrize("path, title, pictures", [
    ("index.html", "ddpviz", 1),
    ("guide/jupyterlab.html", "In JupyterLab: the trace viewer", 3),
])
def test_a_page_renders_with_its_images(site: str, docs_page: Any, console: ConsoleLog,
                                        path: str, title: str, pictures: int) -> None:
    docs_page.goto(site + path, wait_until="load")
    heading = docs_page.locator("article h1").first
    assert heading.inner_text().strip().rstrip("#").strip() == title
    found = images(docs_page)
    assert len(found) == pictures, found
    assert all(i["loaded"] and i["width"] > 100 for i in found), found
    # the theme's navigation is there and leads to the pages a newcomer looks for
    nav = docs_page.locator("nav").all_inner_texts()
    assert any("User guide" in n for n in nav), nav
    screenshot(docs_page, f"docs_{path.replace('/', '_').removesuffix('.html')}")
    assert console.errors == []


def test_the_atlas_and_the_references_are_reachable_and_filled(site: str, docs_page: Any,
                                                              console: ConsoleLog) -> None:
    docs_page.goto(site + "index.html", wait_until="load")
    docs_page.get_by_role("link", name="atlas of DDP errors").first.click()
    docs_page.wait_for_url("**/errors.html")
    article = docs_page.locator("article").inner_text()
    assert "Expected to have finished reduction in the prior iteration" in article
    assert "ddpviz: 2 of 8 parameters got no gradient on rank 1" in article  # a generated example
    docs_page.goto(site + "reference/api.html", wait_until="load")
    assert docs_page.locator("dt[id='ddpviz.bucket_plan']").count() == 1
    docs_page.goto(site + "reference/cli.html", wait_until="load")
    assert "postmortem" in docs_page.locator("article").inner_text()
    assert console.errors == []
