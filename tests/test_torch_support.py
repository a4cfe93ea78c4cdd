"""The tested torch releases, and `ddpviz record`'s one-line note for any other."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpviz import torch_support
from ddpviz.record import command


@pytest.mark.parametrize("version", ["2.13.0", "2.13.1", "2.13.0+cpu", "2.13.0.dev20260301",
                                     "2.14.1+cu130", "2.15.0+cu132"])
def test_a_tested_release_gets_no_note(version: str) -> None:
    assert torch_support.untested_note(version) is None


@pytest.mark.parametrize("version", ["2.6.0", "2.12.0", "2.16.0+cpu", "3.0.0a0", "garbage"])
def test_another_release_gets_a_note_naming_it_and_the_tested_ones(version: str) -> None:
    note = torch_support.untested_note(version)
    assert note is not None and f"torch {version} " in note
    assert all(v in note for v in torch_support.TESTED)


def test_the_installed_torch_is_read_from_metadata_without_importing_it() -> None:
    import torch

    # (the release; a build's local label, "+cpu" or "+cu132", is in one or both)
    installed = torch_support.installed()
    assert installed is not None
    assert installed.split("+")[0] == torch.__version__.split("+")[0]


def test_record_says_the_note_once_at_start_up_and_runs_the_command(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    if command.hook_path() is None:
        pytest.skip("ddpviz's startup hook is not installed in this Python")
    monkeypatch.setattr(command, "installed", lambda: "2.6.0")
    assert command.run_recorded(["true"], out=str(tmp_path)) == 0
    err = capsys.readouterr().err
    assert err.count("ddpviz: torch 2.6.0 is not among the releases") == 1
    monkeypatch.setattr(command, "installed", lambda: "2.13.0")
    assert command.run_recorded(["true"], out=str(tmp_path)) == 0
    assert "is not among the releases" not in capsys.readouterr().err
