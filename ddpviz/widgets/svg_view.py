"""SvgView: an SVG string (built in Python through ddpviz.markup) drawn by a small anywidget,
which reports a click on an element carrying `data-bucket` back to the kernel.

An ipywidgets HTML widget cannot call back, so the hook timeline draws into this instead; the
SVG itself is the same string. Clicks reach the kernel only while it is idle (a message from
the browser waits for a running cell), and only when someone listens (`on_bucket_click`):
without a listener a click does nothing, and the elements show no pointer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

MAX_BUCKET = 1 << 20  # a bucket index from the browser above this is not one

# The front end, whole: draw the SVG, send {bucket: k} for a click on [data-bucket].
_ESM = """
function render({ model, el }) {
  const draw = () => {
    el.innerHTML = model.get("value");
    el.classList.toggle("ddpviz-clickable", model.get("clickable"));
  };
  draw();
  model.on("change:value", draw);
  model.on("change:clickable", draw);
  el.addEventListener("click", (event) => {
    if (!model.get("clickable")) return;
    const hit = event.target.closest ? event.target.closest("[data-bucket]") : null;
    if (hit && el.contains(hit)) {
      model.send({ bucket: Number(hit.getAttribute("data-bucket")) });
    }
  });
}
export default { render };
"""
_CSS = """
.ddpviz-clickable [data-bucket] { cursor: pointer; }
.ddpviz-clickable rect[data-bucket]:hover { stroke: #e36209; stroke-width: 1.5; }
"""


class SvgView(anywidget.AnyWidget):
    """One SVG, redrawn when `value` changes; `on_bucket_click` hears clicks on buckets.

    Kernel-side state: `value` (the SVG string, as an HTML widget's), `clickable` (whether
    a click is listened to), `clicks` (the latest bucket indices clicked, in order).
    """

    _esm = _ESM
    _css = _CSS
    value = traitlets.Unicode("").tag(sync=True)
    clickable = traitlets.Bool(False).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._listeners: list[Callable[[int], None]] = []
        self.clicks: deque[int] = deque(maxlen=100)  # the latest clicks, for tests
        self.on_msg(self._message)

    def on_bucket_click(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call `callback(bucket)` when an element with `data-bucket` is clicked.

        Args:
            callback: called with the bucket index on the kernel's thread.

        Returns:
            The function that stops the calls.
        """
        self._listeners.append(callback)
        self.clickable = True

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)
            self.clickable = bool(self._listeners)

        return remove

    def click(self, bucket: int) -> None:
        """What a click on bucket `bucket` in the browser does (for tests and scripts)."""
        self._message(self, {"bucket": bucket}, [])

    def _message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        # the browser's message is input: a bucket index, bounded, or nothing happens
        bucket = content.get("bucket") if isinstance(content, dict) else None
        if isinstance(bucket, float) and bucket.is_integer():
            bucket = int(bucket)
        if isinstance(bucket, bool) or not isinstance(bucket, int) \
                or not 0 <= bucket < MAX_BUCKET:
            return
        self.clicks.append(bucket)
        for callback in list(self._listeners):
            callback(bucket)
