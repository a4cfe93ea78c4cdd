"""The docs build's docstring check (a Sphinx extension; docs/conf.py loads it).

Docstrings of public functions and methods follow one style (Google: Args/Returns/Raises), and
the build checks it on everything the API reference documents: a function or method whose Args
section leaves out a parameter, or that returns something without a Returns (or, for a
generator, Yields) section, is a warning, and `make docs` turns warnings into errors. A method's
self/cls is no parameter to describe, nor are *args/**kwargs; a property reads as an attribute
and needs neither section. The first line of a Returns/Yields section, and of a property's
docstring, has no colon: napoleon would take the text before it for a type. Private and dunder
members are not documented (autodoc's default), so they are exempt; a public method or property
of a documented class without any docstring would silently drop out of the reference: that is a
warning too.

`problems()` is the rule itself, without Sphinx (tests/docs/test_docstyle.py runs it).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

_ARGS = re.compile(r"^Args:\n((?:[ ]{4}.*\n?|\n)*)", re.M)
_ENTRY = re.compile(r"^    ([\w*, ]+?)(?: \([^)]*\))?:", re.M)
_NO_VALUE = (inspect.Signature.empty, None, "None")
_RESULT = re.compile(r"^(Returns|Yields):\n[ ]{4}(.*)$", re.M)

# How many objects of each kind the check read in this build (shown at the end of a build
# without -q).
CHECKED: dict[str, int] = {"function": 0, "method": 0, "property": 0}


def documented_args(doc: str) -> set[str]:
    """The parameter names an `Args:` section describes ("a, b: ..." names both)."""
    args = _ARGS.search(doc)
    names: set[str] = set()
    for entry in _ENTRY.findall(args.group(1) if args else ""):
        names.update(n.strip().lstrip("*") for n in entry.split(","))
    return names


def problems(what: str, obj: Any) -> list[str]:
    """What is off the house style in the docstring of a documented function or method.

    Args:
        what: autodoc's kind of object: "function", "method" or "property" (any other kind
            is not checked).
        obj: the object as autodoc reads it (for a method, the function found on its class).

    Returns:
        One sentence per problem (a parameter missing from Args, no Returns section, a colon
        that napoleon would take for a type); empty when the docstring follows the style or
        the kind is not checked.
    """
    if what == "property":
        first = (inspect.getdoc(obj) or "").partition("\n")[0]
        return [f"the docstring's first line {first!r} has a colon: napoleon reads the text "
                "before it as the property's type; rephrase it"] if _type_colon(first) else []
    if what not in ("function", "method"):
        return []
    doc = inspect.getdoc(obj) or ""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    params = list(sig.parameters.values())
    if what == "method" and params and params[0].name in ("self", "cls"):
        params = params[1:]
    wanted = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    described = documented_args(doc)
    out = []
    missing = [p for p in wanted if p not in described]
    if missing:
        out.append(f"the docstring's Args section does not describe {', '.join(missing)} "
                   "(Google style: 'Args:' then '    name: what it is')")
    if sig.return_annotation not in _NO_VALUE and "Returns:" not in doc and \
            "Yields:" not in doc:
        out.append("the docstring has no Returns section")
    for section in _RESULT.finditer(doc):
        if _type_colon(section.group(2)):
            out.append(f"the first line of its {section.group(1)} section, "
                       f"{section.group(2).strip()!r}, has a colon: napoleon reads the text "
                       "before it as the return type; rephrase it (the type comes from the "
                       "annotation)")
    return out


def _type_colon(line: str) -> bool:
    """Whether napoleon splits `line` at a colon into "type: description" (as it does the
    first line of a Returns/Yields section and of a property's docstring). Colons in
    ``code``, in roles and in `text <target>` links do not count; in `single backticks`
    they do (napoleon splits there too)."""
    from sphinx.ext.napoleon.docstring import _single_colon_regex, _xref_or_code_regex

    pieces = _xref_or_code_regex.split(line)
    return any(i % 2 == 0 and _single_colon_regex.search(piece)
               for i, piece in enumerate(pieces))


def is_undocumented_member(obj: Any) -> bool:
    """A method or property (of a class autodoc documents with :members:) without a
    docstring, own or inherited: autodoc would leave it out of the reference.

    Args:
        obj: a member as autodoc-skip-member passes it.

    Returns:
        True for a function, method, staticmethod, classmethod or property with no docstring.
    """
    member = isinstance(obj, (property, staticmethod, classmethod)) or inspect.isfunction(obj) \
        or inspect.ismethod(obj)
    return member and not inspect.getdoc(obj)


def qualified_name(obj: Any, name: str) -> str:
    """`module.Class.member` of a member, for messages (autodoc passes only `member`)."""
    func = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', name)}"


def _check_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
                     ) -> None:
    from sphinx.util import logging

    if what not in CHECKED:
        return
    CHECKED[what] += 1
    log = logging.getLogger("ddpviz.docstyle")
    for problem in problems(what, obj):
        log.warning("%s: %s", name, problem)


def _check_undocumented(app: Any, what: str, name: str, obj: Any, skip: bool, options: Any
                        ) -> None:
    from sphinx.util import logging

    if what in ("class", "exception") and skip and not name.startswith("_") and \
            is_undocumented_member(obj):
        logging.getLogger("ddpviz.docstyle").warning(
            "%s has no docstring, so the API reference leaves it out: write one (or make it "
            "private)", qualified_name(obj, name))


def _summary(app: Any, exception: BaseException | None) -> None:
    from sphinx.util import logging

    if exception is None:
        logging.getLogger("ddpviz.docstyle").info(
            "docstyle: checked %d functions, %d methods, %d properties",
            CHECKED["function"], CHECKED["method"], CHECKED["property"])


def setup(app: Any) -> dict[str, Any]:
    """Connect the check to autodoc's events (a Sphinx extension's entry point).

    Args:
        app: the Sphinx application.

    Returns:
        The extension's metadata (safe for parallel reading).
    """
    app.connect("autodoc-process-docstring", _check_docstring)
    app.connect("autodoc-skip-member", _check_undocumented)
    app.connect("build-finished", _summary)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
