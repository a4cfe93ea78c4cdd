"""Notebook widgets (ipywidgets + plotly). They consume plans, events and findings only, never
engine objects."""

from ddpviz.widgets.bucket_map import BucketMap

__all__ = ["BucketMap"]
