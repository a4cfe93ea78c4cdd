import os
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# Directories whose files share session fixtures: one JupyterLab server and Chromium
# (tests/browser), the unrecorded reference runs (tests/frameworks).
_SHARED = ("browser", "frameworks")


def work_unit(nodeid: str) -> str:
    """What one pytest-xdist worker runs as a whole (`make test` runs `-n 2`): a test file,
    since most files compute their real multi-rank runs once in a module fixture, and a
    directory of _SHARED whole."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in _SHARED:
        return "/".join(parts[:2])
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # (xdist's own --dist loadgroup marks no longer reach its scheduler under pytest 9.2,
    # which stopped reading the node id xdist rewrites)
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)
