"""Where a rank is, in code: its training thread's Python stack, read by another thread of the
same process, folded and bounded for a finding; and whether that thread has left the loop that
calls the DDP. See [Note: stacks from the pulse thread] and [Note: has it left the loop?].

[Note: stacks from the pulse thread]
A rank that is behind is nearly always blocked: sleeping or reading in its data loading, in a
C++ collective of its own, in a barrier after its loop. Each of these releases the GIL, so the
rank's pulse thread (pulse.py), which wakes every CHECK_S anyway, can read the training
thread's frames with `sys._current_frames()` and post them on the notice board (whereabouts.py)
when a waiting rank asks. A training thread busy in Python lends the GIL every switch interval
(5 ms), so it is read too. Only C code that holds the GIL for long (rare) keeps the pulse thread
from answering; the finding then says the rank did not answer. The stack is formatted on the
rank that owns it (its source lines are there), bounded (MAX_FRAMES read, MAX_SHOWN lines,
MAX_LINE characters a line), with the user's frames shown and ddpviz's, torch's and the
standard library's runs folded into one line each ("... 7 frames in torch/distributed").

[Note: has it left the loop?]
At its first forwards (steps 0-2), and every 64th step after (a new loop is read again), a
rank notes the chain of user frames that called the DDP (code objects and lines, no frame kept
alive). The innermost of them whose call line sits in a `for`/`while` loop of its function
(read with `ast` from the function's source) is the loop named in findings. Later, a quiet
rank's training thread is compared with the whole chain: it has left only when no function of
the chain still runs inside a loop that enclosed its call (a helper looping over micro-batches
returns every step, but its caller's loop goes on; the header of `for x in loader` is the data
loading, inside the loop), nor inside a later loop of one of them (which may call the DDP
again). A rank inside `Join`
(torch's uneven-input context manager) never counts as left. Whether it can still come back
is told by where it is: blocked in a torch.distributed call (a barrier,
destroy_process_group) or exited, it cannot without its peers.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import sys
import textwrap
from types import CodeType, FrameType
from typing import NamedTuple

import torch

MAX_FRAMES = 64  # innermost frames read from a stack
MAX_SHOWN = 16  # lines of a formatted stack
MAX_LINE = 200  # characters of one line
_CHAIN = 48  # user frames noted at a forward (a framework puts ~20 between loop and DDP)

_TORCH = os.path.dirname(torch.__file__) + os.sep
_DDPVIZ = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.dirname(os.__file__) + os.sep
_JOIN = os.path.join("torch", "distributed", "algorithms", "join.py")
_DIST = os.path.join("torch", "distributed") + os.sep


# decorators' and dispatchers' frames, which say nothing about where a thread is
_GENERIC = frozenset({"wrapper", "inner", "_fn", "decorate_context", "_wrapped_call_impl",
                      "_call_impl", "<lambda>"})


class Frame(NamedTuple):
    file: str
    line: int
    func: str


def owner(file: str) -> str | None:
    """Whose plumbing a frame's file is ("torch/distributed", "ddpviz", "stdlib"), or None for
    the user's code (a framework in site-packages counts as the user's: it runs the loop)."""
    if file.startswith(_DDPVIZ):
        return "ddpviz"
    if file.startswith(_TORCH):
        parts = file[len(_TORCH):].split(os.sep)
        return "torch/" + parts[0] if len(parts) > 1 else "torch"
    if file.startswith("<frozen") or (file.startswith(_STDLIB)
                                      and "-packages" + os.sep not in file):
        return "stdlib"
    return None


def thread_frame(thread_id: int) -> FrameType | None:
    """The innermost frame of thread `thread_id` (another thread of this process), or None."""
    return sys._current_frames().get(thread_id)


def frames(frame: FrameType | None, limit: int = MAX_FRAMES) -> list[Frame]:
    """`frame` and its callers, innermost first, at most `limit`."""
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append(Frame(code.co_filename, frame.f_lineno or code.co_firstlineno, code.co_name))
        frame = frame.f_back
    return out


def _clip(text: str, limit: int = MAX_LINE) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _where(f: Frame) -> str:
    path = f.file
    if os.path.isabs(path):
        with_cwd = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
        path = with_cwd
    return f"{path}:{f.line} in {f.func}"


def summary(stack: list[Frame]) -> str:
    """One line, the user's frames innermost first: "train.py:57 in load_batch <- train.py:80
    in main", then where inside the plumbing it waits ("; inside torch/distributed:
    barrier")."""
    if not stack:
        return "no Python frames (the thread is starting or exiting)"
    user = [f for f in stack if owner(f.file) is None]
    shown = " <- ".join(_where(f) for f in user[:3]) + (" <- ..." if len(user) > 3 else "")
    inner = owner(stack[0].file)
    inside = ""
    if inner is not None:
        # the outermost plumbing frame called from the innermost user frame says what it is
        first = next((i for i, f in enumerate(stack) if owner(f.file) is None), len(stack))
        named = [f for f in reversed(stack[:first]) if f.func not in _GENERIC]
        entry = named[0] if named else stack[first - 1]
        inside = f"inside {owner(entry.file)}: {entry.func}"
    if not shown:
        return _clip(inside or _where(stack[0]))
    if not inside:
        return _clip(shown)
    inside = _clip(inside, MAX_LINE // 2)  # kept whole: where it waits matters most
    return f"{_clip(shown, MAX_LINE - len(inside) - 2)}; {inside}"


def stack_lines(stack: list[Frame]) -> list[str]:
    """Traceback-like lines, most recent call last: the user's frames with their source line,
    each run of plumbing folded into one line; at most MAX_SHOWN lines."""
    lines: list[str] = []
    run: list[Frame] = []

    def fold() -> None:
        if run:
            owners = sorted({str(owner(f.file)) for f in run})
            inner = run[-1]
            lines.append(_clip(f"... {len(run)} frame{'s' if len(run) > 1 else ''} in "
                               f"{', '.join(owners)} (innermost: {inner.func})"))
            run.clear()

    for f in reversed(stack):
        if owner(f.file) is not None:
            run.append(f)
            continue
        fold()
        source = linecache.getline(f.file, f.line).strip()
        lines.append(_clip(f"{_where(f)}: {source}" if source else _where(f)))
    fold()
    if len(lines) > MAX_SHOWN:
        keep = MAX_SHOWN - 3
        lines = [*lines[:2], f"... {len(lines) - 2 - keep} more lines", *lines[-keep:]]
    return lines


def blocked_in(stack: list[Frame]) -> str:
    """The torch.distributed function the thread is blocked in ("barrier"), or ""."""
    for f in stack:
        if owner(f.file) is None:
            return ""
        if _DIST in f.file and f.func not in _GENERIC:
            return f.func
    return ""


def in_join(stack: list[Frame]) -> bool:
    return any(f.file.endswith(_JOIN) for f in stack)


# --- the loop --------------------------------------------------------------------------------


class Loop(NamedTuple):
    """The `for`/`while` loop that calls the DDP: its function's code, its lines, and the
    chain of user frames (code, line; innermost first) the DDP was called through."""

    code: CodeType
    start: int
    end: int
    call_line: int
    chain: tuple[tuple[CodeType, int], ...] = ()

    def describe(self) -> str:
        f = Frame(self.code.co_filename, self.start, self.code.co_name)
        return f"the loop at {_where(f)} (lines {self.start}-{self.end})"


def caller_chain(frame: FrameType | None) -> list[tuple[CodeType, int]]:
    """The user's frames above `frame` (innermost first): code and line, nothing kept alive."""
    chain: list[tuple[CodeType, int]] = []
    depth = 0
    while frame is not None and len(chain) < _CHAIN and depth < MAX_FRAMES:
        code = frame.f_code
        if owner(code.co_filename) is None:
            chain.append((code, frame.f_lineno or code.co_firstlineno))
        frame = frame.f_back
        depth += 1
    return chain


_loops: dict[CodeType, list[tuple[int, int]]] = {}


def _loops_of(code: CodeType) -> list[tuple[int, int]]:
    """(first line, last line) of every for/while loop in `code`'s function (not in nested
    functions); [] when its source cannot be read."""
    found = _loops.get(code)
    if found is not None:
        return found
    found = []
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, ValueError):
        tree = None
    if tree is not None and tree.body:
        offset = (first or 1) - 1
        top = tree.body[0]
        body = top.body if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef) else tree.body
        stack: list[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                          | ast.Lambda):
                continue  # another function's loops
            if isinstance(node, ast.For | ast.While | ast.AsyncFor):
                end = node.end_lineno or node.lineno
                found.append((node.lineno + offset, end + offset))
            stack.extend(ast.iter_child_nodes(node))
    if len(_loops) < 1024:
        _loops[code] = found
    return found


def find_loop(chain: list[tuple[CodeType, int]]) -> Loop | None:
    """The innermost loop around a call in `chain` (innermost frame first)."""
    for code, line in chain:
        around = [(a, b) for a, b in _loops_of(code) if a <= line <= b]
        if around:
            start, end = max(around)  # the innermost: it starts last
            return Loop(code, start, end, line, tuple(chain))
    return None


def in_loop(loop: Loop, frame: FrameType | None) -> bool:
    """Is `frame` (or a caller) running a line of `loop`? A walk, nothing built."""
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        if frame.f_code is loop.code:
            return loop.start <= (frame.f_lineno or 0) <= loop.end
        frame = frame.f_back
        depth += 1
    return False


def left_loop(loop: Loop, frame: FrameType | None) -> str:
    """Has the thread whose innermost frame is `frame` left every loop around the DDP's call?
    "returned" (the innermost loop's function is no longer running), "after" (it runs a line
    past that loop), or "" (it has not, or it cannot be told). It has not when any function of
    the call chain still runs inside one of its loops that enclosed the call (a helper that
    loops over micro-batches returned, but its caller's loop goes on), or inside a later loop
    of that function (which may call the DDP again), or inside Join."""
    running: dict[CodeType, int] = {}  # code -> line of its outermost running frame
    depth = 0
    f = frame
    while f is not None and depth < 4 * MAX_FRAMES:
        if f.f_code.co_filename.endswith(_JOIN):
            return ""
        running[f.f_code] = f.f_lineno or 0  # (callers come later: the outermost wins)
        f = f.f_back
        depth += 1
    if frame is None:
        return ""
    for code, call_line in loop.chain or ((loop.code, loop.call_line),):
        line = running.get(code)
        if line is None:
            continue  # returned
        loops = _loops_of(code)
        if any(a <= call_line <= b and a <= line <= b for a, b in loops):
            return ""  # still in a loop around the call
        if any(call_line < a <= line <= b for a, b in loops):
            return ""  # in a later loop of this function
        if line < call_line:
            return ""  # before the call: on its way to it again
    return "after" if loop.code in running else "returned"
