"""Tests of the live event stream: codec, sender, collector, sessions, traces, reports."""
