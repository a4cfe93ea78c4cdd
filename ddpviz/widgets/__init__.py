"""Notebook widgets (ipywidgets + plotly). They consume plans, events and findings only, never
engine objects."""

import ddpviz.widgets._require  # noqa: F401  (first: a clear error without ddpviz[lab])
from ddpviz.widgets.broadcast_progress import BroadcastProgress
from ddpviz.widgets.bucket_map import BucketMap
from ddpviz.widgets.dashboard import Dashboard, dashboard
from ddpviz.widgets.hook_timeline import HookTimeline
from ddpviz.widgets.live_bucket_map import LiveBucketMap
from ddpviz.widgets.verification_view import VerificationView

__all__ = ["BroadcastProgress", "BucketMap", "Dashboard", "HookTimeline", "LiveBucketMap",
           "VerificationView", "dashboard"]
