"""The run model: the one place where an event stream is folded into what readers ask of a run.

Between the store (a Trace's columns, a live Session's events) and every reader (the
dashboard's widgets, the HTML report, the Chrome export, the advisor, the JupyterLab viewer's
export). Pure: it imports the event vocabulary, the columns and itself, never torch, widgets,
the launcher or the trace container.
- event_model.py: `EventModel`, per-rank state and per-(rank, step) `StepRecord`s;
- spans.py: a rank's events as intervals (`Span`), for timelines and Perfetto;
- phases.py: the one table naming DDP's phases;
- hook_analysis.py, hook_spread.py: gradient-hook order per rank and across ranks;
- verification_matrix.py: the constructor's verification as parameter x rank;
- rank_groups.py: many ranks read as few (value groups, ranges, percentiles).
"""
