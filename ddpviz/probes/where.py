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
rank that owns it (its source lines are there), bounded (MAX_FRAMES read; MAX_SHOWN lines,
MAX_LINE characters a line), with the user's frames shown and ddpviz's, torch's and the
standard library's runs folded into one line each ("... 7 frames in torch/distributed"), by
stack_text.py, which formats the launcher's stacks too.

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
import os
import sys
import textwrap
from types import CodeType, FrameType
from typing import NamedTuple

from ddpviz.probes.stack_text import GENERIC, Frame, owner, where

MAX_FRAMES = 64  # innermost frames read from a stack
_CHAIN = 48  # user frames noted at a forward (a framework puts ~20 between loop and DDP)

_JOIN = os.path.join("torch", "distributed", "algorithms", "join.py")
_DIST = os.path.join("torch", "distributed") + os.sep


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


def blocked_in(stack: list[Frame]) -> str:
    """The torch.distributed function the thread is blocked in ("barrier"), or ""."""
    for f in stack:
        if owner(f.file) is None:
            return ""
        if _DIST in f.file and f.func not in GENERIC:
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
        return f"the loop at {where(f)} (lines {self.start}-{self.end})"


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
