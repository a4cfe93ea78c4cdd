"""The detail-level policy (engine/detail.py) on its own: which steps are full, the
$DDPVIZ_DETAIL fallback, and errors for levels that do not exist."""

from __future__ import annotations

import pytest

from ddpviz.engine.detail import EVERY, FIRST_FULL, DetailPolicy, resolve_level
from ddpviz.watch import _watch_level


def test_full_and_buckets_are_every_step_and_no_step() -> None:
    assert all(DetailPolicy("full").full(s) for s in range(300))
    assert not any(DetailPolicy("buckets").full(s) for s in range(300))


def test_sampled_is_full_on_the_first_steps_every_nth_the_rebuild_and_around_findings() -> None:
    p = DetailPolicy("sampled", every=10)
    p.note_rebuild(13)
    p.note_finding(21)
    full = [s for s in range(40) if p.full(s)]
    assert full == [0, 1, 2, 10, 13, 20, 21, 22, 30]
    assert FIRST_FULL == 3 and EVERY == 100  # the documented default (README, docstrings)


def test_level_from_argument_then_environment_then_default(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.delenv("DDPVIZ_DETAIL", raising=False)
    assert resolve_level(None) == ("sampled", 100)
    monkeypatch.setenv("DDPVIZ_DETAIL", "buckets")
    assert resolve_level(None) == ("buckets", 100)
    assert resolve_level("sampled:7") == ("sampled", 7)  # the argument wins
    monkeypatch.setenv("DDPVIZ_DETAIL", "Full ")
    assert resolve_level(None)[0] == "full"
    monkeypatch.setenv("DDPVIZ_DETAIL", "steps")
    assert _watch_level(None)[0] == "steps"  # watch's own cheapest level


@pytest.mark.parametrize("bad", ["param", "buckets:3", "sampled:0", "sampled:x", ""])
def test_unknown_levels_are_refused_with_the_choices(bad: str) -> None:
    with pytest.raises(ValueError, match="'full', 'buckets', 'sampled'"):
        resolve_level(bad)


def test_watch_keeps_its_old_level_names_as_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPVIZ_DETAIL", raising=False)
    assert _watch_level("params")[0] == "full"
    assert _watch_level("buckets")[0] == "buckets"
    assert _watch_level("steps")[0] == "steps"
    assert _watch_level("sampled:7")[1].describe() == "sampled:7"
    # watch's default: no comm hook, sampled steps in full (the DDP's own default period)
    level, policy = _watch_level(None)
    assert (level, policy.describe()) == ("light", "sampled:100")
    assert _watch_level("light:5")[1].describe() == "sampled:5"
    monkeypatch.setenv("DDPVIZ_DETAIL", "Light")
    assert _watch_level(None)[0] == "light"
    with pytest.raises(ValueError, match=r"watch\(\) detail='everything'.*'steps'.*\nUse 'light'"):
        _watch_level("everything")
    with pytest.raises(ValueError, match=r"detail='light:0' is not"):
        _watch_level("light:0")
