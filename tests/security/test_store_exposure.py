"""What ddpviz puts on torchrun's store and in hang stacks is said where users look (issue #37,
D1 and D3): `ddpviz record --help` says the store listens on all interfaces and now carries
every rank's stack and the replica check's control keys, and how to keep source text out;
docs/security.md says where stacks travel and the switch that keeps their source text out."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ddpviz.cli import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def record_help() -> str:
    parser = build_parser()
    commands = next(a for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    return " ".join(commands["record"].format_help().split())  # argparse's wrapping undone


def test_record_help_says_what_torchruns_store_carries() -> None:
    text = record_help()
    for said in ("listens on all interfaces, unauthenticated", "every rank's stack",
                 "source lines and absolute paths", "--recording stack_source=false",
                 "replica check's digests and control keys", "--recording replicas=never",
                 "firewall that port", "docs/security.md"):
        assert said in text, said


def test_security_docs_say_where_stacks_go_and_how_to_keep_source_out() -> None:
    text = " ".join(DOCS.read_text().split())
    assert re.search(r"## What stacks tell about your code", DOCS.read_text())
    for said in ("Recording(stack_source=False)", "DDPVIZ_RECORDING=stack_source=false",
                 "absolute path", "the HTML report", "`where/<rank>`",
                 "control keys rank 0 sets", "listens on all interfaces",
                 "`--recording stack_source=false`"):
        assert said in text, said
