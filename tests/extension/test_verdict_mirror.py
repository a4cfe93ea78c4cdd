"""The viewer's verdict (extension/src/verdict.ts) says what Python's does
(ddpviz/_diagnose/verdict.py) for the same severities, run in node."""

from __future__ import annotations

import itertools
import random

from ddpviz._diagnose.verdict import verdict, verdict_line
from ddpviz.findings import Finding
from tests.extension.mirror import run_typescript


def test_typescript_verdict_equals_pythons() -> None:
    rng = random.Random(5)
    cases = [list(c) for n in range(4)
             for c in itertools.product(("error", "warning", "info"), repeat=n)]
    cases += [[rng.choice(("error", "warning", "info")) for _ in range(rng.randrange(30))]
              for _ in range(50)]
    got = run_typescript("verdict.ts", "cases.map(c => [g.verdict(c), g.verdictLine(c)])",
                         cases)
    for severities, (word, line) in zip(cases, got, strict=True):
        findings = [Finding(kind="straggler", severity=s, title="t") for s in severities]
        assert (word, line) == (verdict(findings), verdict_line(findings)), severities
