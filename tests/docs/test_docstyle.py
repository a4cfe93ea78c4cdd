"""The docstring check of the docs build (docs/_ext/docstyle.py), without a build: the rule
catches what it should, and every function, method and property the API reference documents
passes it, so a docstring off the house style fails here as well as in `make docs`."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "reference" / "api.md"

pytest.importorskip("sphinx", reason="the docs extra (pip install -e '.[docs]') is not installed")
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
docstyle = importlib.import_module("docstyle")
sys.path.remove(str(ROOT / "docs" / "_ext"))


def resolve(dotted: str) -> Any:
    """The object a `.. autoclass:: a.b.C` directive names."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def documented() -> Iterator[tuple[str, str, Any]]:
    """(name, autodoc's kind, object) of everything the API page documents, as autodoc reads
    it: the functions, and the public methods and properties a class of `:members:` defines
    itself (not inherited, but for the classes up to the base that `:inherited-members: Base`
    names; docstrings inherited as autodoc inherits them)."""
    text = API.read_text(encoding="utf-8")
    for directive, target, members, inherited in re.findall(
            r"^\.\. (auto\w+):: ([\w.]+)\s*\n((?:   :members:\n)?)"
            r"(?:   :inherited-members: (.*)\n)?", text, re.M):
        obj = resolve(target)
        if directive == "autofunction":
            yield target, "function", obj
        elif members:
            stop = {base.strip() for base in inherited.split(",")}
            owners = []
            for owner in obj.__mro__ if inherited else (obj,):
                if owner.__name__ in stop:
                    break
                owners.append(owner)
            # (a name defined again below is documented once, as the nearest definition)
            defined = {name: raw for owner in reversed(owners) for name, raw in
                       vars(owner).items()}
            for name, raw in defined.items():
                if name.startswith("_"):
                    continue
                if isinstance(raw, property):
                    yield f"{target}.{name}", "property", raw
                elif isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw):
                    yield f"{target}.{name}", "method", getattr(obj, name)


def test_a_missing_parameter_a_missing_returns_and_a_type_colon_are_caught() -> None:
    def f(a: int, b: int, *rest: int, **kw: int) -> int:
        """Sum.

        Args:
            a: the first.
        """
        return a + b

    def g(self: object, a: int) -> int:
        """Twice.

        Args:
            a: the number.

        Returns:
            A number: twice `a`.
        """
        return 2 * a

    problems = docstyle.problems("function", f)
    assert len(problems) == 2
    assert "does not describe b " in problems[0]  # not a, not *rest or **kw
    assert "no Returns section" in problems[1]
    assert len(docstyle.problems("method", g)) == 1
    assert "'A number: twice `a`.', has a colon" in docstyle.problems("method", g)[0]

    class C:
        @property
        def p(self) -> int:
            """Bytes: what it holds."""
            return 0

    assert "has a colon" in docstyle.problems("property", C.__dict__["p"])[0]


def test_the_house_style_passes() -> None:
    def f(a: int, b: int, *rest: int) -> int:
        """Sum.

        Args:
            a, b: the numbers (``x: y`` in code is fine).

        Returns:
            Their sum, see `Trace <ddpviz.Trace>`.
        """
        return a + b

    def g(self: object, flag: bool) -> None:
        """Set it (returns None: no Returns needed).

        Args:
            flag: on or off.
        """

    class C:
        @property
        def p(self) -> int:
            """The bytes it holds, as `x.nbytes` gives them."""
            return 0

    assert docstyle.problems("function", f) == []
    assert docstyle.problems("method", g) == []
    assert docstyle.problems("property", C.__dict__["p"]) == []
    assert docstyle.is_undocumented_member(C.__dict__["p"]) is False


def test_every_documented_function_method_and_property_follows_the_house_style() -> None:
    seen = {"function": 0, "method": 0, "property": 0}
    off = []
    for name, what, obj in documented():
        seen[what] += 1
        if what != "function" and docstyle.is_undocumented_member(obj):
            off.append(f"{name}: no docstring (the API reference leaves it out)")
        off += [f"{name}: {p}" for p in docstyle.problems(what, obj)]
    assert seen["function"] >= 10 and seen["method"] >= 60 and seen["property"] >= 20, seen
    assert off == [], "\n".join(off)


def test_a_public_member_without_a_docstring_is_found() -> None:
    class C:
        limit = 3  # an attribute: autodoc documents it from a #: comment, not a docstring

        @property
        def p(self) -> int:
            return 0

        def m(self) -> None:
            pass

        @staticmethod
        def s() -> None:
            pass

    assert [name for name, obj in vars(C).items() if not name.startswith("_")
            and docstyle.is_undocumented_member(obj)] == ["p", "m", "s"]
    assert docstyle.qualified_name(C.__dict__["p"], "p").endswith(".C.p")


@pytest.mark.parametrize("what", ["class", "exception", "attribute"])
def test_kinds_that_are_not_checked(what: str) -> None:
    assert docstyle.problems(what, object) == []
