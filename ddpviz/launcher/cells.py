"""The file names of notebook-defined functions, across the trip to a rank: cloudpickle (3.1.3
on) ships a function defined by value with the file name "<dynamic-code>", so the kernel sends
each function's real file (a notebook cell's name) and the rank puts it back, for tracebacks and
stacks that name the cell and show its lines."""

from __future__ import annotations

import types
from typing import Any

_DYNAMIC = "<dynamic-code>"


def _functions(fn: Any) -> list[Any]:
    """`fn` and the functions its globals hold (the notebook functions it may call)."""
    return [fn, *(v for v in getattr(fn, "__globals__", {}).values()
                  if isinstance(v, types.FunctionType))]


def _key(code: types.CodeType) -> str:
    return f"{code.co_name}@{code.co_firstlineno}"


def code_origins(fn: Any) -> dict[str, str]:
    """In the kernel: each function's file, keyed by 'name@first line'."""
    return {_key(code): code.co_filename for f in _functions(fn)
            if isinstance(code := getattr(f, "__code__", None), types.CodeType)}


def restore_origins(fn: Any, origins: dict[str, str]) -> None:
    """On the rank: give the functions cloudpickle renamed their file back."""
    for f in _functions(fn):
        code = getattr(f, "__code__", None)
        if not isinstance(code, types.CodeType) or code.co_filename != _DYNAMIC:
            continue
        origin = origins.get(_key(code))
        if isinstance(origin, str) and origin != _DYNAMIC:
            f.__code__ = _renamed(code, origin)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)
