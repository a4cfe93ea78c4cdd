"""From file to findings to first paint in the browser: issue #40's numbers (< 1 s for the
64 x 1,000 x 20 trace, < 3 s for the 256 x 10,000 x 5 one).

Kernel side, in this process: `Trace.load` of the file, then `Dashboard(trace)` (diagnose()'s
findings and the run's `.ddpviz` bytes, summarized per bucket over 64 MiB, with COPY frames:
what the notebook dashboard sends). Browser side, in Chromium (/usr/bin/chromium, driven by
Playwright), two rows:

- report page: a page holding those same bytes (the run, the findings, the advice) as the HTML
  report embeds them (report/interactive.py: zlib-compressed, base64 in data elements, the view
  element marked `data-encoding='deflate'`) and the front end's bundle (report_view.js: the
  same components and reader as the dashboard's), opened from disk; timed from the page's
  navigation start to the first animation frame after the hook timeline's SVG exists (parsing
  the page, reading and inflating the embedded bytes, parsing the trace, building the model,
  drawing). (A real report embeds 16 MiB of trace at most: the 13.2M-event run's 38-42 MiB is
  over it, so that row is the page's cost at a size no report is written at.)
- dashboard (binary): the dashboard widget's own path. Its anywidget front end (trace_view.js)
  rendered on a page served from this process's memory (an HTTP server on 127.0.0.1:
  Playwright's `page.route` took 2 minutes to hand over 38 MB) with a model whose `trace`,
  `diagnosis` and `advice` are DataViews over ArrayBuffers the page fetched as binary
  responses (no base64, no HTML parse: anywidget hands the kernel's buffers over as such);
  timed from the moment the buffers are in hand to the first animation frame after the
  timeline's SVG exists (parse, model, draw). The transfer itself (the kernel's websocket in
  a notebook) is not in it.

Prints CPU and wall seconds per stage; nothing is asserted.

    PYTHONPATH=. python benchmarks/bench_first_paint.py /work/scale/scale-64x1000x20.ddpviz \
        [/work/scale/scale-256x10000x5.ddpviz ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
ENCODING, LEVEL = "deflate", 6  # report/interactive.py's ENCODING and LEVEL
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
        text = base64.b64encode(zlib.compress(raw, LEVEL)).decode("ascii")
        return f'<script type="application/octet-stream" id="{element_id}">{text}</script>'

    return ("<!doctype html><html><head><meta charset='utf-8'><style>"
            f"{front_end('trace_view.css')}</style></head><body>"
            f'<div id="{VIEW_ID}" data-name="{name}" data-encoding="{ENCODING}"></div>'
            f"{data(TRACE_ID, trace)}{data(DIAGNOSIS_ID, diagnosis)}{data(ADVICE_ID, advice)}"
            f'<script type="module">{front_end("report_view.js")}</script></body></html>')


class Sent:
    """What the dashboard sent: its byte traits and the plain ones its front end reads."""

    def __init__(self, board: Dashboard) -> None:
        self.trace, self.diagnosis = bytes(board.trace), bytes(board.diagnosis)
        self.advice = bytes(board.advice)
        self.traits = {k: getattr(board, k) for k in (
            "name", "scheme", "max_events", "trace_events", "events_sent", "live", "notice",
            "status")}


def kernel(path: Path) -> tuple[list[str], str, Sent, int]:
    """Kernel side: rows, the report page's HTML, what the dashboard sent, events."""
    load_s, load_cpu, trace = timed(lambda: Trace.load(path))
    paint_s, paint_cpu, board = timed(lambda: Dashboard(trace))
    sent = Sent(board)
    board.close()
    html_s, html_cpu, html = timed(lambda: page(path.name, sent.trace, sent.diagnosis,
                                                sent.advice))
    rows = [f"| Trace.load | {load_s:.2f} | {load_cpu:.2f} |",
            f"| Dashboard (findings + bytes sent) | {paint_s:.2f} | {paint_cpu:.2f} |",
            f"| report page's data (zlib level {LEVEL} + base64; {len(html) / 2**20:,.1f} MiB "
            f"of HTML) | {html_s:.2f} | {html_cpu:.2f} |"]
    return rows, html, sent, len(trace)


# the binary row's page: the widget's bundle rendered over the buffers it fetched, as anywidget
# renders it over the kernel's (DataViews); window.__ddpviz_bytes_ms: when they were in hand
_BINARY_PAGE = """<!doctype html><html><head><meta charset='utf-8'>
<link rel="stylesheet" href="trace_view.css"></head><body><div id="ddpviz-view"></div>
<script type="module">
import widget from './trace_view.js';
const traits = await (await fetch('traits.json')).json();
const [trace, diagnosis, advice] = await Promise.all(['trace', 'diagnosis', 'advice'].map(
  async n => new DataView(await (await fetch(n + '.bin')).arrayBuffer())));
window.__ddpviz_bytes_ms = performance.now();
const values = { ...traits, trace, diagnosis, advice };
const model = { get: n => values[n], on: () => undefined, off: () => undefined };
widget.render({ model, el: document.getElementById('ddpviz-view') });
</script></body></html>"""


@contextmanager
def served(sent: Sent) -> Iterator[str]:
    """The binary row's page and its files, served from memory on 127.0.0.1: its address."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    files: dict[str, tuple[str, bytes]] = {
        "/index.html": ("text/html", _BINARY_PAGE.encode()),
        "/trace_view.js": ("text/javascript", front_end("trace_view.js").encode()),
        "/trace_view.css": ("text/css", front_end("trace_view.css").encode()),
        "/traits.json": ("application/json", json.dumps(sent.traits).encode()),
        "/trace.bin": ("application/octet-stream", sent.trace),
        "/diagnosis.bin": ("application/octet-stream", sent.diagnosis),
        "/advice.bin": ("application/octet-stream", sent.advice)}

    class Files(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            kind, body = files.get(self.path, ("text/plain", b""))
            self.send_response(200 if self.path in files else 404)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()


def browser_paint(html_path: Path, sent: Sent, repeat: int) -> tuple[list[float], list[float]]:
    """Seconds to the timeline's first paint, per opening: of the report page (from navigation
    start) and of the binary path (from the buffers in hand)."""
    from playwright.sync_api import sync_playwright

    report: list[float] = []
    binary: list[float] = []
    with sync_playwright() as p, served(sent) as address:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            for _ in range(repeat):
                for row in (report, binary):
                    context = browser.new_context(viewport={"width": 1280, "height": 1500})
                    tab = context.new_page()
                    errors: list[str] = []

                    def threw(error: Any, errors: list[str] = errors) -> None:
                        errors.append(str(error))

                    tab.on("pageerror", threw)
                    if row is report:
                        tab.goto(html_path.as_uri(), wait_until="commit")
                    else:
                        tab.goto(address, wait_until="commit")
                    tab.wait_for_selector(PAINTED, timeout=300_000)
                    painted = tab.evaluate(FIRST_PAINT)
                    start = 0.0 if row is report else tab.evaluate("window.__ddpviz_bytes_ms")
                    row.append((painted - start) / 1e3)
                    if errors:
                        raise SystemExit(f"the page threw: {errors[:3]}")
                    context.close()
        finally:
            browser.close()
    return report, binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--repeat", type=int, default=3, help="browser openings per file")
    args = parser.parse_args()
    if not front_end("report_view.js") or not front_end("trace_view.js"):
        raise SystemExit("the front end is not built: cd extension && jlpm build")
    Dashboard(Trace()).close()  # (the widgets' first import, outside the stages)
    for path in args.files:
        rows, html, sent, events = kernel(path)
        with tempfile.TemporaryDirectory(prefix="ddpviz-paint-") as folder:
            html_path = Path(folder) / "first_paint.html"
            html_path.write_text(html, encoding="utf-8")
            report, binary = browser_paint(html_path, sent, args.repeat)
        print(f"\n## {path.name}: {events:,} events, file {path.stat().st_size / 2**20:,.0f} "
              f"MiB, {len(sent.trace) / 2**20:,.1f} MiB sent; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
        print("| stage | wall s | CPU s |\n|---|---|---|")
        print("\n".join(rows))
        for what, paints in (
                ("report page: navigation start to the timeline's first paint", report),
                ("dashboard (binary buffers): bytes in hand to the timeline's first paint",
                 binary)):
            print(f"| browser, {what} (Chromium; best of {len(paints)}: "
                  f"{', '.join(f'{s:.2f}' for s in paints)}) | {min(paints):.2f} | |")


if __name__ == "__main__":
    main()
