"""The process's one IPython test shell with ddpviz's magics loaded, for the tests that run
`%%ddp` cells (tests/launch/test_magic.py, tests/debugger/test_pool.py): made by the first
module that asks, found by the others (IPython's test shell is one per process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def magic_shell() -> Iterator[Any]:
    """The shell, with no pool running before and after the module's tests."""
    from IPython.testing import globalipapp

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()
    assert ip is not None
    ip.run_line_magic("load_ext", "ddpviz")
    ip.run_line_magic("ddp_stop", "")
    yield ip
    ip.run_line_magic("ddp_stop", "")


def pool(shell: Any) -> Any:
    return shell.magics_manager.registry["DDPMagics"].pool


def run(shell: Any, capsys: pytest.CaptureFixture[str], cell: str) -> tuple[Any, list[str]]:
    """Run one cell: (the exception it raised or None, the lines it printed)."""
    result = shell.run_cell(cell)
    return result.error_in_exec, capsys.readouterr().out.splitlines()
