"""How every rank composes the non-finite findings from the ranks' posts (probes/nonfinite.py),
without processes: which step, which ranks, what was and was not seen, episodes counted."""

from __future__ import annotations

import torch

from ddpviz.events import Tap
from ddpviz.probes.nonfinite import NonfiniteCheck, _Post, _Record


def _check(world: int = 2) -> NonfiniteCheck:
    params = [torch.zeros(2), torch.zeros(3)]
    return NonfiniteCheck(params, ["a.weight", "a.bias"], 0, world, Tap(), "hook-less")


def test_parameters_seen_non_finite_after_unchecked_steps_say_between_which_forwards() -> None:
    check = _check()
    bad = _Record(step=25, loss=True, params=[1], n_params=1, grads=[1, 0], n_grads=2,
                  checked=True)
    check._posts = {0: _Post(done=30, fwd=30, ochk=[[0, 2], [25, 30]], gchk=[[0, 2]],
                             bad=[bad]),
                    1: _Post(done=30, fwd=30, ochk=[[0, 2], [25, 30]], gchk=[[0, 2]],
                             bad=[bad, _Record(step=26, loss=True, checked=True)])}
    [f] = check.compose()
    assert (f.kind, f.step, f.ranks, f.name) == ("nonfinite_parameter", 3, (0, 1), "a.bias")
    assert "between step 2's forward and step 25's forward" in f.title
    assert check.repeats == 1  # step 26 continues the episode
    assert check.compose() == []  # composed once


def test_finite_gradients_before_non_finite_parameters_blame_the_update() -> None:
    check = _check()
    check._posts = {r: _Post(done=9, fwd=9, ochk=[[0, 9]], gchk=[[0, 9]],
                             bad=[_Record(step=6, loss=True, params=[0], n_params=1)])
                    for r in (0, 1)}
    [f] = check.compose()
    assert (f.kind, f.step, f.ranks) == ("nonfinite_parameter", 5, (0, 1))
    assert "in step 5's update" in f.title and "finite on every rank" in f.detail[0]


def test_nothing_is_composed_until_every_rank_is_done_with_the_step() -> None:
    check = _check(3)
    rec = _Record(step=4, grads=[0], n_grads=1, checked=True)
    posts = {0: _Post(done=9, ochk=[[0, 9]], gchk=[[0, 9]], bad=[rec]),
             1: _Post(done=3, ochk=[[0, 3]], gchk=[[0, 3]])}
    check._posts = posts
    assert check.compose() == []  # rank 2 has not posted
    posts[2] = _Post(done=9, ochk=[[0, 9]], gchk=[[0, 9]])
    assert check.compose() == []  # rank 1 is not done with step 4
    posts[1] = _Post(done=9, ochk=[[0, 9]], gchk=[[0, 9]])
    [f] = check.compose()
    assert (f.kind, f.step, f.ranks, f.name, f.field) == (
        "nonfinite_gradient", 4, (0,), "a.weight", "gradient")


def test_a_gradient_finding_whose_loss_was_not_checked_says_so_and_presumes_no_cause() -> None:
    check = _check()
    rec = _Record(step=7, grads=[1], n_grads=1, checked=True)
    check._posts = {0: _Post(done=9, ochk=[[0, 2]], gchk=[[0, 9]]),
                    1: _Post(done=9, ochk=[[0, 2]], gchk=[[0, 9]], bad=[rec])}
    [f] = check.compose()
    assert (f.kind, f.step, f.ranks, f.field) == ("nonfinite_gradient", 7, (1,), "gradient")
    states = dict((r, v) for v, rs in f.values for r in rs)
    assert states[1].startswith("loss not checked at this step, local gradient non-finite")
    assert "loss finite" not in f.fix and "either can be where it began" in f.fix
    check._posts[1].ochk = [[0, 9]]  # the same, with the loss checked (finite) there
    check._composed, check._origins, check._last_bad = -1, set(), -10
    [f] = check.compose()
    assert f.fix.startswith("The loss was finite")


def test_a_finding_after_steps_the_checks_budget_skipped_says_how_often_each_rank_checked(
        ) -> None:
    # See [Note: the check's budget]: both ranks checked every 16th step (64, 80, 96, ...); the
    # NaN began on a skipped step and is seen at the next checked one, on every rank
    check = _check()
    bad = _Record(step=96, loss=True, params=[0], n_params=1, checked=True)
    thin = {"every": 16, "cost_ns": 90_000, "step_ns": 1_000_000}
    checked = [[0, 64], [80, 80], [96, 96]]
    check._posts = {r: _Post(done=99, fwd=99, ochk=checked, gchk=checked, bad=[bad], **thin)
                    for r in (0, 1)}
    [f] = check.compose()
    assert (f.kind, f.ranks) == ("nonfinite_parameter", (0, 1))
    assert "between step 80's forward and step 96's forward" in f.title
    text = " ".join(f.detail)
    assert "every 16th step on ranks 0,1" in text and "90 µs a step" in text, text
    assert "1 ms" in text and "whether a gradient (on which rank)" in text


def test_a_finding_where_every_step_was_checked_says_nothing_of_a_budget() -> None:
    check = _check()
    check._posts = {r: _Post(done=9, fwd=9, ochk=[[0, 9]], gchk=[[0, 9]],
                             bad=[_Record(step=6, loss=True, params=[0], n_params=1)])
                    for r in (0, 1)}
    [f] = check.compose()
    assert "held to" not in " ".join(f.detail)
