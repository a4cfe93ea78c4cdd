"""From file to findings to first paint in the browser: issue #40's numbers (< 1 s for the
64 x 1,000 x 20 trace, < 3 s for the 256 x 10,000 x 5 one).

Kernel side, in this process: `Trace.load` of the file, then `Dashboard(trace)` (diagnose()'s
findings and the run's `.ddpviz` bytes, summarized per bucket over 64 MiB, with COPY frames:
what the notebook dashboard sends). Browser side, in Chromium (/usr/bin/chromium, driven by
Playwright): a page holding those same bytes (the run, the findings, the advice) as the HTML
report embeds them (base64 in data elements) and the front end's bundle (report_view.js: the
same components and reader as the dashboard's), opened from disk; timed from the page's
navigation start to the first animation frame after the hook timeline's SVG exists (reading
the embedded base64, parsing the trace, building the model, drawing). The dashboard's widget
gets its bytes as a binary buffer, not base64, so the page's time holds an `atob` of the run
that the dashboard does not pay. Prints CPU and wall seconds per stage; nothing is asserted.

    PYTHONPATH=. python benchmarks/bench_first_paint.py /work/scale/scale-64x1000x20.ddpviz \
        [/work/scale/scale-256x10000x5.ddpviz ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz.traces.trace import Trace
from ddpviz.traces.view_bytes import front_end
from ddpviz.widgets.dashboard import Dashboard

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# reportView.ts's element ids (VIEW_ID, TRACE_ID, DIAGNOSIS_ID, ADVICE_ID)
VIEW_ID, TRACE_ID, DIAGNOSIS_ID = "ddpviz-view", "ddpviz-view-trace", "ddpviz-view-diagnosis"
ADVICE_ID = "ddpviz-view-advice"
PAINTED = "svg.ddpviz-timeline"  # the hook timeline: the view's main drawing
# ms from navigation start to the first frame painted after the timeline exists
FIRST_PAINT = ("new Promise(r => requestAnimationFrame(() => "
               "setTimeout(() => r(performance.now()))))")


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s of this process, what `fn` returned)."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


def page(name: str, trace: bytes, diagnosis: bytes, advice: bytes) -> str:
    """The benchmark's page: the front end over the embedded bytes (trusted: ddpviz's own)."""
    def data(element_id: str, raw: bytes) -> str:
        text = base64.b64encode(raw).decode("ascii")
        return f'<script type="application/octet-stream" id="{element_id}">{text}</script>'

    return ("<!doctype html><html><head><meta charset='utf-8'><style>"
            f"{front_end('trace_view.css')}</style></head><body>"
            f'<div id="{VIEW_ID}" data-name="{name}"></div>'
            f"{data(TRACE_ID, trace)}{data(DIAGNOSIS_ID, diagnosis)}{data(ADVICE_ID, advice)}"
            f'<script type="module">{front_end("report_view.js")}</script></body></html>')


def kernel(path: Path) -> tuple[list[str], str, int, int]:
    """Kernel side: rows, the page's HTML, bytes sent, events."""
    load_s, load_cpu, trace = timed(lambda: Trace.load(path))
    paint_s, paint_cpu, board = timed(lambda: Dashboard(trace))
    sent = bytes(board.trace)
    html = page(path.name, sent, bytes(board.diagnosis), bytes(board.advice))
    board.close()
    rows = [f"| Trace.load | {load_s:.2f} | {load_cpu:.2f} |",
            f"| Dashboard (findings + bytes sent) | {paint_s:.2f} | {paint_cpu:.2f} |"]
    return rows, html, len(sent), len(trace)


def browser_paint(html_path: Path, repeat: int) -> list[float]:
    """Seconds from navigation start to the timeline's first paint, per opening."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            for _ in range(repeat):
                context = browser.new_context(viewport={"width": 1280, "height": 1500})
                tab = context.new_page()
                errors: list[str] = []
                tab.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                tab.goto(html_path.as_uri(), wait_until="commit")
                tab.wait_for_selector(PAINTED, timeout=300_000)
                out.append(tab.evaluate(FIRST_PAINT) / 1e3)
                if errors:
                    raise SystemExit(f"the page threw: {errors[:3]}")
                context.close()
        finally:
            browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--repeat", type=int, default=3, help="browser openings per file")
    args = parser.parse_args()
    if not front_end("report_view.js"):
        raise SystemExit("the front end is not built: cd extension && jlpm build")
    Dashboard(Trace()).close()  # (the widgets' first import, outside the stages)
    for path in args.files:
        rows, html, sent, events = kernel(path)
        with tempfile.TemporaryDirectory(prefix="ddpviz-paint-") as folder:
            html_path = Path(folder) / "first_paint.html"
            html_path.write_text(html, encoding="utf-8")
            paints = browser_paint(html_path, args.repeat)
        print(f"\n## {path.name}: {events:,} events, file {path.stat().st_size / 2**20:,.0f} "
              f"MiB, {sent / 2**20:,.1f} MiB sent; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs\n")
        print("| stage | wall s | CPU s |\n|---|---|---|")
        print("\n".join(rows))
        print(f"| browser: page start to the timeline's first paint (Chromium; best of "
              f"{len(paints)}: {', '.join(f'{s:.2f}' for s in paints)}) | {min(paints):.2f} | |")


if __name__ == "__main__":
    main()
