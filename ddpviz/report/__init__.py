"""The `report` verb: a static, self-contained HTML report of a run (html.py) and its
Chrome/Perfetto trace export (chrome_trace.py). `ddpviz.report.write_report(run, path)` is the
Python spelling of `ddpviz report`."""

from ddpviz.report.html import render, write_report

__all__ = ["render", "write_report"]
