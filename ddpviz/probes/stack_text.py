"""A Python stack as text for people: the user's frames with their source lines, ddpviz's,
torch's and the standard library's plumbing folded into one line per run, bounded. One
formatter for every stack ddpviz shows: the pulse thread's (where.py: a rank's training thread
read from another thread, for hang findings) and the launcher's (launcher/stacks.py: a rank's
faulthandler dump, when `launch()` stops a hung rank). Imports neither torch nor anything of
ddpviz (the launcher's notebook side uses it without torch): torch's folder is found, not
imported.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import re
from types import CodeType, FrameType
from typing import NamedTuple

MAX_SHOWN = 16  # lines of a formatted stack
MAX_LINE = 200  # characters of one line


def _torch_dir() -> str:
    spec = importlib.util.find_spec("torch")  # a top-level package: found, not imported
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.join(places[0], "") if places else os.sep + "\0"  # no torch: nothing is


_TORCH = _torch_dir()
_DDPVIZ = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.dirname(os.__file__) + os.sep

# decorators' and dispatchers' frames, which say nothing about where a thread is
GENERIC = frozenset({"wrapper", "inner", "_fn", "decorate_context", "_wrapped_call_impl",
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


# Whether a code object is plumbing (`owner` of its file is not None), decided once per code
# object: keyed by id (a code object's own hash reads its bytecode), the object kept so its id
# stays its own; bounded (past it, decided again each time).
_PLUMBING: dict[int, tuple[CodeType, bool]] = {}
MAX_CODES = 65536
USER_FRAME_DEPTH = 64  # frames walked outward for the user's, by default


def user_frame(frame: FrameType | None, depth: int = USER_FRAME_DEPTH) -> FrameType | None:
    """The first frame from `frame` outward that is the user's (not torch's, ddpviz's or the
    standard library's; a framework's counts as the user's: `owner`), None past `depth`
    frames. The one rule of every "where in the job's code" ddpviz says: the debugger's
    loop names, the sync contract's call sites, the ledger's collective call sites."""
    plumbing_of = _PLUMBING
    for _ in range(depth):
        if frame is None:
            return None
        code = frame.f_code
        hit = plumbing_of.get(id(code))
        if hit is not None and hit[0] is code:
            plumbing = hit[1]
        else:
            plumbing = owner(code.co_filename) is not None
            if len(plumbing_of) < MAX_CODES:
                plumbing_of[id(code)] = (code, plumbing)
        if not plumbing:
            return frame
        frame = frame.f_back
    return None


# the ledger of the job's collectives wraps torch.distributed's functions (collectives.py):
# its frame stands for the call it wraps, so a folded stack does not show it
_LEDGER = os.path.join(_DDPVIZ, "probes", "collectives.py")


def _ledger(f: Frame) -> bool:
    """A frame of the ledger's wrapper around a collective: never what the user's call is
    inside, nor worth a line of its own."""
    return f.file == _LEDGER


_DUMP_THREAD = re.compile(r"^(?:Current thread|Thread) 0x(?P<id>[0-9a-fA-F]+)")
_DUMP_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


def faulthandler_threads(text: str) -> list[tuple[int, list[Frame]]]:
    """faulthandler's dump of all threads -> (thread id, its frames innermost first) for each
    thread, in the dump's order. The thread id is `threading.get_ident()` of that thread;
    frames without a line number ("line ???") are left out."""
    threads: list[tuple[int, list[Frame]]] = []
    for line in text.splitlines():
        head = _DUMP_THREAD.match(line)
        if head:
            threads.append((int(head["id"], 16), []))
            continue
        frame = _DUMP_FRAME.match(line)
        if frame and threads:
            threads[-1][1].append(Frame(frame["file"], int(frame["line"]), frame["func"]))
    return threads


def clip(text: str, limit: int = MAX_LINE) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def where(f: Frame) -> str:
    """'train.py:57 in load_batch' (a path under the current folder relative to it)."""
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
    shown = " <- ".join(where(f) for f in user[:3]) + (" <- ..." if len(user) > 3 else "")
    inner = owner(stack[0].file)
    inside = ""
    if inner is not None:
        # the outermost plumbing frame called from the innermost user frame says what it is
        first = next((i for i, f in enumerate(stack) if owner(f.file) is None), len(stack))
        plumbing = [f for f in reversed(stack[:first]) if not _ledger(f)] or [stack[first - 1]]
        named = [f for f in plumbing if f.func not in GENERIC]
        entry = named[0] if named else plumbing[0]
        inside = f"inside {owner(entry.file)}: {entry.func}"
    if not shown:
        return clip(inside or where(stack[0]))
    if not inside:
        return clip(shown)
    inside = clip(inside, MAX_LINE // 2)  # kept whole: where it waits matters most
    return f"{clip(shown, MAX_LINE - len(inside) - 2)}; {inside}"


def stack_lines(stack: list[Frame], *, source: bool = True) -> list[str]:
    """Traceback-like lines of a stack given innermost first, most recent call last: the
    user's frames with their source line (without it when `source` is False: the line may
    hold a secret, and the stack travels; `Recording.stack_source`), each run of plumbing
    folded into one line; at most MAX_SHOWN lines."""
    lines: list[str] = []
    run: list[Frame] = []

    def fold() -> None:
        run[:] = [f for f in run if not _ledger(f)]
        if run:
            owners = sorted({str(owner(f.file)) for f in run})
            inner = run[-1]
            lines.append(clip(f"... {len(run)} frame{'s' if len(run) > 1 else ''} in "
                              f"{', '.join(owners)} (innermost: {inner.func})"))
            run.clear()

    for f in reversed(stack):
        if owner(f.file) is not None:
            run.append(f)
            continue
        fold()
        text = linecache.getline(f.file, f.line).strip() if source else ""
        lines.append(clip(f"{where(f)}: {text}" if text else where(f)))
    fold()
    if len(lines) > MAX_SHOWN:
        keep = MAX_SHOWN - 3
        lines = [*lines[:2], f"... {len(lines) - 2 - keep} more lines", *lines[-keep:]]
    return lines
