"""The `report` verb: a static, self-contained HTML report of a run (html.py) and its
Chrome/Perfetto trace export (chrome_trace.py)."""
