"""A launch() whose ranks issued different collectives and died before the live comparison saw
it: the ranks' rings of last collectives (a private folder of the run) name it in the RankError;
the healthy twin names nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ddpviz
from ddpviz.launcher import RankError
from tests.launch import rank_fns
from tests.record.hooked import marked_line

pytestmark = pytest.mark.dist

RING_SAID = "found after the job ended, from each rank's last collectives"


def test_a_late_mismatch_that_ends_a_launch_is_named_in_its_error() -> None:
    run = ddpviz.launch(rank_fns.late_gather, 2, args=(2, False), timeout=120)
    with pytest.raises(RankError) as info:
        run.wait()
    text = str(info.value)
    line = marked_line(Path(rank_fns.__file__), "late_gather")
    assert text.count(RING_SAID) == 1, text
    assert len(info.value.notes) == 1 and "ranks issued different collectives" in text
    for rank, n in ((0, 3), (1, 4)):
        assert re.search(rf"rank {rank}: all_gather\(float32 x{n} into 2\) at "
                         rf"\S*rank_fns.py:{line} in late_gather", text), text
    assert "at step 2" in text, text


def test_the_healthy_twin_of_that_launch_names_nothing() -> None:
    run = ddpviz.launch(rank_fns.late_gather, 2, args=(-1, False), timeout=120)
    assert run.wait() == ["done", "done"]
    kinds = {f.kind for f in ddpviz.diagnose(run)}
    assert not kinds & {"collective_mismatch", "unmatched_collective"}, kinds
