from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.frameworks.harness import Run, side_by_side
from tests.record.hooked import hooked_python


@pytest.fixture(scope="session")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter with ddpviz's startup hook (tests/record/hooked.py)."""
    return hooked_python(tmp_path_factory.mktemp("frameworks-hooked"))


class Baselines:
    """Unrecorded runs, one per command, shared by the cases that compare against it.

    A key serves the cases of one test file only ("lightning": test_lightning.py; "torch-*":
    test_torch_forms.py): under xdist each file is a work unit of its own (tests/conftest.py),
    so its cases run on one worker and that worker makes each of its runs once."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.runs: dict[str, Run] = {}

    def get(self, key: str, run: Callable[[Path], Run]) -> Run:
        """The unrecorded run `key`, made by run(folder) the first time it is asked for."""
        if key not in self.runs:
            folder = self.folder / key
            folder.mkdir()
            self.runs[key] = run(folder)
        return self.runs[key]

    def beside(self, key: str, run: Callable[[Path], Run],
               recorded: Callable[[], Run]) -> tuple[Run, Run]:
        """recorded() and the unrecorded run `key`; the first time `key` is asked for, its
        run(folder) is made beside recorded() (side_by_side), not after it."""
        if key in self.runs:
            return recorded(), self.runs[key]
        folder = self.folder / key
        folder.mkdir()
        made, self.runs[key] = side_by_side(recorded, lambda: run(folder))
        return made, self.runs[key]


@pytest.fixture(scope="session")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> Baselines:
    return Baselines(tmp_path_factory.mktemp("frameworks-baselines"))
