"""`ddpviz record` on a real 2-rank torchrun job (tests/record/train_sides.py, no ddpviz import)
whose gradient-sync contract breaks on the ranks' different sides: a finding only rank 1 holds
is said as one line naming rank 1 alone (rank 0 stays silent: it saw nothing), a finding both
ranks hold from different call sites as one line naming both, with each rank's own sites; the
healthy twin says nothing; `ddpviz diagnose` keeps the same findings; and the job ends with
bitwise the parameters of the same job run without ddpviz. See [Note: one line per finding
per job] (ddpviz/record/said.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ddpviz
from tests.record.test_contract import digests, python, run, torchrun_of

pytestmark = pytest.mark.dist

SCRIPT = Path(__file__).with_name("train_sides.py")
PHASES = ("one_rank", "two_sites", "healthy")

__all__ = ["python"]  # (the fixture, shared)


def lines() -> dict[tuple[str, str], int]:
    return {(m[1], m[2]): n for n, text in enumerate(SCRIPT.read_text().splitlines(), start=1)
            if (m := re.search(r"# LINE:(\w+):(\w+)$", text))}


def test_a_finding_seen_from_two_sides_is_one_line_naming_the_right_ranks(
        python: str, tmp_path: Path) -> None:
    out = tmp_path / "traces"
    recorded = run([python, "-m", "ddpviz", "record", "--out", str(out), "--",
                    *torchrun_of(python, SCRIPT)])
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    plain = run(torchrun_of(python, SCRIPT))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert set(digests(plain.stdout)) == {(r, p) for r in (0, 1) for p in PHASES}
    assert digests(recorded.stdout) == digests(plain.stdout)  # bitwise, every phase

    at, script = lines(), r"\S*train_sides\.py"
    said = recorded.stderr
    # one line per finding for the job: two broken contracts, none for the healthy twin
    assert said.count("used gradients of DDP") == 2, said
    assert "DiagnosisWarning" not in said and "warnings.warn" not in said, said
    # only rank 1 held the evidence of DDP #0: named alone, said once (by rank 1)
    one = re.findall(r"^ddpviz: (.*?): optimizer step 0 used gradients of DDP #0 \(Sequential, "
                     rf"built at {script}:(\d+) in one_rank\)", said, re.M)
    assert one == [("rank 1", str(at[("one_rank", "built")]))], said
    assert len(re.findall(rf"^  rank 1: backward at {script}:{at[('one_rank', 'backward')]} ",
                          said, re.M)) == 1, said
    # both ranks held DDP #1's, each from its own line: one line naming both, both sites in it
    two = re.findall(r"^ddpviz: (.*?): optimizer step 0 used gradients of DDP #1 ", said, re.M)
    assert two == ["ranks 0,1"], said
    for rank in (0, 1):
        site = at[("two_sites", f"backward{rank}")]
        assert len(re.findall(rf"^  rank {rank}: backward at {script}:{site} in two_sites ",
                              said, re.M)) == 1, said

    findings = ddpviz.diagnose(out)
    contract = sorted((f for f in findings if f.kind == "unsynced_gradients"),
                      key=lambda f: f.ranks)
    assert [(f.ranks, f.field) for f in contract] == [((0, 1), "unused_ddp"),
                                                     ((1,), "unused_ddp")], findings
    assert [r for _, r in contract[0].values] == [(0,), (1,)], contract[0].values
    verdict = run([python, "-m", "ddpviz", "diagnose", str(out)])
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr  # errors found
    assert verdict.stdout.count("used gradients of DDP") == 2, verdict.stdout
