"""The exports read from the columnar store give exactly what the object path gave: spans,
the Chrome trace JSON (streamed to a file and as objects), the HTML report; on runs with every
kind of defect and with clock offsets."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddpviz.report.chrome_trace import write_chrome_trace
from ddpviz.report.html import render
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


def _sections(page: str, *names: str) -> list[str]:
    found = [re.search(f"<section id='{n}'>.*?</section>", page, re.S) for n in names]
    assert all(found), names
    return [m.group(0) for m in found if m]


def test_report_equals_the_object_path() -> None:
    # the sections the report builds from the columns (the findings are diagnose()'s)
    names = ("ranks", "buckets", "timeline")
    for i, trace in enumerate(traces()):
        assert _sections(render(trace, title="r"), *names) == _sections(
            object_report.render(trace, title="r"), *names), i
