"""PerfettoButton: the dashboard's "Open in Perfetto" and "Save Chrome trace", an anywidget.

The front end (extension/src/perfettoButton.ts, bundled by extension/build-widget.js into
static/perfetto_button.js) opens Perfetto's tab inside the click and asks the kernel for the
run; the kernel answers with the run as it is now, as the bytes of one `.ddpviz` file in a
message buffer (`trace_bytes`, bounded as a TraceView's), and the browser builds the Chrome
trace with the viewer's own code and hands it over. Nothing is sent until a button is pressed,
so a live dashboard pays nothing for it.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from ddpviz.traces.view_bytes import STATIC, TraceViewError, front_end, trace_bytes
from ddpviz.widgets import trace_view


class PerfettoButton(anywidget.AnyWidget):
    """Two buttons for the run `source` (a Run, a Session, a Trace, a `.ddpviz` path or folder,
    or a list of events): the run as it is when pressed, opened in ui.perfetto.dev or saved as
    Chrome trace JSON.

    Raises:
        TraceViewError: the front end is not built.
    """

    _esm = front_end("perfetto_button.js")
    _css = front_end("trace_view.css")
    name = traitlets.Unicode("run").tag(sync=True)

    def __init__(self, source: object, *, name: str = "run", **kwargs: Any) -> None:
        if not self._esm or not self._css:
            raise TraceViewError(
                f"ddpviz: the Perfetto button's front end (perfetto_button.js) is not built in "
                f"{STATIC}.\nInstall ddpviz from a wheel, or build it in a checkout: cd "
                "extension && jlpm install && jlpm build.")
        super().__init__(name=name, **kwargs)
        self._source = source
        self.on_msg(self._on_request)

    def _on_request(self, _widget: object, content: Any, _buffers: object) -> None:
        if not isinstance(content, dict) or content.get("kind") != "chrome":
            return  # (not this front end's message)
        request = content.get("id")
        if isinstance(request, bool) or not isinstance(request, int):
            return
        try:
            data, _ = trace_bytes(self._source, limit=trace_view.MAX_BYTES)
        except Exception as exc:  # said under the button, never raised into the kernel
            message = str(exc) if isinstance(exc, TraceViewError) else (
                f"ddpviz: the run could not be sent for its Chrome trace: {exc}")
            self.send({"kind": "error", "id": request, "message": message})
            return
        self.send({"kind": "trace", "id": request, "name": self.name}, buffers=[data])
