"""The parser sphinx-argparse documents (reference/cli.md): ddpviz.cli.build_parser() with its
help texts made safe for reStructuredText, which sphinx-argparse parses them as (a `*.ddpviz`
in a help text would open an emphasis). `ddpviz --help` itself is unchanged."""

from __future__ import annotations

import argparse

from ddpviz.cli import build_parser


def _escape(text: str | None) -> str | None:
    return None if text is None else text.replace("\\", "\\\\").replace("*", "\\*").replace(
        "`", "\\`").replace("|", "\\|")


def _walk(parser: argparse.ArgumentParser) -> None:
    parser.description = _escape(parser.description)
    parser.epilog = _escape(parser.epilog)
    for action in parser._actions:
        if action.help not in (None, argparse.SUPPRESS):
            action.help = _escape(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = _escape(choice.help)
            for sub in action.choices.values():
                _walk(sub)


def parser() -> argparse.ArgumentParser:
    """ddpviz's argument parser, help texts escaped for reStructuredText."""
    p = build_parser()
    _walk(p)
    return p
