"""The TypeScript event vocabulary (extension/src/events.ts) and the trace reader's constants
(extension/src/trace.ts) stay in step with Python's: every event and nested struct of
`ddpviz.events` has a TypeScript interface with the same fields, in the same order, of the
mirrored types (from `msgspec.json.schema`), and the runtime table the browser validates
decoded events with lists the same fields and kinds. A planted drift is caught."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddpviz import events as ev
from ddpviz.traces import fileformat as tracefile

SRC = Path(__file__).resolve().parents[2] / "extension" / "src"
EVENTS_TS = SRC / "events.ts"
TRACE_TS = SRC / "trace.ts"

Field = tuple[str, bool, str]  # (name, optional, TypeScript type)
KINDS = {"integer": "int", "number": "float", "string": "str", "boolean": "bool",
         "array": "array"}


def python_events() -> list[type[ev.Event]]:
    return list(typing.get_args(ev.ANY_EVENT))


def schema() -> dict[str, Any]:
    out: dict[str, Any] = msgspec.json.schema(ev.ANY_EVENT)
    return out


def ts_type(node: dict[str, Any]) -> str:
    """The TypeScript type mirroring a msgspec JSON-schema node."""
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[1]
    if "enum" in node:
        return " | ".join(f"'{v}'" for v in node["enum"])
    if "anyOf" in node:
        return " | ".join(ts_type(n) for n in node["anyOf"])
    kind = node.get("type")
    if kind in ("integer", "number"):
        return "number"
    if kind in ("string", "boolean", "null"):
        return str(kind)
    if kind == "array" and "prefixItems" in node:
        return "[" + ", ".join(ts_type(n) for n in node["prefixItems"]) + "]"
    if kind == "array":
        inner = ts_type(node["items"])
        return f"({inner})[]" if " | " in inner else f"{inner}[]"
    raise ValueError(f"no TypeScript mirror for the schema node {node}")


def kind_of(node: dict[str, Any]) -> str:
    """The FieldKind the browser checks a field with."""
    return "struct" if "$ref" in node else KINDS[node["type"]]


def expected_interfaces() -> dict[str, list[Field]]:
    """{struct name: fields} for every event and nested struct, from Python."""
    out: dict[str, list[Field]] = {}
    for name, node in schema()["$defs"].items():
        required = set(node.get("required", ()))
        out[name] = [(field, field not in required, ts_type(sub))
                     for field, sub in node["properties"].items()]
    return out


def expected_event_fields() -> dict[str, dict[str, str]]:
    """{event: {own field: kind}} (without the base fields), from Python."""
    defs = schema()["$defs"]
    base = {f.name for f in msgspec.structs.fields(ev.Event)} | {"type"}
    return {cls.__name__: {name: kind_of(node)
                           for name, node in defs[cls.__name__]["properties"].items()
                           if name not in base}
            for cls in python_events()}


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def ts_interfaces(text: str) -> dict[str, list[Field]]:
    """{interface: fields} from TypeScript source, `extends` resolved (own fields override
    the base's in place: `type` stays first), a field typed with an exported union alias
    (`export type FindingKind = 'a' | 'b';`) read as the union."""
    text = strip_comments(text)
    aliases = {m.group(1): " | ".join(t.strip() for t in m.group(2).split("|") if t.strip())
               for m in re.finditer(r"export type (\w+) =(.*?);", text, re.S)}
    raw: dict[str, tuple[str | None, list[Field]]] = {}
    for m in re.finditer(r"export interface (\w+)(?: extends (\w+))? \{(.*?)\n\}", text, re.S):
        fields = [(name, opt == "?", aliases.get(typ.strip(), typ.strip())) for name, opt, typ in
                  re.findall(r"^\s*(\w+)(\??):\s*([^;]+);\s*$", m.group(3), re.M)]
        raw[m.group(1)] = (m.group(2), fields)
    out: dict[str, list[Field]] = {}
    for name, (base, fields) in raw.items():
        if base is None:
            out[name] = fields
            continue
        own = {f[0]: f for f in fields}
        inherited = [own.pop(f[0], f) for f in raw[base][1]]
        out[name] = inherited + [f for f in fields if f[0] in own]
    return out


def ts_union(text: str, name: str) -> list[str]:
    m = re.search(rf"export type {name} =(.*?);", strip_comments(text), re.S)
    assert m is not None, f"no type {name} in events.ts"
    return [t.strip() for t in m.group(1).split("|") if t.strip()]


def ts_table(text: str, name: str) -> dict[str, dict[str, str]]:
    """An object literal of object literals of string values, e.g. EVENT_FIELDS."""
    m = re.search(rf"export const {name}\b[^=]*= \{{(.*?)\n\}}", strip_comments(text), re.S)
    assert m is not None, f"no const {name} in the TypeScript source"
    return {key: dict(re.findall(r"(\w+): '(\w+)'", body))
            for key, body in re.findall(r"(\w+): \{([^}]*)\}", m.group(1))}


def ts_flat_table(text: str, name: str) -> dict[str, str]:
    m = re.search(rf"export const {name}\b[^=]*= \{{(.*?)\}}", strip_comments(text), re.S)
    assert m is not None, f"no const {name} in the TypeScript source"
    return dict(re.findall(r"(\w+): '?(\w+)'?", m.group(1)))


def ts_number(text: str, name: str) -> int:
    m = re.search(rf"export const {name} = (\d+);", text)
    assert m is not None, f"no const {name} in the TypeScript source"
    return int(m.group(1))


def drift(text: str) -> list[str]:
    """Every difference between events.ts and Python's vocabulary (empty: in step)."""
    problems: list[str] = []
    found = ts_interfaces(text)
    for name, fields in expected_interfaces().items():
        if name not in found:
            problems.append(f"interface {name} is missing")
        elif found[name] != fields:
            problems.append(f"interface {name}: TypeScript {found[name]} != Python {fields}")
    names = [c.__name__ for c in python_events()]
    if ts_union(text, "DDPEvent") != names:
        problems.append(f"DDPEvent union {ts_union(text, 'DDPEvent')} != {names}")
    table = ts_table(text, "EVENT_FIELDS")
    if list(table) != names:
        problems.append(f"EVENT_FIELDS lists {list(table)}, Python {names}")
    for name, fields in expected_event_fields().items():
        if table.get(name) != fields or list(table.get(name, {})) != list(fields):
            problems.append(f"EVENT_FIELDS.{name} = {table.get(name)} != Python {fields}")
    base = {f.name: kind_of(schema()["$defs"]["GradReady"]["properties"][f.name])
            for f in msgspec.structs.fields(ev.Event)}
    if ts_flat_table(text, "BASE_FIELDS") != base:
        problems.append(f"BASE_FIELDS {ts_flat_table(text, 'BASE_FIELDS')} != {base}")
    if ts_number(text, "SCHEMA_VERSION") != ev.SCHEMA_VERSION:
        problems.append("SCHEMA_VERSION differs")
    return problems


def test_typescript_vocabulary_matches_python() -> None:
    assert drift(EVENTS_TS.read_text()) == []


def test_every_event_and_struct_is_mirrored() -> None:
    found = ts_interfaces(EVENTS_TS.read_text())
    assert {c.__name__ for c in python_events()} | {"ParamInfo", "Mismatch"} <= set(found)
    # spot check of the mapping itself, on the most nested field there is
    assert ("values", False, "[string, number[]][]") in found["Mismatch"]
    assert ("buckets", False, "number[][]") in found["BucketAssigned"]


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t: t.replace("  param: number;\n  bucket: number;\n", "  bucket: number;\n"),
     "interface GradReady"),  # a field removed
    (lambda t: t.replace("  nbytes: number;\n  dtype: string;\n", "  nbytes: string;\n"
                         "  dtype: string;\n"), "interface AllReduceLaunched"),  # a type
    (lambda t: t.replace("  digest: string;\n", "  digest?: string;\n"),
     "interface VerificationPassed"),  # optionality
    (lambda t: t.replace("  src: number;\n  n_tensors: number;\n",
                         "  n_tensors: number;\n  src: number;\n"),
     "interface BroadcastStarted"),  # order
    (lambda t: t.replace("  | EventsDropped\n", ""), "DDPEvent union"),  # an event dropped
    (lambda t: t.replace("GradReady: { param: 'int', bucket: 'int' }",
                         "GradReady: { param: 'int', bucket: 'float' }"),
     "EVENT_FIELDS.GradReady"),  # a runtime kind
    (lambda t: t.replace("  | 'rank_hang'\n", ""), "interface Finding"),  # a finding kind
    (lambda t: t.replace("  element_size?: number;\n", ""), "interface ParamInfo"),
    (lambda t: t.replace("export const SCHEMA_VERSION = 1;",
                         "export const SCHEMA_VERSION = 2;"), "SCHEMA_VERSION"),
])
def test_a_planted_drift_is_reported(edit: Any, needle: str) -> None:
    text = EVENTS_TS.read_text()
    edited = edit(text)
    assert edited != text  # the edit applies to the current source
    assert any(needle in p for p in drift(edited))


def test_trace_reader_constants_match_tracefile_py() -> None:
    text = TRACE_TS.read_text()
    assert ts_number(text, "FORMAT_VERSION") == tracefile.FORMAT_VERSION
    m = re.search(r"export const MAGIC = \[([^\]]*)\]", text)
    assert m is not None
    assert bytes(int(b, 16) for b in m.group(1).split(",")) == tracefile.MAGIC
    assert ts_flat_table(text, "FRAME_KINDS") == {
        "header": str(tracefile.HEADER), "events": str(tracefile.EVENTS),
        "clock": str(tracefile.CLOCK), "copy": str(tracefile.COPY),
        "columns": str(tracefile.COLUMNS)}
    assert tracefile.FRAME.format == "<BII"  # kind u8, length u32 LE, crc32 u32 LE: as read
