"""What the browser is sent about a `Debugger`, as data (never markup), and what it may ask.

The TypeScript debugger panel (extension/src/debuggerPanel.ts) draws `DebuggerWire.state()`:
the status line, where the ranks are parked (grouped, with each rank's park time on its own
clock: the front end aligns it with the trace's clock offsets), the break set, the break row's
default step, the parameter names, the last message or error, the last inspect's per-rank
facts (those of `RankValues`' table and notes) and what the last resume/step printed. Every
size is bounded. `handle()` takes the browser's commands (`{"kind": "debugger", "op": ...}`),
checked strictly, and calls the same `Debugger` functions a cell would call; it never runs code
for the browser.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import threading
from collections.abc import Callable
from typing import Any

from ddpviz.debugger import protocol as p
from ddpviz.debugger.client import Debugger
from ddpviz.debugger.rank_values import RankValues
from ddpviz.findings import format_ranks

MAX_NAMES = 10_000  # parameter names sent for the inspect row's list
MAX_NAME = 1024  # characters of one name (the browser's, and each sent)
MAX_OUTPUT = 64 << 10  # characters of the last resume's/step's output kept (its tail)
MAX_MESSAGE = 8192  # characters of the message line
MAX_BREAKS_SENT = 256  # breaks listed
MAX_RANKS_SENT = 1024  # ranks of a stop or an inspect listed one by one
MAX_STEP = 1 << 40
MAX_BUCKET = 1 << 20
OPS = ("pause", "resume", "step_bucket", "step_step", "abort", "break_at", "clear", "inspect")
WHERE = ("bucket", "forward", "after_backward", "optimizer_step")
WHAT: tuple[str, ...] = p.What.__args__  # type: ignore[attr-defined]


class _Tail(io.TextIOBase):
    """A text stream keeping only the last `limit` characters written to it."""

    def __init__(self, limit: int = MAX_OUTPUT) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._parts: list[str] = []
        self._size = 0
        self.dropped = 0  # characters written and no longer kept

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        text = str(s)
        with self._lock:
            self._parts.append(text)
            self._size += len(text)
            if self._size > 2 * self.limit:
                self._trim()
        return len(text)

    def _trim(self) -> None:
        joined = "".join(self._parts)
        keep = joined[-self.limit:]
        self.dropped += len(joined) - len(keep)
        self._parts, self._size = [keep], len(keep)

    def clear(self) -> None:
        with self._lock:
            self._parts, self._size, self.dropped = [], 0, 0

    def text(self) -> str:
        with self._lock:
            if self._size > self.limit:
                self._trim()
            return "".join(self._parts)


def _num(x: float) -> float | None:
    """A float for JSON: None for NaN/Inf (said in the row's text)."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def break_text(b: p.ANY_BREAK) -> str:
    """A break in words, as the Python panel lists it ("step 3 bucket 1", "on kind", ...)."""
    if isinstance(b, p.BreakAt):
        return (f"step {b.step} bucket {b.bucket}" if b.where == "bucket"
                else f"step {b.step} {b.where.replace('_', ' ')}")
    if isinstance(b, p.BreakOn):
        return f"on {b.kind}"
    return f"when {b.predicate}"


def _break_fields(b: p.ANY_BREAK) -> dict[str, Any]:
    if isinstance(b, p.BreakAt):
        return {"kind": "at", "step": b.step, "where": b.where, "bucket": b.bucket,
                "text": break_text(b)}
    if isinstance(b, p.BreakOn):
        return {"kind": "on", "finding": b.kind, "text": break_text(b)}
    return {"kind": "when", "text": _clip(break_text(b), MAX_NAME)}


def values_data(values: RankValues) -> dict[str, Any]:
    """The facts of `RankValues`' table and notes, as data: per rank its shape, dtype, norm,
    max |x|, NaN/+Inf/-Inf counts and positions (bounded as the ranks send them), its
    finiteness map and bitwise group letter; the bitwise groups; the first differing element;
    the table's rows as text (`columns`, `rows`) and the notes (the verdict first)."""
    c = values.comparison
    ranks = []
    for r, s in list(c.summaries.items())[:MAX_RANKS_SENT]:
        ranks.append({
            "rank": r, "shape": list(s.shape), "dtype": s.dtype, "numel": s.numel,
            "norm": _num(s.norm), "max_abs": _num(s.max_abs), "n_nan": s.n_nan,
            "n_posinf": s.n_posinf, "n_neginf": s.n_neginf,
            "nonfinite_at": [list(q) for q in s.nonfinite_at[:16]],
            "finiteness": [_num(f) for f in s.finiteness[:64]],
            "group": values.letters.get(r, ""), "digest": s.digest[:32],
            "head": [_num(v) for v in s.head[:8]]})
    diff = values.difference
    rows = values._rows()
    return {
        "title": _clip(values.title, MAX_MESSAGE), "name": _clip(values.name, MAX_NAME),
        "what": values.what, "bucket": values.bucket, "all_equal": values.all_equal,
        "ranks": ranks,
        "groups": [{"letter": values.letters.get(g.ranks[0], ""),
                    "ranks": list(g.ranks[:MAX_RANKS_SENT])} for g in c.groups[:MAX_RANKS_SENT]],
        "uncompared": list(c.uncompared[:MAX_RANKS_SENT]),
        "difference": None if diff is None else {
            "flat": diff.flat, "position": list(diff.position),
            "values": [[r, repr(v)] for r, v in list(diff.values.items())[:MAX_RANKS_SENT]]},
        "errors": [[r, _clip(why, MAX_NAME)] for r, why in
                   list(values.errors.items())[:MAX_RANKS_SENT]],
        "columns": list(values.columns),
        "rows": [list(row) for row in rows[:MAX_RANKS_SENT]],
        "notes": [_clip(n, MAX_MESSAGE) for n in values._notes()[:MAX_RANKS_SENT]],
    }


def _strict_int(value: object, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


class DebuggerWire:
    """One `Debugger` as the browser sees it: `state()` (a dict; `state_json()` as sent) and
    `handle(content)` for the browser's commands. `on_state(text)` is called with the state
    after every change the Debugger reports (on its thread) and after each command.

    Kernel-side state (for tests): `message`, `error` (whether the message is an error),
    `result` (the last inspect's RankValues), `output` (what the last resume or step printed).
    """

    def __init__(self, debugger: Debugger,
                 on_state: Callable[[str], None] | None = None) -> None:
        self.debugger = debugger
        self.on_state = on_state
        self.message = ""
        self.error = False
        self.result: RankValues | None = None
        self._output = _Tail()
        self._names: list[str] = []
        self._lock = threading.RLock()
        self._closed = False
        self._unsubscribe = debugger.on_change(self.push)

    @property
    def output(self) -> str:
        """What the last resume or step printed (its last MAX_OUTPUT characters)."""
        return self._output.text()

    # --- the state ----------------------------------------------------------------------------

    def _param_names(self) -> list[str]:
        if not self._names:
            self._names = [_clip(n, MAX_NAME) for n in self.debugger.param_names()[:MAX_NAMES]]
        return self._names

    def state(self) -> dict[str, Any]:
        """What the browser draws (see the module's docstring); JSON-able, bounded."""
        dbg = self.debugger
        stop = dbg.stop
        stop_data: dict[str, Any] | None = None
        if stop is not None:
            ranks = list(stop.ranks.values())[:MAX_RANKS_SENT]
            stop_data = {
                "step": stop.step, "point": stop.point, "bucket": stop.bucket,
                "where": stop.where, "agreed": stop.agreed,
                "text": _clip("; ".join(repr(stop).splitlines()[1:]), MAX_MESSAGE),
                "groups": [{"step": g.value[0], "point": g.value[1], "bucket": g.value[2],
                            "ranks": list(g.ranks[:MAX_RANKS_SENT]),
                            "label": format_ranks(g.ranks)} for g in stop.groups[:64]],
                # the rank's own monotonic clock: the front end adds the trace's clock offset
                "ranks": [{"rank": s.rank, "step": s.step, "point": s.point,
                           "bucket": s.bucket, "t_ns": s.t_ns,
                           "reason": _clip(s.reason, MAX_NAME)} for s in ranks],
                "params": [_clip(n, MAX_NAME) for n in stop.params[:64]],
            }
        with self._lock:
            message, error, result = self.message, self.error, self.result
        return {
            "status": _clip(dbg.status(), MAX_MESSAGE),
            "stopped": stop is not None,
            "agreed": stop is not None and stop.agreed,
            "stop": stop_data,
            "breaks": [_break_fields(b) for b in dbg.breaks[:MAX_BREAKS_SENT]],
            "breaks_text": _clip("; ".join(break_text(b) for b in dbg.breaks) or "none",
                                 MAX_MESSAGE),
            # See [Note: claiming a boundary] (debugger/agreement.py): the first step a break set
            # now surely stops
            "next_step": dbg.next_step() + 1,
            "params": self._param_names(),
            "message": message,
            "error": error,
            "result": None if result is None else values_data(result),
            "output": self.output,
        }

    def state_json(self) -> str:
        """The state as the JSON text the browser is sent."""
        return json.dumps(self.state(), allow_nan=False, separators=(",", ":"))

    def push(self) -> None:
        """Send the state now (the Debugger calls it on every park, from its thread)."""
        if self.on_state is not None and not self._closed:
            self.on_state(self.state_json())

    def say(self, text: str, *, error: bool = False) -> None:
        with self._lock:
            self.message = _clip(str(text), MAX_MESSAGE)
            self.error = error and bool(text)

    # --- the browser's commands ---------------------------------------------------------------

    def handle(self, content: object) -> bool:
        """Do one command of the browser (`{"kind": "debugger", "op": ...}`), checked strictly:
        a malformed one is refused in the message line and nothing is called. Returns whether
        a Debugger function ran and succeeded."""
        try:
            action, confirm = self._parse(content)
        except ValueError as exc:
            self.say(str(exc), error=True)
            self.push()
            return False
        ok = self.run(action, going_on=isinstance(content, dict) and content.get("op") in (
            "resume", "step_bucket", "step_step"))
        if ok and confirm:
            self.say(confirm)
        self.push()
        return ok

    def _parse(self, content: object) -> tuple[Callable[[], object], str]:
        if not isinstance(content, dict) or content.get("kind") != "debugger":
            raise ValueError("ddpviz: not a debugger command.")
        op = content.get("op")
        if not isinstance(op, str) or op not in OPS:
            shown = _clip(op, 40) if isinstance(op, str) else type(op).__name__
            raise ValueError(f"ddpviz: the debugger has no command {shown!r}; nothing was done.")
        allowed = {"kind", "op", *{"break_at": ("step", "where", "bucket", "clicked"),
                                   "inspect": ("name", "what", "bucket")}.get(op, ())}
        extra = sorted(str(k)[:40] for k in content if k not in allowed)
        if extra:
            raise ValueError(f"ddpviz: the debugger's {op} takes no {', '.join(extra)}; "
                             "nothing was done.")
        dbg = self.debugger
        if op == "pause":
            return dbg.pause, ""
        if op == "resume":
            return dbg.resume, ""
        if op == "step_bucket":
            return (lambda: dbg.step("bucket", wait=False)), ""
        if op == "step_step":
            return (lambda: dbg.step("step", wait=False)), ""
        if op == "abort":
            return self._abort, ""
        if op == "clear":
            return dbg.clear, ""
        if op == "break_at":
            step = _strict_int(content.get("step"), 0, MAX_STEP)
            where = content.get("where", "bucket")
            if step is None:
                raise ValueError(f"ddpviz: break at which step? A step number 0-{MAX_STEP}; "
                                 "nothing was done.")
            if not isinstance(where, str) or where not in WHERE:
                raise ValueError(f"ddpviz: break where? One of {', '.join(WHERE)}; nothing "
                                 "was done.")
            bucket = None
            if where == "bucket":
                bucket = _strict_int(content.get("bucket"), 0, MAX_BUCKET)
                if bucket is None:
                    raise ValueError(f"ddpviz: break before which bucket? A bucket 0-"
                                     f"{MAX_BUCKET}; nothing was done.")
            confirm = (f"break set before bucket {bucket}'s all-reduce at step {step}"
                       if content.get("clicked") is True and bucket is not None else "")
            return (lambda: dbg.break_at(step, bucket, where=where)), confirm
        # inspect
        what = content.get("what", "grad")
        if not isinstance(what, str) or what not in WHAT:
            raise ValueError(f"ddpviz: inspect what? One of {', '.join(WHAT)}; nothing was done.")
        if what in ("bucket_buffer", "bucket_grads"):
            bucket = _strict_int(content.get("bucket"), 0, MAX_BUCKET)
            if bucket is None:
                raise ValueError(f"ddpviz: inspect which bucket? A bucket 0-{MAX_BUCKET}; "
                                 "nothing was done.")
            return self._inspecting(lambda: dbg.inspect_bucket(bucket, what)), ""
        name = content.get("name")
        if not isinstance(name, str) or len(name) > MAX_NAME:
            raise ValueError(f"ddpviz: inspect which parameter? Its dotted name (at most "
                             f"{MAX_NAME} characters); nothing was done.")
        return self._inspecting(lambda: dbg.inspect(name.strip(), what)), ""

    def _inspecting(self, inspect: Callable[[], RankValues]) -> Callable[[], object]:
        def go() -> None:
            values = inspect()
            with self._lock:
                self.result = values
        return go

    def run(self, action: Callable[[], object], *, going_on: bool = False) -> bool:
        """Call one of the Debugger's functions; its error (as the functions raise them for
        users) goes into the message line. On the kernel's main thread what it prints is kept
        (`output`; resume and step clear it first: a %%ddp pool's parked cell goes on there).
        Returns whether it succeeded."""
        failed: list[BaseException] = []
        main = threading.current_thread() is threading.main_thread()
        if going_on:
            self._output.clear()
        try:
            if main and going_on:
                with contextlib.redirect_stdout(self._output), \
                        contextlib.redirect_stderr(self._output):
                    action()
            else:
                action()
        except (ValueError, RuntimeError, TimeoutError) as exc:  # DebuggerError included
            failed.append(exc)
        if failed:
            self.say(str(failed[0]), error=True)
            return False
        self.say("")
        return True

    def _abort(self) -> None:
        # the ranks take up to 5 s to end: wait for them off the kernel's main thread
        self.debugger.abort(wait=False)
        threading.Thread(target=self._after_abort, daemon=True,
                         name="ddpviz-debugger-abort").start()

    def _after_abort(self) -> None:
        if self.run(self.debugger.abort):
            self.say("aborted: every rank ended (their traces saved)")
        self.push()

    def close(self) -> None:
        """Stop hearing the Debugger (the ranks are left as they are)."""
        self._closed = True
        self._unsubscribe()


def debugger_of(source: object, debugger: Debugger | bool | None) -> Debugger | None:
    """The Debugger a view's panel drives: the one given; True: the source's (`run.debugger`,
    `session.debugger`); None or False: none."""
    if debugger is None or debugger is False:
        return None
    if debugger is True:
        if not hasattr(source, "debugger"):
            raise ValueError(f"ddpviz: Dashboard(debugger=True) needs a live Run or Session, "
                             f"not {type(source).__name__}; recorded runs cannot be paused.")
        return source.debugger
    if not isinstance(debugger, Debugger):
        raise ValueError(f"ddpviz: debugger= takes a Debugger, True or None, got "
                         f"{type(debugger).__name__}.")
    return debugger
