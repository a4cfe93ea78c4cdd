"""What the live widgets cost: bytes to the browser and kernel time (CPU only, no browser).

1. bytes shipped per Dashboard: every comm message a kernel would send (widget opens with
   their full state, then updates), counted through a recording comm, for a tiny, a medium and
   a large run; and the saved widget state (`ipywidgets.embed.dependency_state`), which is what
   a notebook stores. Budget: 6 MB (one plotly.js bundle is ~5 MB of it).
2. steady live updates: a background thread feeds a Dashboard like a running job (one
   iteration of every rank at a time, at a fixed pace) while its throttle redraws; bytes/s
   after the first second. Budget: 50 KB/s. Also the kernel time the redraws took.
3. replay at scale: 1,000 parameters x 8 ranks x 100 iterations (~800k events): loading
   into the model, building the dashboard, and the cost of one slider move (median).
4. many ranks: HookTimeline, VerificationView and BroadcastProgress built from a replayed
   16/64/256-rank run (100 parameters, 3 iterations; one rank slow, one with another shape
   for the matrix), and one update each (iteration slider, time slider through the broadcast,
   a row picked), medians; at 256 ranks also with one lane/bar per rank forced, side by side.

    python benchmarks/bench_widgets.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ipywidgets as w
from ipywidgets.embed import dependency_state

from ddpviz.events import Event
from ddpviz.model.event_model import EventModel
from ddpviz.traces.trace import Trace
from ddpviz.widgets import BroadcastProgress, Dashboard, HookTimeline, VerificationView
from tests.widgets.streams import Plant, synthetic_run
from tests.widgets.wire import WireCounter

MB = 1 << 20


def realistic_run(ranks: int, params: int, steps: int) -> list[Event]:
    """256x256 layers, DDP's own limits: 25 MiB buckets, 250 MiB broadcast chunks."""
    return synthetic_run(ranks, params, steps, width=256, cap=25 * MB, chunk_bytes=250 * MB)


def _table(title: str, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = " | ".join(h.ljust(n) for h, n in zip(header, widths, strict=True))
    print(line)
    print("-+-".join("-" * n for n in widths))
    for row in rows:
        print(" | ".join(str(x).rjust(n) for x, n in zip(row, widths, strict=True)))


def _kb(n: float) -> str:
    return f"{n / 1000:,.1f} KB"


def _figures(root: w.Widget) -> int:
    """plotly FigureWidgets in a widget tree."""
    own = int(type(root).__name__ == "FigureWidget")
    return own + sum(_figures(c) for c in getattr(root, "children", ()))


def bytes_per_dashboard(cases: list[tuple[str, int, int, int]]) -> None:
    rows = []
    for name, ranks, params, steps in cases:
        events = realistic_run(ranks, params, steps)
        with WireCounter() as wire:
            d = Dashboard(events)
        saved = len(json.dumps(dependency_state(d)))
        figures = _figures(d)
        rows.append((name, f"{len(events):,}", f"{wire.total / 1e6:.2f} MB",
                     f"{saved / 1e6:.2f} MB", f"{wire.total / 6e6:.2f}", figures))
        d.close()
    _table("1. bytes a Dashboard ships (budget 6 MB)",
           ("run", "events", "sent on open", "saved state", "ratio to budget", "FigureWidgets"),
           rows)


def steady_live(ranks: int, params: int, steps: int, pace_s: float) -> tuple[Any, ...]:
    """Feed a Dashboard iteration by iteration from a thread. The constructor and iterations
    0-2 (plotly.js, the initial map, the rebuild) are the warm-up; the rest is steady."""
    events = realistic_run(ranks, params, steps)
    by_step: dict[int, list[Event]] = {}
    for e in events:
        by_step.setdefault(e.step, []).append(e)
    with WireCounter() as wire:
        d = Dashboard(max_hz=10)
        assert d.throttle is not None
        redraw_time = [0.0]
        inner = d.throttle._redraw

        def timed() -> bool | None:
            t = time.perf_counter()
            try:
                return inner()
            finally:
                redraw_time[0] += time.perf_counter() - t

        d.throttle._redraw = timed
        count = [0]
        marks: dict[str, float] = {}

        def job() -> None:
            for step in sorted(by_step):
                if step == 3:
                    marks["steady"] = time.monotonic()
                    redraw_time[0] = 0.0
                d.feed(by_step[step])
                count[0] += len(by_step[step]) if step >= 3 else 0
                time.sleep(pace_s)
            marks["end"] = time.monotonic()

        thread = threading.Thread(target=job)
        thread.start()
        thread.join()
        warmup = wire.total - wire.since(marks["steady"])
        elapsed = marks["end"] - marks["steady"]
        sent = wire.since(marks["steady"])
        redraws = sum(1 for t in d.throttle.times if t >= marks["steady"])
    d.close()
    return (f"{ranks} x {params} params", f"{1 / pace_s:g} it/s",
            f"{count[0] / elapsed:,.0f}", f"{elapsed:.1f} s", redraws,
            f"{warmup / 1e6:.2f} MB", f"{sent / elapsed / 1000:,.1f} KB/s",
            f"{sent / elapsed / 50_000:.2f}", f"{redraw_time[0] / elapsed * 100:.1f} %")


def replay_at_scale(ranks: int, params: int, steps: int, moves: int) -> None:
    t = time.perf_counter()
    events = realistic_run(ranks, params, steps)
    trace = Trace(events)
    made = time.perf_counter() - t
    t = time.perf_counter()
    model = EventModel()
    for rank in trace.ranks:
        model.feed(trace.events(rank))
    ingest = time.perf_counter() - t
    with WireCounter() as wire:
        t = time.perf_counter()
        d = Dashboard(trace)
        build = time.perf_counter() - t
        opened = wire.total
        assert d.controls is not None
        step_moves, time_moves, step_bytes = [], [], []
        for i in range(moves):
            step = (i * 37) % steps
            before = wire.total
            t = time.perf_counter()
            d.controls.show_step(step)
            step_moves.append(time.perf_counter() - t)
            step_bytes.append(wire.total - before)
            t = time.perf_counter()
            d.controls.show_time((i * 0.137) % 1.0)
            time_moves.append(time.perf_counter() - t)
    d.close()
    rows = [
        ("events", f"{len(events):,}", f"(generated in {made:.1f} s)"),
        ("fold into EventModel", f"{ingest:.2f} s", f"{len(events) / ingest / 1e6:.2f} M events/s"),
        ("Dashboard(trace): load + first draw", f"{build:.2f} s",
         f"{opened / 1e6:.2f} MB sent"),
        ("iteration slider move (median)", f"{statistics.median(step_moves) * 1e3:.0f} ms",
         f"max {max(step_moves) * 1e3:.0f} ms, {statistics.median(step_bytes) / 1e3:.0f} KB"),
        ("time slider move (median)", f"{statistics.median(time_moves) * 1e3:.0f} ms",
         f"max {max(time_moves) * 1e3:.0f} ms"),
    ]
    _table(f"3. replay of {params:,} parameters x {ranks} ranks x {steps} iterations",
           ("what", "cost", "note"), rows)


def _median_s(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _timeline(events: list[Event], kw: dict[str, Any], repeat: int) -> tuple[Any, ...]:
    """HookTimeline: build, then iteration slider moves; bytes drawn and sent per move."""
    with WireCounter() as wire:
        build = _median_s(lambda: HookTimeline(events, **kw).close(), repeat)
        t = HookTimeline(events, **kw)
        assert t.controls is not None
        controls = t.controls
        steps = iter([0, 1, 2] * repeat * 2)
        before = wire.total
        move = _median_s(lambda: controls.show_step(next(steps)), repeat)
        drawn = len(t.svg_html.value) + len(t.order_html.value) + len(t.buckets_html.value)
        t.close()
        sent = wire.total - before
    return (build, move, "(iteration)", _kb(drawn), _kb(sent / repeat))


def _broadcast(events: list[Event], kw: dict[str, Any], repeat: int) -> tuple[Any, ...]:
    """BroadcastProgress: build, then time slider moves through the broadcast."""
    trace = Trace(events)
    build = _median_s(lambda: BroadcastProgress(trace, **kw).close(), repeat)
    b = BroadcastProgress(trace, **kw)
    assert b.controls is not None
    controls = b.controls
    fractions = iter([0.3, 0.5, 0.7, 0.9] * repeat * 2)
    move = _median_s(lambda: controls.show_time(next(fractions)), repeat)
    bars = len(b.rows_box.children)
    b.close()
    return (build, move, "(time)", f"{bars} bar rows", "")


def _verification(events: list[Event], kw: dict[str, Any], repeat: int) -> tuple[Any, ...]:
    """VerificationView: build, then rows picked."""
    build = _median_s(lambda: VerificationView(events, **kw).close(), repeat)
    v = VerificationView(events, **kw)
    names = iter([r.key for r in v.matrix.rows] * repeat)
    select = v.row_select

    def pick() -> None:
        select.value = next(names)

    move = _median_s(pick, repeat)
    drawn = f"{len(v.columns())} columns, {_kb(len(v.matrix_html.value))}"
    v.close()
    return (build, move, "(row)", drawn, "")


def many_ranks(sizes: list[int], params: int, repeat: int) -> None:
    rows = []
    for n in sizes:
        runs = {"HookTimeline": synthetic_run(n, params, 3, plant=Plant(slow={n // 3: 50})),
                "BroadcastProgress": synthetic_run(n, params, 0, width=256, chunk_bytes=MB),
                "VerificationView": synthetic_run(n, params, 0,
                                                  plant=Plant(shape={n // 2: (2, (3, 256))}))}
        for forced in ((False, True) if n == max(sizes) else (False,)):
            per_rank: dict[str, dict[str, Any]] = {
                "HookTimeline": {"lanes_up_to": 10**6}, "BroadcastProgress":
                {"rows_up_to": 10**6}, "VerificationView": {"group_ranks": False}}
            label = f"{n}{' (one lane/bar/column per rank)' if forced else ''}"
            for name, bench in (("HookTimeline", _timeline), ("BroadcastProgress", _broadcast),
                                ("VerificationView", _verification)):
                events = runs[name]
                feed = _median_s(lambda: EventModel().feed(events), repeat)  # noqa: B023
                build, move, what, drawn, sent = bench(
                    events, per_rank[name] if forced else {}, repeat)
                rows.append((label, name, f"{build * 1e3:,.0f} ms ({feed * 1e3:,.0f})",
                             f"{move * 1e3:,.0f} ms {what}", drawn, sent))
    _table(f"4. widgets at many ranks ({params} parameters, medians of {repeat})",
           ("ranks", "widget", "build + first draw (of which EventModel.feed)", "one update",
            "drawn", "sent per update"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    parser.add_argument("--ranks-only", action="store_true", help="only table 4")
    args = parser.parse_args()
    many_ranks([16, 64, 256], 100, 3 if args.quick else 5)
    if args.ranks_only:
        return
    big_steps = 10 if args.quick else 100
    bytes_per_dashboard([("tiny: 2 ranks x 6 params x 3 it", 2, 6, 3),
                         ("medium: 8 x 100 x 10", 8, 100, 10),
                         (f"large: 8 x 1,000 x {big_steps}", 8, 1000, big_steps)])
    rows = [steady_live(2, 6, 60, 0.05), steady_live(8, 100, 40, 0.1),
            steady_live(8, 1000, 15 if args.quick else 40, 0.25)]
    _table("2. steady live updates after the rebuild (budget 50 KB/s)",
           ("model", "pace", "events/s in", "measured", "redraws", "warm-up sent", "sent",
            "ratio to budget", "kernel time in redraws"), rows)
    replay_at_scale(8, 1000, big_steps, 5 if args.quick else 15)


if __name__ == "__main__":
    main()
