"""README.md is the front page: short, the Quick start contract intact (.ci/run runs its test
command), and every link and picture in it leads somewhere in this checkout (the docs build
does not read the README, so nothing else checks its links)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def slug(heading: str) -> str:
    """The anchor GitHub and MyST give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_the_readme_stays_short() -> None:
    assert len(README.splitlines()) <= 200


def test_the_quick_start_commands_are_the_ones_ci_runs() -> None:
    quick = README[README.index("## Quick start"):]
    assert "make demo " in quick and "make test " in quick
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_every_relative_link_of_the_readme_exists() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if not re.match(r"\w+://", link)]
    assert len(local) >= 10
    broken = []
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            broken.append(link)
        elif anchor:
            headings = re.findall(r"(?m)^#+ (.+)$", target.read_text(encoding="utf-8"))
            if anchor not in {slug(h) for h in headings}:
                broken.append(link)
    assert broken == []
