"""One finding vocabulary: every `Kind` is described and has a fix, a Finding with a kind or
severity outside the vocabulary does not decode, and one situation has one fix text."""

from __future__ import annotations

import typing

import msgspec
import pytest

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
