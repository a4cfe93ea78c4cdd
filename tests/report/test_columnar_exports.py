"""The exports read from the columnar store give exactly what the object path gave: spans,
the Chrome trace JSON (streamed to a file and as objects), what the HTML report reads; on runs
with every kind of defect and with clock offsets."""

from __future__ import annotations

import json
from pathlib import Path

from ddpviz.report.chrome_trace import write_chrome_trace
from ddpviz.report.html import _bucket_maps, render
from ddpviz.report.ranks import rank_counts
from ddpviz.report.timeline import computed_marks
from ddpviz.traces.trace import Trace
from tests.diagnose.random_runs import random_run
from tests.report import object_report
from tests.report.object_exports import object_chrome, object_spans
from tests.transport.fake_run import rank_events


def traces() -> list[Trace]:
    out = [Trace([*rank_events(0), *rank_events(1, hang_in_step=2)],
                 clock={1: (-5, 3)}, meta={"job": "fake <run>"})]
    out += [Trace(random_run(seed), clock={0: (1_000, 10), 2: (-2_000, -1)}) for seed in
            range(60)]
    return out


def test_spans_equal_the_object_path() -> None:
    for trace in traces():
        assert trace.spans() == object_spans(trace)


def test_chrome_export_equals_the_object_path_as_a_file_and_as_objects(tmp_path: Path) -> None:
    for i, trace in enumerate(traces()):
        expected = json.loads(json.dumps(object_chrome(trace)))  # JSON has no tuples
        assert trace.to_chrome_trace() == expected, i
        path = write_chrome_trace(trace, tmp_path / f"{i}.json")
        assert json.loads(path.read_text()) == expected, i


def test_an_empty_trace_exports_an_empty_document(tmp_path: Path) -> None:
    trace = Trace(meta={"a": 1})
    assert trace.to_chrome_trace()["traceEvents"] == []


def test_report_reads_from_the_columns_what_the_object_path_reads() -> None:
    # what the report builds from the columns itself (the spans are compared above; the
    # findings are diagnose()'s): the per-rank counts, the backward marks, the bucket maps
    for i, trace in enumerate(traces()):
        tables = trace.columns()
        assert {r: rank_counts(t) for r, t in tables.items()} == object_report.rank_counts(
            trace), i
        offsets = {r: trace.clock.get(r, (0, 0))[0] for r in tables}
        assert sorted(computed_marks(tables, offsets)) == sorted(
            object_report.computed_marks(trace)), i
        assert {k: sorted(v) for k, v in _bucket_maps(trace).items()} == {
            k: sorted(v) for k, v in object_report.bucket_maps(trace).items()}, i
        assert "<section id='ranks'>" in render(trace, title="r"), i
