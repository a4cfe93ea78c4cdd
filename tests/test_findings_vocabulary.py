"""One finding vocabulary: every `Kind` is described and has a fix, a Finding with a kind or
severity outside the vocabulary does not decode, and one situation has one fix text."""

from __future__ import annotations

import typing

import msgspec
import pytest

from ddpviz import findings
from ddpviz.findings import FIXES, KINDS, Finding, Kind, fix_for


def test_every_kind_is_described_and_has_a_usual_fix() -> None:
    kinds = set(typing.get_args(Kind))
    assert set(KINDS) == kinds
    assert set(FIXES) == kinds
    for kind, table in FIXES.items():
        assert table[""], f"{kind} has no usual fix"


def test_a_variant_without_its_own_text_gets_the_usual_fix() -> None:
    assert fix_for("param_mismatch", "shape") == fix_for("param_mismatch")
    assert fix_for("param_mismatch", "dtype") != fix_for("param_mismatch")
    assert "rank 3" in fix_for("peer_failed", rank=3)


def test_fix_texts_are_not_repeated_across_situations() -> None:
    texts = [t for kind, table in FIXES.items() if kind != "buffer_mismatch"
             for t in table.values()]
    assert len(texts) == len(set(texts))


@pytest.mark.parametrize("field", ["kind", "severity"])
def test_a_finding_outside_the_vocabulary_does_not_decode(field: str) -> None:
    good = {"kind": "rank_hang", "severity": "error", "title": "t"}
    msgspec.json.decode(msgspec.json.encode(good), type=Finding)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode({**good, field: "bogus"}), type=Finding)


def test_a_fix_names_the_policy_as_the_reader_turns_it_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # In Python: Recording(...); in a rank of `ddpviz record` and on the command line: the flag.
    monkeypatch.delenv("DDPVIZ_RECORD", raising=False)
    monkeypatch.setattr(findings, "_command_line", False)
    python = fix_for("nonfinite_parameter", "unseen")
    assert "recording=ddpviz.Recording(guard=True)" in python
    assert "recording=ddpviz.Recording(every=1)" in python and "--recording" not in python
    assert "DDPVIZ_RECORDING" not in fix_for("grad_order", "not_recorded")
    monkeypatch.setenv("DDPVIZ_RECORD", "1")
    for kind, variant in (("nonfinite_parameter", "unseen"), ("grad_order", "not_recorded")):
        text = fix_for(kind, variant)  # type: ignore[arg-type]
        assert "`ddpviz record --recording every=1 -- ...`" in text and "Recording(" not in text
    monkeypatch.delenv("DDPVIZ_RECORD")
    with findings.on_the_command_line():
        flag = findings.recording_advice("replicas=1")
        unseen = fix_for("nonfinite_parameter", "unseen")
    assert flag == "`ddpviz record --recording replicas=1 -- ...`"
    assert "`ddpviz record --recording guard -- ...`" in unseen
    assert "--recording" not in fix_for("nonfinite_parameter", "unseen")  # (and after it, not)


def test_a_field_a_fix_was_not_given_stays_as_written() -> None:
    assert fix_for("peer_failed", rank=3).startswith("Fix the error on rank 3;")
    assert fix_for("peer_failed").startswith("Fix the error on rank {rank};")
