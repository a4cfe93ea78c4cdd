"""The recording policy (recording.py) on its own: which steps are full, `recording=` then
$DDPVIZ_RECORDING then the default, its grammar and errors, and the old level names (`detail=`,
$DDPVIZ_DETAIL) mapped with a DeprecationWarning that names the new spelling."""

from __future__ import annotations

import pytest

from ddpviz import Recording
from ddpviz.recording import EVERY, FIRST_FULL, DetailPolicy, resolve_recording


def test_full_and_buckets_are_every_step_and_no_step() -> None:
    assert all(DetailPolicy("full").full(s) for s in range(300))
    assert not any(DetailPolicy("buckets").full(s) for s in range(300))


def test_sampled_is_full_on_the_first_steps_every_nth_the_rebuild_and_around_findings() -> None:
    p = DetailPolicy("sampled", every=10)
    p.note_rebuild(13)
    p.note_finding(21)
    full = [s for s in range(40) if p.full(s)]
    assert full == [0, 1, 2, 10, 13, 20, 21, 22, 30]
    assert FIRST_FULL == 3 and EVERY == 100  # the documented default (docs/guide, docstrings)


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("DDPVIZ_RECORDING", raising=False)
    monkeypatch.delenv("DDPVIZ_DETAIL", raising=False)
    return monkeypatch


def test_recording_from_argument_then_environment_then_default(no_env: pytest.MonkeyPatch
                                                               ) -> None:
    assert resolve_recording(None, where="watch()") == Recording(guard=False, every=100)
    assert DetailPolicy.of(Recording()).describe() == "sampled:100"  # one default, both engines
    no_env.setenv("DDPVIZ_RECORDING", " Guard , every=never")
    assert resolve_recording(None, where="w") == Recording(guard=True, every=None)
    assert resolve_recording(Recording(every=7), where="w") == Recording(every=7)  # arg wins
    no_env.setenv("DDPVIZ_RECORDING", "every=1")
    assert DetailPolicy.of(resolve_recording(None, where="w")).level == "full"
    no_env.setenv("DDPVIZ_RECORDING", "guard=false,every=5")
    assert resolve_recording(None, where="w") == Recording(every=5)
    assert DetailPolicy.of(Recording(every=None)).level == "buckets"


def test_the_environment_spelling_round_trips() -> None:
    for rec in (Recording(), Recording(True, 1), Recording(True, None), Recording(False, 7)):
        assert Recording.parse(str(rec)) == rec


@pytest.mark.parametrize("bad", ["every=0", "every=x", "guard=maybe", "guard,guard", "sampled",
                                 "every", "full:3"])
def test_bad_environment_values_are_refused_with_the_grammar(bad: str) -> None:
    with pytest.raises(ValueError, match=r"(?s)not a recording policy.*'every=never'.*\nUse e.g."):
        Recording.parse(bad)


def test_an_old_name_in_the_new_variable_says_its_new_spelling() -> None:
    with pytest.raises(ValueError, match=r"'sampled' is an old level name: write guard,every=100"):
        Recording.parse("sampled")


@pytest.mark.parametrize("bad", [{"every": 0}, {"every": True}, {"every": 2.5}, {"guard": 1}])
def test_bad_fields_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises((TypeError, ValueError), match=r"Recording\((every|guard)="):
        Recording(**bad)  # type: ignore[arg-type]


def test_a_string_or_both_arguments_are_refused(no_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match=r"is not a ddpviz.Recording.*\nPass e.g."):
        resolve_recording("guard", where="watch()")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="both recording= and detail="):
        resolve_recording(Recording(), "full", where="watch()")


OLD = {"light": Recording(False, 100), "light:5": Recording(False, 5),
       "steps": Recording(False, None), "sampled": Recording(True, 100),
       "sampled:7": Recording(True, 7), "full": Recording(True, 1), "params": Recording(True, 1),
       "buckets": Recording(True, None), " Full ": Recording(True, 1)}


@pytest.mark.parametrize("old", list(OLD))
def test_old_detail_names_map_exactly_with_a_deprecation(no_env: pytest.MonkeyPatch,
                                                         old: str) -> None:
    new = OLD[old]
    with pytest.warns(DeprecationWarning, match=rf"watch\(\) detail={old!r} is deprecated.*"
                      rf"use recording={new.spelled().replace('(', '.').replace(')', '.')}"):
        assert resolve_recording(None, old, where="watch()") == new
    no_env.setenv("DDPVIZ_DETAIL", old)
    with pytest.warns(DeprecationWarning, match=rf"DDPVIZ_DETAIL={old!r} is deprecated.*"
                      rf"use DDPVIZ_RECORDING={new}"):
        assert resolve_recording(None, where="DistributedDataParallel()") == new
    no_env.setenv("DDPVIZ_RECORDING", "guard,every=3")  # the new variable wins, no warning
    assert resolve_recording(None, where="w") == Recording(True, 3)


@pytest.mark.parametrize("bad", ["param", "buckets:3", "sampled:0", "sampled:x", "light:0",
                                 "everything"])
def test_unknown_old_names_are_refused_with_the_new_spelling(no_env: pytest.MonkeyPatch,
                                                             bad: str) -> None:
    with pytest.raises(ValueError, match=rf"(?s)detail={bad!r} is not a detail level.*\nPass "
                       r"recording=ddpviz.Recording"):
        resolve_recording(None, bad, where="watch()")
    no_env.setenv("DDPVIZ_DETAIL", bad)
    with pytest.raises(ValueError, match=r"(?s)is not a detail level.*\nSet DDPVIZ_RECORDING"):
        resolve_recording(None, where="watch()")


def test_stack_source_is_on_by_default_and_spelled_only_when_off(
        no_env: pytest.MonkeyPatch) -> None:
    """Recording(stack_source=False) keeps source text out of hang stacks (issue #37, D1); the
    same in $DDPVIZ_RECORDING, for `ddpviz record` and launched ranks."""
    from ddpviz.recording import stack_source_from_env

    assert Recording().stack_source and str(Recording()) == "every=100"
    off = Recording(stack_source=False)
    assert str(off) == "every=100,stack_source=false"
    assert off.spelled() == "ddpviz.Recording(guard=False, every=100, stack_source=False)"
    for text in ("stack_source=false", "stack_source=off", " STACK_SOURCE = No ,every=100"):
        assert Recording.parse(text) == off
    assert Recording.parse(str(off)) == off and Recording.parse("stack_source").stack_source
    for bad in ("stack_source=maybe", "stack_source=false,stack_source=false"):
        with pytest.raises(ValueError, match="'stack_source=false'"):
            Recording.parse(bad)
    with pytest.raises(TypeError, match="stack_source"):
        Recording(stack_source="no")  # type: ignore[arg-type]
    assert stack_source_from_env()
    no_env.setenv("DDPVIZ_RECORDING", "guard,stack_source=false")
    assert resolve_recording(None, where="watch()") == Recording(guard=True,
                                                                 stack_source=False)
    assert not stack_source_from_env()
    no_env.setenv("DDPVIZ_RECORDING", "stack_source=perhaps")
    assert not stack_source_from_env()  # unreadable: the source stays out
