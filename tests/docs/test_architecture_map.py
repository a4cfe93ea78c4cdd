"""docs/architecture.md's map (its Layout block) names every module of the package in the
folder that holds it, and nothing that is not there: a newcomer finds each room from it.

The block is read as a tree by indentation: a line `  name/` opens a folder, the lines indented
deeper belong to it; every `name.py` on a line belongs to the innermost open folder.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ddpviz"


def _layout() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Layout"):]
    block = section.split("```", 2)[1]
    return block.splitlines()[1:]  # the line after ``` (its info string) onwards


def mapped_modules() -> set[str]:
    """Paths like 'ddpviz/engine/ddp.py' as the map places them."""
    out: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in _layout():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        first = line.split()[0]
        folder = "/".join(f for _, f in stack)
        if first.endswith("/"):
            stack.append((indent, first.rstrip("/")))
            continue
        # module names on the line before its description; a description may name files of
        # other folders, so only names before the first word that is not a module count
        for token in re.split(r"[\s,]+", line.strip()):
            if not token.endswith(".py"):
                break
            out.add(f"{folder}/{token}" if folder else token)
    return out


def package_modules() -> set[str]:
    files = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")
             if "labextension" not in p.parts and p.name not in {"__init__.py", "__main__.py"}}
    return files | {"ddpviz_autowatch.py", "ddpviz/__init__.py"}  # the package's own face


def test_the_map_lists_every_module_where_it_lives() -> None:
    missing = sorted(package_modules() - mapped_modules())
    assert not missing, "docs/architecture.md's Layout does not list: " + ", ".join(missing)


def test_the_map_lists_no_module_that_is_not_there() -> None:
    stale = sorted(mapped_modules() - package_modules())
    assert not stale, "docs/architecture.md's Layout lists modules that do not exist: " + \
        ", ".join(stale)


def test_the_reader_sees_folders_and_lines_of_several_modules() -> None:
    mapped = mapped_modules()
    assert "ddpviz/engine/ddp.py" in mapped and "ddpviz/events.py" in mapped
    assert len(mapped) > 100
