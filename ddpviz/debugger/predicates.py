"""`break_when` predicates on a rank: compiled once, evaluated at two points of each step (after
DDP's forward, after the optimizer step) in the training loop's own names under ddpviz's, so
`loss > 10` reads the loop's `loss` as a conditional breakpoint in a debugger does.

The loop's names are those of the first frame outside torch, ddpviz and the standard library
on the training thread (a framework's frame counts as the loop: under Lightning that is
Lightning's). They are read, never written. A name that is not there yet (`loss` before the
first backward) is not an error at one point; a predicate that names nothing either point has
for two whole steps is dropped, saying which name was missing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

from ddpviz.probes.stack_text import user_frame

MISSES = 4  # NameErrors in a row (two steps' two points) before a predicate is dropped
_DEPTH = 64  # frames walked outward for the loop's


def loop_frame(frame: FrameType | None) -> FrameType | None:
    """The first frame from `frame` outward that is the job's own (not torch's, ddpviz's or
    the standard library's); None past _DEPTH frames."""
    return user_frame(frame, _DEPTH)


def loop_names() -> dict[str, Any]:
    """A copy of the training loop's local names: this thread's loop frame, else the main
    thread's (CUDA runs backward hooks on the autograd engine's threads, while the loop waits
    in backward() on the main thread); {} when neither has one."""
    frame = loop_frame(sys._getframe(1))
    if frame is None:
        main = sys._current_frames().get(threading.main_thread().ident or -1)
        frame = loop_frame(main)
    return dict(frame.f_locals) if frame is not None else {}


class Predicate:
    def __init__(self, text: str) -> None:
        self.text = text
        self.code = compile(text, "<predicate>", "eval")  # SyntaxError: the caller refuses it
        self.misses = 0


class Predicates:
    """The predicates of the break set in force on this rank."""

    def __init__(self, texts: tuple[str, ...] = ()) -> None:
        self.items = [Predicate(t) for t in texts]

    def __bool__(self) -> bool:
        return bool(self.items)

    def check(self, names: Mapping[str, Any]) -> tuple[str | None, list[str]]:
        """Evaluate each predicate on `names`: (the text of the first that is true or None,
        the reasons of those dropped now: one that raised, or named a missing name too long)."""
        dropped: list[str] = []
        hit = None
        for p in list(self.items):
            try:
                true = bool(eval(p.code, dict(names)))  # the notebook's own predicate
            except NameError as exc:
                p.misses += 1
                if p.misses >= MISSES:
                    self.items.remove(p)
                    dropped.append(f"the predicate {p.text!r}: {exc}, neither in the training "
                                   f"loop's names nor in ddpviz's, after the forward or the "
                                   f"optimizer step of two steps; it is dropped on this rank")
                continue
            except Exception as exc:
                self.items.remove(p)
                dropped.append(f"the predicate {p.text!r} raised {type(exc).__name__}: {exc}; "
                               f"it is dropped on this rank")
                continue
            p.misses = 0
            if true:
                hit = p.text
                break
        return hit, dropped

