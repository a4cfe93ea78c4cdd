"""Where CI's test time went: the pytest JUnit XML of `make test` (out/junit.xml) summed per
work unit (a test file; tests/frameworks and tests/browser whole, as tests/conftest.py hands
them to one worker), the longest first, then the longest tests. Printed at the end of CI's log,
to choose what to make faster (the suite's wall time is about the sum over two workers).

    python .ci/durations.py [out/junit.xml] [--top 15]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tests/

from tests.conftest import work_unit  # (the units xdist hands out)


def unit_of(classname: str) -> str:
    """tests.record.test_where(.SomeClass) -> tests/record/test_where.py, as a work unit
    (a directory that one worker runs whole: tests/frameworks)."""
    parts = classname.split(".")
    module = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
    return work_unit("/".join(parts[: module + 1]) + ".py")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("junit", nargs="?", default="out/junit.xml")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    path = Path(args.junit)
    if not path.is_file():
        print(f"durations: no {path} (did pytest run?)")
        return 0
    units: dict[str, float] = defaultdict(float)
    tests: list[tuple[float, str]] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        seconds = float(case.get("time") or 0.0)
        cls, name = case.get("classname", ""), case.get("name", "")
        units[unit_of(cls)] += seconds
        tests.append((seconds, f"{cls}::{name}"))
    total = sum(units.values())
    print(f"durations: {len(tests)} tests, {total:.0f} s of test time (two workers: about half "
          "of it in wall time); the longest work units:")
    for unit, seconds in sorted(units.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {seconds:7.0f} s {100 * seconds / max(total, 1e-9):5.1f} %  {unit}")
    print("the longest tests:")
    for seconds, name in sorted(tests, reverse=True)[: args.top]:
        print(f"  {seconds:7.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
