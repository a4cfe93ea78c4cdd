"""How a rank is armed for the debugger: DDPVIZ_DEBUG=1 from launch(debug=True) or
`ddpviz record --debug` (only with --connect); without it, no debugger exists in the rank."""

from __future__ import annotations

import pytest

from ddpviz.debugger import controller
from ddpviz.record.command import RecordError, record_env, run_recorded


def test_record_debug_sets_the_variable_and_needs_connect():
    env = record_env(connect="tcp://127.0.0.1:1#" + "s" * 32, out=None, hang_timeout=None,
                     base={}, debug=True)
    assert env[controller.ENV_DEBUG] == "1"
    assert controller.ENV_DEBUG not in record_env(connect=None, out="x", hang_timeout=None,
                                                   base={})
    with pytest.raises(RecordError, match=r"--debug .* needs --connect"):
        run_recorded(["--", "true"], debug=True)


def test_without_the_variable_nothing_is_installed(monkeypatch: pytest.MonkeyPatch):
    class FakeSender:
        def on_control(self, cb: object) -> None:
            raise AssertionError("a rank without DDPVIZ_DEBUG=1 must not take control")

    monkeypatch.delenv(controller.ENV_DEBUG, raising=False)
    assert controller.install_from_env(FakeSender(), 0) is None
    monkeypatch.setenv(controller.ENV_DEBUG, "0")
    assert controller.install_from_env(FakeSender(), 0) is None
