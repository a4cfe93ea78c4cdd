"""Hostile traces: markup payloads in every string field of every event type and in the
metadata. The fields are found by introspecting `ddpviz.events` (msgspec.inspect), so an event
or a string field added later is covered without editing this file."""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec
import msgspec.inspect as mi

from ddpviz import events as ev
from ddpviz.events import Event
from ddpviz.traces.trace import Trace
from tests.widgets.streams import Plant, synthetic_run

# Runs script when it reaches innerHTML unescaped (the img's onerror) or a document (script).
PAYLOAD = ("<script>window.__ddpviz_pwned=1;alert(1)</script>"
           "<img src=x onerror=\"window.__ddpviz_pwned=1;alert(1)\">'\"&")
RAW = ("<script", "<img", "onerror=\"")  # what escaping must never let through


def event_types() -> list[type[Event]]:
    return list(typing.get_args(ev.ANY_EVENT))


def _value(t: mi.Type, path: str) -> Any:
    """A valid value of type `t` whose strings are all payloads (path tags them)."""
    if isinstance(t, mi.StrType):
        return f"{PAYLOAD}{path}"[: t.max_length or None]
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 0)
        return max(lo, 1) if (t.le is None or t.le >= 1) and (t.lt is None or t.lt > 1) else lo
    if isinstance(t, mi.FloatType):
        return 0.5
    if isinstance(t, mi.BoolType):
        return False
    if isinstance(t, mi.TupleType):
        return tuple(_value(x, f"{path}[{i}]") for i, x in enumerate(t.item_types))
    if isinstance(t, mi.VarTupleType | mi.ListType):
        return (_value(t.item_type, f"{path}[0]"),)
    if isinstance(t, mi.StructType):
        return t.cls(**{f.name: _value(f.type, f"{path}.{f.name}") for f in t.fields})
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    raise TypeError(f"no hostile value for {t} at {path}")


def one_of_each(rank: int = 0, step: int = 1) -> list[Event]:
    """One event of every type, every string a payload."""
    out = []
    for i, cls in enumerate(event_types()):
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        fields = {f.name: _value(f.type, f"{cls.__name__}.{f.name}") for f in info.fields}
        fields.update(rank=rank, step=step, seq=10_000 + i, t_ns=10**9 + i)
        out.append(cls(**fields))
    return out


def _poison(value: Any) -> Any:
    """Every string in `value` (structs, tuples) prefixed with the payload."""
    if isinstance(value, str):
        return PAYLOAD + value
    if isinstance(value, tuple):
        return tuple(_poison(v) for v in value)
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.replace(value, **{f: _poison(getattr(value, f))
                                                 for f in value.__struct_fields__})
    return value


def string_fields() -> set[str]:
    """'Event.field' for every event field holding a string anywhere inside it."""
    found: set[str] = set()

    def has_str(t: mi.Type) -> bool:
        if isinstance(t, mi.StrType):
            return True
        if isinstance(t, mi.TupleType):
            return any(has_str(x) for x in t.item_types)
        if isinstance(t, mi.VarTupleType | mi.ListType):
            return has_str(t.item_type)
        if isinstance(t, mi.StructType):
            return any(has_str(f.type) for f in t.fields)
        return False

    for cls in event_types():
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        found |= {f"{cls.__name__}.{f.name}" for f in info.fields if has_str(f.type)}
    return found


META = {"title": PAYLOAD, PAYLOAD: [PAYLOAD, {"nested": PAYLOAD}], "host": PAYLOAD}


def hostile_trace() -> Trace:
    """A realistic 3-rank run (a shape mismatch, unused parameters) with every string
    poisoned, plus one event of every type on each rank, and poisoned metadata."""
    plant = Plant(shape={2: (1, (4, 4))}, unused={1: (0, 2)})
    events = [_poison(e) for e in synthetic_run(world_size=3, n_params=6, steps=3,
                                                 buffers=("running_mean",), plant=plant)]
    for rank in range(3):
        events += one_of_each(rank=rank, step=2)
    return Trace(events, meta=dict(META))


def raw_markup(text: str) -> str | None:
    """The first unescaped payload marker in `text`, or None."""
    low = text.lower()
    return next((m for m in RAW if m in low), None)


def without_own_scripts(page: str) -> str:
    """A report page less the raw-text elements ddpviz itself puts in its interactive view
    (report/interactive.py: the bundle and its stylesheet as built, the run as base64), and
    nothing else: a payload that became a script or style element stays in, for raw_markup
    to find."""
    from ddpviz import markup
    from ddpviz.traces.view_bytes import front_end

    for name, kind, attrs in (("report_view.js", "script", {"type": "module"}),
                              ("trace_view.css", "style", {})):
        text = front_end(name)
        if text:
            page = page.replace(markup.raw_text(kind, text, **attrs), "")
    return re.sub(r"<script type='application/octet-stream' "
                  r"id='ddpviz-view-(trace|diagnosis|advice)'>[A-Za-z0-9+/=]*</script>", "", page)
