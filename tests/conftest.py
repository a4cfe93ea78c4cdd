import os
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# Directories whose files share session fixtures: one JupyterLab server and Chromium
# (tests/browser). (tests/frameworks' unrecorded reference runs are each shared by the cases of
# one file only, so its files are units of their own: tests/frameworks/conftest.py.)
_SHARED = ("browser",)


def work_unit(nodeid: str) -> str:
    """What one pytest-xdist worker runs as a whole (`make test` runs `-n 2`): a test file,
    since most files compute their real multi-rank runs once in a module fixture, and a
    directory of _SHARED whole."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in _SHARED:
        return "/".join(parts[:2])
    return path


# Work units that run long for their number of tests, longest first (CI's durations, roughly:
# framework launches and notebook kernels ~30 s a test, torchrun jobs 10-40 s a test, torch's
# own DDP tests ~2 min in 2 tests). xdist starts the units with the most tests first, which
# left these among the last: one worker ran a long unit while the other had nothing left.
# (CI's seconds at stop 60, out/junit.xml through .ci/durations.py.)
LONG_UNITS = (
    "tests/browser",  # 833
    "tests/record/test_record.py",  # 509
    "tests/record/test_where.py",  # 263
    "tests/test_notebooks.py",  # 237
    "tests/record/test_collectives.py",  # 234
    "tests/frameworks/test_lightning.py",  # 224
    "tests/frameworks/test_lightning_hangs.py",  # 196
    "tests/frameworks/test_torch_forms.py",  # 195
    "tests/record/test_straggler.py",  # 180
    "tests/diagnose/test_scenarios.py",  # 159
    "tests/record/test_accum.py",  # 124
    "tests/record/test_nonfinite.py",  # 117
    "tests/conformance/test_conformance.py",  # 103
    "tests/debugger/test_many_ranks.py",  # 94
    "tests/launch/test_launch.py",  # 91
    "tests/frameworks/test_hf_trainer.py",  # 82
    "tests/dist/test_watch_quiet.py",  # 57
    "tests/frameworks/test_accelerate.py",  # 46
    "tests/record/test_attach.py",
    "tests/record/test_contract.py",
)


def long_units_first(workqueue: Any) -> None:
    """Move the LONG_UNITS waiting in xdist's work queue (an OrderedDict of units) to its
    front, in LONG_UNITS' order; the others keep xdist's order after them."""
    for unit in reversed(LONG_UNITS):
        if unit in workqueue:
            workqueue.move_to_end(unit, last=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `make test` builds the docs beside pytest: the tests that read the build (marker
    # docs_build, tests/docs_build.py) run last in their work unit, while the build runs
    items.sort(key=lambda item: item.get_closest_marker("docs_build") is not None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # (xdist's own --dist loadgroup marks no longer reach its scheduler under pytest 9.2,
    # which stopped reading the node id xdist rewrites)
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            long_units_first(self.workqueue)
            super()._assign_work_unit(node)

    return ByWorkUnit(config, log)
