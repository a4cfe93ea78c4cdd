"""The one way ddpviz builds HTML and SVG: templates whose every value is escaped.

Trace files are untrusted, and ipywidgets' HTML widget sets innerHTML: a parameter name, dtype
or finding text must never become markup. `fmt(template, *values)` formats like `str.format`
but escapes each formatted value (text and attribute values alike; templates quote attributes),
unless the value is already `Markup` (built by this module). `join` and `tag` do the same.

    fmt("<td title='{}'>{:,}</td>", name, nbytes)   # name escaped, number formatted
    join(fmt("<tr>{}</tr>", r) for r in rows)       # Markup stays markup
"""

from __future__ import annotations

import html
from collections.abc import Iterable


class Markup(str):
    """A string of markup built by this module (its values escaped): embedded as is."""

    __slots__ = ()


def escape(value: object) -> Markup:
    """`value` as text: Markup passes through, anything else is str()-ed and escaped (also
    quotes, so the result is safe inside a quoted attribute)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


class _Escaped:
    """A value that formats itself escaped (str.format calls __format__ per field, in C)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        value = self.value
        if type(value) is int or type(value) is float:  # digits only: nothing to escape
            return format(value, spec)
        if isinstance(value, Markup):
            return value if not spec else escape(format(str(value), spec))
        return html.escape(format(value, spec), quote=True)


def fmt(template: str, /, *args: object, **kwargs: object) -> Markup:
    """`template.format(*args, **kwargs)` with every value escaped (see module doc). The
    template itself is trusted: pass a literal, never data; fields are plain `{}`/`{:spec}`
    or `{name}` (no attribute or index lookups, which would bypass the escaping)."""
    return Markup(template.format(*[a if type(a) is int or type(a) is float else _Escaped(a)
                                    for a in args],  # numbers format to digits: kept as is
                                  **{k: _Escaped(v) for k, v in kwargs.items()}))


def join(parts: Iterable[object], sep: str = "") -> Markup:
    """The parts joined by `sep` (a literal); parts that are not Markup are escaped."""
    return Markup(escape(sep).join(escape(p) for p in parts))


def tag(name: str, content: object = "", /, **attrs: object) -> Markup:
    """`<name attr='value'...>content</name>`: attribute values and non-Markup content
    escaped; `class_` for `class`; None or False attributes left out."""
    out = [name]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        out.append(fmt("{}='{}'", key.rstrip("_").replace("_", "-"), value))
    return fmt("<{}>{}</{}>", Markup(" ".join(out)), content, Markup(name))


def raw_text(name: str, text: str, /, **attrs: object) -> Markup:
    """`<name attr='value'...>text</name>` for a raw-text element (`script`, `style`): its
    content is not HTML (no entity is decoded there), so it cannot be escaped; `text` that
    could end the element early (`</script`) or start an escaped-comment state (`<!--`) is
    refused instead. Attribute values escaped as `tag`'s. Only for text ddpviz made (its
    built front end, base64): never trace data."""
    if name not in ("script", "style"):
        raise ValueError(f"ddpviz: raw_text makes script or style elements, not {name!r}")
    lowered = text.lower()
    for bad in (f"</{name}", "<!--"):
        if bad in lowered:
            raise ValueError(f"ddpviz: the text of a {name} element holds {bad!r}, which "
                             "would end it early; it cannot be embedded")
    return tag(name, Markup(text), **attrs)
