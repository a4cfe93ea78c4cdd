"""Escaping by construction: no module that builds widget HTML/SVG or the static report makes
markup outside `ddpviz.markup`. The rule is checked on the source with `ast`: an f-string,
a `%` or `.format` on a string literal, or a `+` of a literal and a computed value, whose
literal text contains '<', is markup built without the escaping helper."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ddpviz

ROOT = Path(ddpviz.__file__).parent
SOURCES = sorted([*(ROOT / "widgets").rglob("*.py"), *(ROOT / "report").rglob("*.py")])


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _fstring_text(node: ast.JoinedStr) -> str:
    return "".join(v.value for v in node.values
                   if isinstance(v, ast.Constant) and isinstance(v.value, str))


def markup_outside_helper(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: what' for each place in `source` that builds markup without the helper."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        what = None
        if isinstance(node, ast.JoinedStr) and "<" in _fstring_text(node):
            what = "f-string markup"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            if "<" in (_literal(node.left) or ""):
                what = "'%' on a markup literal"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "format" and "<" in (_literal(node.func.value) or "")):
            what = ".format on a markup literal"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = _literal(node.left), _literal(node.right)
            if (left is None) != (right is None) and "<" in (left or right or ""):
                what = "'+' of a markup literal and a computed value"
        if what is not None:
            found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")
    return found


def test_sources_are_found() -> None:
    names = {p.name for p in SOURCES}
    assert {"html.py", "bucket_map.py", "postmortem_view.py", "advice_view.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_markup_outside_the_helper(path: Path) -> None:
    found = markup_outside_helper(path.read_text(encoding="utf-8"), str(path))
    assert not found, ("markup built without ddpviz.markup (use markup.fmt/join/tag):\n"
                       + "\n".join(found))


@pytest.mark.parametrize("snippet", [
    "x = f'<b>{name}</b>'",
    "x = f'{a}' '<br>'",
    "x = '<td>%s</td>' % name",
    "x = '<td>{}</td>'.format(name)",
    "x = '<tr>' + cells",
    "x = cells + '</tr>'",
])
def test_the_check_catches(snippet: str) -> None:
    assert markup_outside_helper(snippet)


@pytest.mark.parametrize("snippet", [
    "x = markup.fmt('<b>{}</b>', name)",
    "x = f'{n} bytes'",
    "x = '<br>' + '<hr>'",
    "x = 'a %s' % name",
])
def test_the_check_allows(snippet: str) -> None:
    assert not markup_outside_helper(snippet)
