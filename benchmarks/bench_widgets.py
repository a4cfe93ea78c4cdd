"""What the notebook dashboard costs: bytes to the browser and kernel time (CPU only, no
browser).

The Dashboard is a TraceView (ddpviz/widgets/trace_view.py): the run goes to the browser once
as its `.ddpviz` bytes and the TS front end draws every panel there, replay included, so the
kernel's costs are building it (the bytes, diagnose()) and what it sends; the numbers the
panels show are computed by the model layer, measured here at many ranks.

1. bytes sent per Dashboard: every comm message a kernel would send on open (the widget with
   its state: the run's bytes, the front end, the findings), counted through a recording comm,
   for a tiny, a medium and a large run, and the time to build it.
2. replay at scale: 1,000 parameters x 8 ranks x 100 iterations (~800k events): folding them
   into the EventModel, and building the Dashboard (its bytes sent).
3. many ranks: from a replayed 16/64/256-rank run (100 parameters, 3 iterations; one rank
   slow, one with another shape for the matrix), the Dashboard's build and bytes, and the
   model functions behind its panels, medians: the verification matrix (build_matrix), the
   hook timeline's distribution (analyse + iteration_spread) and the broadcast's per-rank
   state (EventModel.construction).

    python benchmarks/bench_widgets.py [--quick] [--ranks-only]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz.events import Event
from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import analyse
from ddpviz.model.hook_spread import iteration_spread
from ddpviz.model.verification_matrix import build_matrix
from ddpviz.traces.trace import Trace
from ddpviz.widgets import Dashboard
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


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def _opened(events: list[Event] | Trace) -> tuple[float, int, int]:
    """Seconds to build a Dashboard, bytes sent on open, of which the run's bytes."""
    with WireCounter() as wire:
        t = time.perf_counter()
        d = Dashboard(events)
        build = time.perf_counter() - t
    trace = len(d.trace)
    d.close()
    return build, wire.total, trace


def bytes_per_dashboard(cases: list[tuple[str, int, int, int]]) -> None:
    rows = []
    for name, ranks, params, steps in cases:
        events = realistic_run(ranks, params, steps)
        build, sent, trace = _opened(events)
        rows.append((name, f"{len(events):,}", _mb(sent), _mb(trace), f"{build:.2f} s"))
    _table("1. bytes a Dashboard sends on open", ("run", "events", "sent on open",
                                                  "of which the run", "build"), rows)


def replay_at_scale(ranks: int, params: int, steps: int) -> None:
    t = time.perf_counter()
    events = realistic_run(ranks, params, steps)
    trace = Trace(events)
    made = time.perf_counter() - t
    t = time.perf_counter()
    model = EventModel()
    for rank in trace.ranks:
        model.feed(trace.events(rank))
    ingest = time.perf_counter() - t
    build, sent, _ = _opened(trace)
    rows = [
        ("events", f"{len(events):,}", f"(generated in {made:.1f} s)"),
        ("fold into EventModel", f"{ingest:.2f} s", f"{len(events) / ingest / 1e6:.2f} M events/s"),
        ("Dashboard(trace)", f"{build:.2f} s", f"{_mb(sent)} sent (replay runs in the browser)"),
    ]
    _table(f"2. replay of {params:,} parameters x {ranks} ranks x {steps} iterations",
           ("what", "cost", "note"), rows)


def _median_s(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _model_of(events: list[Event]) -> EventModel:
    model = EventModel()
    model.feed(events)
    return model


def many_ranks(sizes: list[int], params: int, repeat: int) -> None:
    rows = []
    for n in sizes:
        timed = synthetic_run(n, params, 3, plant=Plant(slow={n // 3: 50}))
        broadcast = synthetic_run(n, params, 0, width=256, chunk_bytes=MB)
        shape = synthetic_run(n, params, 0, plant=Plant(shape={n // 2: (2, (3, 256))}))
        build, sent, _ = _opened(timed)
        feed = _median_s(lambda: _model_of(timed), repeat)  # noqa: B023
        m = _model_of(shape)
        matrix = _median_s(lambda: build_matrix(m.construction(), m.world_size),  # noqa: B023
                           repeat)
        t = _model_of(timed)
        spread = _median_s(lambda: iteration_spread(analyse(
            2, t.step_records(2), params)), repeat)  # noqa: B023
        b = _model_of(broadcast)
        chunks = _median_s(lambda: b.construction(), repeat)  # noqa: B023
        rows.append((n, f"{build * 1e3:,.0f} ms, {_mb(sent)}", f"{feed * 1e3:,.0f} ms",
                     f"{matrix * 1e3:,.1f} ms", f"{spread * 1e3:,.1f} ms",
                     f"{chunks * 1e3:,.1f} ms"))
    _table(f"3. many ranks ({params} parameters, medians of {repeat})",
           ("ranks", "Dashboard build, sent", "EventModel.feed", "verification matrix",
            "hook distribution", "broadcast state"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    parser.add_argument("--ranks-only", action="store_true", help="only table 3")
    args = parser.parse_args()
    many_ranks([16, 64, 256], 100, 3 if args.quick else 5)
    if args.ranks_only:
        return
    big_steps = 10 if args.quick else 100
    bytes_per_dashboard([("tiny: 2 ranks x 6 params x 3 it", 2, 6, 3),
                         ("medium: 8 x 100 x 10", 8, 100, 10),
                         (f"large: 8 x 1,000 x {big_steps}", 8, 1000, big_steps)])
    replay_at_scale(8, 1000, big_steps)


if __name__ == "__main__":
    main()
