"""Code run on a parked rank (`RunCode`), and every thread's stack (`Stacks`): on the training
thread, inside the park, bounded replies."""

from __future__ import annotations

import ast
import contextlib
import io
import sys
import threading
import traceback
from typing import Any

from ddpviz.limits import MAX_TEXT


def _tail(text: str) -> str:
    return text if len(text) <= MAX_TEXT else "..." + text[-(MAX_TEXT - 3):]


def run(code: str, namespace: dict[str, Any]) -> tuple[str, str, str]:
    """Run `code` in `namespace`: (what it printed, repr of its last expression's value or "",
    the error it raised or ""), each cut to MAX_TEXT characters (the end kept)."""
    out = io.StringIO()
    result, error = "", ""
    try:
        tree = ast.parse(code, "<ddpviz debugger>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        assert last is None or isinstance(last, ast.Expr)
        with contextlib.redirect_stdout(out):
            exec(compile(tree, "<ddpviz debugger>", "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<ddpviz debugger>", "eval"),
                             namespace)
                if value is not None:
                    result = repr(value)
    except Exception as exc:  # the user's code: its error is the reply
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return _tail(out.getvalue()), _tail(result), _tail(error)


def stacks() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(thread names, their stacks as text) of every thread of this process."""
    names = {t.ident: t.name for t in threading.enumerate()}
    threads, texts = [], []
    for ident, frame in sys._current_frames().items():
        threads.append(names.get(ident, f"thread {ident}")[:200])
        texts.append(_tail("".join(traceback.format_stack(frame))))
    return tuple(threads), tuple(texts)
