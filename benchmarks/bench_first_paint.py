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

Each row gives two times, both taken in the page itself (a script before the view's): to the
first frame painted after the timeline's SVG exists, and to the first after every panel was
drawn (a view draws the panels below the timeline after its first paint). Then one more
opening of each row under Chromium's tracing says where the time went: the view's own User
Timing measures (ddpviz:parse, model, status, panels, panel:<kind>: stages.ts) and, from the
trace, the main thread's style, layout, paint and GC up to the first paint.

`--front-end DIR` measures another build beside this tree's (trace_view.js, trace_view.css and
report_view.js as `node build-widget.js` writes them, e.g. from an earlier commit's
extension/src), the openings in turn: before and after under the same load.

Prints CPU and wall seconds per stage; nothing is asserted.

    PYTHONPATH=. python benchmarks/bench_first_paint.py /work/scale/scale-64x1000x20.ddpviz \
        [/work/scale/scale-256x10000x5.ddpviz ...] [--repeat 3] [--front-end DIR]
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
ENCODING, LEVEL = "deflate", 6  # report/interactive.py's ENCODING and LEVEL
# In the page before the view: when the first frame after the timeline's SVG exists was
# painted (window.__ddpviz_painted, ms from navigation start), and the first after every
# panel was drawn (window.__ddpviz_all: the view's root marked data-panels="all"; the panels
# below the timeline are drawn after the first paint). Taken in the page, not by asking it
# from here: by the time a question came, the page could be drawing those panels.
OBSERVER = """<script>(() => {
  const seen = {};
  const at = (key, selector) => {
    if (!seen[key] && document.querySelector(selector)) {
      seen[key] = true;
      requestAnimationFrame(() => setTimeout(() => {
        window[key] = performance.now();
        performance.mark(key);
      }));
    }
  };
  performance.mark('__ddpviz_page');
  new MutationObserver(() => {
    at('__ddpviz_painted', 'svg.ddpviz-timeline');  // the hook timeline: the main drawing
    // (a view built before data-panels: its last panel, the event counts)
    at('__ddpviz_all', '.ddpviz-trace[data-panels="all"], [data-section="counts"]');
  }).observe(document, { subtree: true, childList: true, attributes: true,
                         attributeFilter: ['data-panels'] });
})();</script>"""


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s of this process, what `fn` returned)."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


class FrontEnd:
    """A build of the front end: the package's (`folder` None) or one in a folder (a build of
    another commit: `node build-widget.js` writes trace_view.js, trace_view.css and
    report_view.js), measured side by side with it."""

    def __init__(self, folder: Path | None) -> None:
        self.label = "this tree" if folder is None else str(folder)
        self.files = {name: front_end(name) if folder is None else
                      (folder / name).read_text(encoding="utf-8")
                      for name in ("trace_view.js", "trace_view.css", "report_view.js")}


def page(name: str, trace: bytes, diagnosis: bytes, advice: bytes,
         front: FrontEnd | None = None) -> str:
    """The benchmark's page: the front end over the embedded bytes (trusted: ddpviz's own)."""
    front = front or FrontEnd(None)
    def data(element_id: str, raw: bytes) -> str:
        text = base64.b64encode(zlib.compress(raw, LEVEL)).decode("ascii")
        return f'<script type="application/octet-stream" id="{element_id}">{text}</script>'

    return ("<!doctype html><html><head><meta charset='utf-8'><style>"
            f"{front.files['trace_view.css']}</style>{OBSERVER}</head><body>"
            f'<div id="{VIEW_ID}" data-name="{name}" data-encoding="{ENCODING}"></div>'
            f"{data(TRACE_ID, trace)}{data(DIAGNOSIS_ID, diagnosis)}{data(ADVICE_ID, advice)}"
            f'<script type="module">{front.files["report_view.js"]}</script></body></html>')


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
<link rel="stylesheet" href="trace_view.css">""" + OBSERVER + """</head><body>
<div id="ddpviz-view"></div>
<script type="module">
import widget from './trace_view.js';
const traits = await (await fetch('traits.json')).json();
const [trace, diagnosis, advice] = await Promise.all(['trace', 'diagnosis', 'advice'].map(
  async n => new DataView(await (await fetch(n + '.bin')).arrayBuffer())));
window.__ddpviz_bytes_ms = performance.now();
performance.mark('__ddpviz_bytes');
const values = { ...traits, trace, diagnosis, advice };
const model = { get: n => values[n], on: () => undefined, off: () => undefined };
widget.render({ model, el: document.getElementById('ddpviz-view') });
</script></body></html>"""


@contextmanager
def served(sent: Sent, fronts: list[FrontEnd]) -> Iterator[list[str]]:
    """The binary row's page and its files, served from memory on 127.0.0.1: its address,
    for each front end."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    files: dict[str, tuple[str, bytes]] = {}
    for i, front in enumerate(fronts):
        files.update({
            f"/{i}/index.html": ("text/html", _BINARY_PAGE.encode()),
            f"/{i}/trace_view.js": ("text/javascript", front.files["trace_view.js"].encode()),
            f"/{i}/trace_view.css": ("text/css", front.files["trace_view.css"].encode()),
            f"/{i}/traits.json": ("application/json", json.dumps(sent.traits).encode()),
            f"/{i}/trace.bin": ("application/octet-stream", sent.trace),
            f"/{i}/diagnosis.bin": ("application/octet-stream", sent.diagnosis),
            f"/{i}/advice.bin": ("application/octet-stream", sent.advice)})

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
        yield [f"http://127.0.0.1:{server.server_address[1]}/{i}/index.html"
               for i in range(len(fronts))]
    finally:
        server.shutdown()
        server.server_close()


# the renderer's work by kind, from a Chromium trace (its main thread's events' self time)
TRACED = ["devtools.timeline", "disabled-by-default-devtools.timeline", "v8",
          "blink.user_timing", "disabled-by-default-v8.gc"]


def _kind(name: str) -> str:
    if "GC" in name or name in ("MinorGC", "MajorGC"):
        return "GC"
    if "Style" in name or "LayoutTree" in name:
        return "style"
    if "Layout" in name:
        return "layout"
    if "Paint" in name or name in ("Layerize", "Commit", "UpdateLayer"):
        return "paint"
    return "other"


def traced_kinds(events: list[dict[str, Any]], start: str, end: str) -> dict[str, float]:
    """Seconds of style, layout, paint and GC on the page's main thread between the marks
    `start` and `end` (self time: an event's time less that of the events within it)."""
    marks = {e["name"]: e["ts"] for e in events if "user_timing" in e.get("cat", "")}
    t0, t1 = marks[start], marks[end]
    main = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"
            and e.get("args", {}).get("name") == "CrRendererMain"}
    spans = sorted(((e["ts"], e["dur"], e["name"]) for e in events
                    if (e["pid"], e["tid"]) in main and e.get("ph") == "X" and "dur" in e
                    and t0 <= e["ts"] <= t1), key=lambda x: (x[0], -x[1]))
    own = [float(d) for _, d, _ in spans]
    stack: list[int] = []
    for i, (ts, dur, _) in enumerate(spans):
        while stack and spans[stack[-1]][0] + spans[stack[-1]][1] <= ts:
            stack.pop()
        if stack:
            own[stack[-1]] -= dur
        stack.append(i)
    out = {"style": 0.0, "layout": 0.0, "paint": 0.0, "GC": 0.0}
    for (_, _, name), t in zip(spans, own, strict=True):
        kind = _kind(name)
        if kind in out:
            out[kind] += t / 1e6
    return out


def _traced(tab: Any, cdp: Any) -> list[dict[str, Any]]:
    """The trace that `cdp` (a CDP session of `tab`) has been recording, ended."""
    import json

    done: list[Any] = []

    def complete(event: Any) -> None:
        done.append(event)

    cdp.on("Tracing.tracingComplete", complete)
    cdp.send("Tracing.end")
    while not done:
        tab.wait_for_timeout(100)
    chunks = []
    while True:
        part = cdp.send("IO.read", {"handle": done[0]["stream"], "size": 1 << 22})
        chunks.append(part["data"])
        if part.get("eof"):
            break
    data = json.loads("".join(chunks))
    return data["traceEvents"] if isinstance(data, dict) else data


Openings = dict[str, list[tuple[float, float]]]  # row -> (first paint, every panel) s


def browser_paint(pages: list[Path], sent: Sent, fronts: list[FrontEnd], repeat: int
                  ) -> tuple[list[Openings], list[dict[str, dict[str, float]]]]:
    """Per front end, per row (report, binary): seconds to the timeline's first paint and to
    every panel's, per opening (the front ends in turn): of the report page (`pages`, one per
    front end) from navigation start, of the binary path from the buffers in hand; then, of
    one more opening of each under Chromium's tracing, its stages (the view's own measures:
    parse, model, panels; the trace's style, layout, paint, GC)."""
    from playwright.sync_api import sync_playwright

    openings: list[Openings] = [{"report": [], "binary": []} for _ in fronts]
    stages: list[dict[str, dict[str, float]]] = [{} for _ in fronts]
    with sync_playwright() as p, served(sent, fronts) as addresses:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            for opening in range(repeat + 1):
                traced = opening == repeat
                for f in range(len(fronts)):
                    for row in ("report", "binary"):
                        url = pages[f].as_uri() if row == "report" else addresses[f]
                        out = _open(browser, url, row, traced)
                        if traced:
                            stages[f][row] = out
                        else:
                            openings[f][row].append((out["first paint"], out["every panel"]))
        finally:
            browser.close()
    return openings, stages


def _open(browser: Any, url: str, row: str, traced: bool) -> dict[str, float]:
    """One opening of a page: its first paint and every panel's (s), and traced: its stages."""
    context = browser.new_context(viewport={"width": 1280, "height": 1500})
    tab = context.new_page()
    errors: list[str] = []

    def threw(error: Any, errors: list[str] = errors) -> None:
        errors.append(str(error))

    tab.on("pageerror", threw)
    cdp = context.new_cdp_session(tab) if traced else None
    if cdp is not None:
        cdp.send("Tracing.start", {
            "traceConfig": {"includedCategories": TRACED}, "transferMode": "ReturnAsStream"})
    tab.goto(url, wait_until="commit")
    tab.wait_for_function("window.__ddpviz_all !== undefined", timeout=300_000, polling=100)
    painted, done, start = tab.evaluate(
        "[window.__ddpviz_painted, window.__ddpviz_all, window.__ddpviz_bytes_ms || 0]")
    if errors:
        raise SystemExit(f"the page threw: {errors[:3]}")
    out = {"first paint": (painted - start) / 1e3, "every panel": (done - start) / 1e3}
    if cdp is not None:
        out.update(tab.evaluate(
            "Object.fromEntries(performance.getEntriesByType('measure')"
            ".filter(m => m.name.startsWith('ddpviz:'))"
            ".map(m => [m.name.slice(7), m.duration / 1e3]))"))
        out.update(traced_kinds(_traced(tab, cdp),
                                "__ddpviz_page" if row == "report" else "__ddpviz_bytes",
                                "__ddpviz_painted"))
    context.close()
    return out


STAGES = ["parse", "model", "status", "panel:buckets", "panel:verification", "panel:timeline",
          "panels", "style", "layout", "paint", "GC", "first paint", "every panel"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--repeat", type=int, default=3, help="browser openings per file")
    parser.add_argument("--front-end", type=Path, action="append", default=[],
                        help="also measure the front end built in this folder (trace_view.js, "
                        "trace_view.css, report_view.js: a build of another commit), the "
                        "openings in turn with this tree's")
    args = parser.parse_args()
    if not front_end("report_view.js") or not front_end("trace_view.js"):
        raise SystemExit("the front end is not built: cd extension && jlpm build")
    fronts = [FrontEnd(folder) for folder in args.front_end] + [FrontEnd(None)]
    Dashboard(Trace()).close()  # (the widgets' first import, outside the stages)
    for path in args.files:
        rows, html, sent, events = kernel(path)
        with tempfile.TemporaryDirectory(prefix="ddpviz-paint-") as folder:
            pages = []
            for i, front in enumerate(fronts):
                pages.append(Path(folder) / f"first_paint_{i}.html")
                pages[-1].write_text(html if front.label == "this tree" else
                                     page(path.name, sent.trace, sent.diagnosis, sent.advice,
                                          front), encoding="utf-8")
            openings, stages = browser_paint(pages, sent, fronts, args.repeat)
        print(f"\n## {path.name}: {events:,} events, file {path.stat().st_size / 2**20:,.0f} "
              f"MiB, {len(sent.trace) / 2**20:,.1f} MiB sent; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
        print("| stage | wall s | CPU s |\n|---|---|---|")
        print("\n".join(rows))
        for front, paints in zip(fronts, openings, strict=True):
            for key, what in (("report", "report page: navigation start to"),
                              ("binary", "dashboard (binary buffers): bytes in hand to")):
                for i, part in enumerate(("the timeline's first paint",
                                          "every panel painted")):
                    times = [o[i] for o in paints[key]]
                    print(f"| browser ({front.label}), {what} {part} (Chromium; best of "
                          f"{len(times)}: {', '.join(f'{t:.2f}' for t in times)}) | "
                          f"{min(times):.2f} | |")
        print("\nWhere the page's time goes (one more opening each, under Chromium's tracing:"
              " slower than the rows above; seconds; style, layout, paint and GC: up to the "
              "first paint; the view's own measures hold the GC that ran within them)\n")
        heads = [f"{k} ({front.label})" for front in fronts for k in ("report", "dashboard")]
        print(f"| stage | {' | '.join(heads)} |\n|---|{'---|' * len(heads)}")
        for name in STAGES:
            cells = [st.get(k, {}).get(name) for st in stages for k in ("report", "binary")]
            print(f"| {name} | " + " | ".join("" if c is None else f"{c:.2f}" for c in cells)
                  + " |")


if __name__ == "__main__":
    main()
