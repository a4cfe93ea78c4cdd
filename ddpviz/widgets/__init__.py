"""Notebook widgets (anywidget, ipywidgets + plotly). They consume plans, events and findings
only, never engine objects."""

import ddpviz.widgets._require  # noqa: F401  (first: a clear error without ddpviz[lab])
from ddpviz.widgets.bucket_map import BucketMap
from ddpviz.widgets.dashboard import Dashboard, dashboard
from ddpviz.widgets.trace_view import TraceView

__all__ = ["BucketMap", "Dashboard", "TraceView", "dashboard"]
