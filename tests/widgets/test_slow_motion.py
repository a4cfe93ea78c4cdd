"""Teaching mode: a Tap pauses after each event it emits (explicitly, or from
DDPVIZ_SLOW_MOTION, which ddpviz.launch(slow_motion=...) sets for the ranks); bad values are
refused with the fix. The real 2-rank check is in test_real_run.py."""

from __future__ import annotations

from itertools import pairwise

import pytest

import ddpviz
from ddpviz import events as ev


def test_a_slow_tap_spaces_its_events_by_the_pause() -> None:
    got: list[ev.Event] = []
    tap = ev.Tap(got.append, 0, slow_motion=0.01)
    for i in range(5):
        tap.emit(ev.GradReady, i, 0)
    gaps = [b.t_ns - a.t_ns for a, b in pairwise(got)]
    assert min(gaps) >= 0.01 * 1e9


def test_the_pause_comes_from_the_environment_by_default(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setenv(ev.ENV_SLOW_MOTION, "0.25")
    assert ev.Tap(None).slow_motion == 0.25
    assert ev.Tap(None, slow_motion=0).slow_motion == 0.0  # an explicit value wins
    monkeypatch.delenv(ev.ENV_SLOW_MOTION)
    assert ev.Tap(None).slow_motion == 0.0


def test_a_tap_without_an_emitter_never_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ev.ENV_SLOW_MOTION, "3600")
    ev.Tap(None).emit(ev.GradReady, 0, 0)  # returns at once: no events, no teaching


@pytest.mark.parametrize("raw", ["fast", "-1", "nan"])
def test_a_bad_environment_value_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(ev.ENV_SLOW_MOTION, raw)
    with pytest.raises(ValueError, match=f"ddpviz: DDPVIZ_SLOW_MOTION='{raw}' is not a number"):
        ev.Tap(lambda e: None)


@pytest.mark.parametrize("value", [-0.5, "0.2", True])
def test_launch_refuses_a_bad_slow_motion(value: object) -> None:
    with pytest.raises(ValueError, match="ddpviz: slow_motion must be seconds >= 0 or None"):
        ddpviz.launch(print, 2, slow_motion=value)  # type: ignore[arg-type]
