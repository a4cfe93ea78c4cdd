"""`ddpviz diagnose`'s text leads with one verdict (healthy, warnings or errors) and ends with
the notes: what was not checked (severity "info" never makes a run unhealthy)."""

from __future__ import annotations

import json

from ddpviz import Finding, Trace
from ddpviz._diagnose.verdict import diagnosis_json, diagnosis_text, verdict_line

NOTE = Finding(kind="grad_order", severity="info", field="not_recorded",
               title="no gradient events at 117 steps (3-99, ...) on ranks 0,1: gradient-ready "
                     "order not checked there")
WARNING = Finding(kind="straggler", severity="warning", title="rank 1 is the straggler",
                  ranks=(1,))
ERROR = Finding(kind="rank_exited", severity="error", title="rank 1 exited", ranks=(1,))


def test_the_verdict_is_one_word_then_the_counts() -> None:
    assert verdict_line([]) == "healthy: no problems found."
    assert verdict_line([NOTE]) == ("healthy: no problems found (1 note, last: what was not "
                                    "checked).")
    assert verdict_line([NOTE, WARNING]) == "warnings: 1 warning, 1 note."
    assert verdict_line([WARNING, NOTE, ERROR, ERROR]) == "errors: 2 errors, 1 warning, 1 note."


def test_diagnose_leads_with_the_verdict_and_ends_with_the_notes() -> None:
    for findings, word in (([NOTE], "healthy"), ([NOTE, WARNING], "warnings"),
                           ([NOTE, WARNING, ERROR], "errors")):
        lines = diagnosis_text(Trace(), findings).splitlines()
        assert lines[0] == f"ddpviz: {verdict_line(findings)}" and word in lines[0]
        headings = [line for line in lines if line and not line.startswith((" ", "-", "ddpviz"))]
        assert headings[-1] == "note:"  # the notes come last
        assert lines[-1].startswith("- no gradient events at 117 steps")
        assert json.loads(diagnosis_json(Trace(), findings))["verdict"] == word
