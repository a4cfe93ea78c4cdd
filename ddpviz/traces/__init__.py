"""Recorded runs on disk and in memory: the `.ddpviz` file format and its writer
(fileformat.py), its hot events decoded straight into columns (framecolumns.py), the columnar
event store (columns.py) and `Trace`, the events of a run kept per rank (trace.py).

fileformat.py is the one reader of the format: traces, `listen(follow=)` and the loaders all
read frames through it. Readers never import the launcher (tests/test_layers.py).
"""
