"""The docs build that `make test` runs beside pytest (Makefile): a test that reads its output
(the site, the atlas's generated examples) waits for it. `DDPVIZ_DOCS_STATUS` names the file
the build writes its exit status to when it ends; without it (pytest run alone) the test reads
what an earlier `make docs` left, and says so where nothing is there."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ENV = "DDPVIZ_DOCS_STATUS"
WAIT_S = 1200.0  # the build beside a loaded suite: ~95 s alone, a few minutes beside it
TIMEOUT_S = WAIT_S + 300  # a waiting test's pytest timeout
# a test that waits for it carries these: run last in its unit, and a timeout that allows the wait
MARKS = (pytest.mark.docs_build, pytest.mark.timeout(TIMEOUT_S))


def wait_for_docs_build() -> None:
    """Return once the docs build running beside pytest has succeeded (at once when none is);
    fail, pointing at its log, when it failed or never ended."""
    path = os.environ.get(ENV)
    if not path:
        return
    status = Path(path)
    deadline = time.monotonic() + WAIT_S
    while not status.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the docs build beside pytest did not end in {WAIT_S:.0f} s "
                        f"({status} was never written): see out/docs.log")
        time.sleep(1.0)
    code = status.read_text().strip()
    if code != "0":
        pytest.fail(f"`make docs` failed (exit status {code}), so the built docs cannot be "
                    f"tested: see out/docs.log")
