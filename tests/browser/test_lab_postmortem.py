"""A folder of Flight Recorder dumps in the JupyterLab viewer (issue #15): `ddpviz postmortem
--trace` writes a .ddpviz trace, which opens from the file browser with the hang finding and
DDP's bucket maps. The dumps are crafted from DDP's own schedule (fast: no processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz._postmortem.ddp_map import DdpSchedule
from tests.browser.conftest import ConsoleLog
from tests.browser.lab import LabServer
from tests.browser.ui import double_click_file, open_lab, wait_for_viewer
from tests.postmortem.jobs import SMALL_CAP_MB, make_model

pytestmark = pytest.mark.browser

TORCH_DTYPE = {"float32": "Float", "int64": "Long", "int32": "Int"}


def crafted_dumps(folder: Path, steps: int) -> None:
    """Rank 0 launched DDP's collectives up to bucket 0 of step `steps` (pending); rank 1
    stopped just before it."""
    model = make_model()
    schedule = DdpSchedule(model, ddpviz.bucket_plan(model, bucket_cap_mb=SMALL_CAP_MB))
    n = 0
    while schedule.at(n).step < steps or schedule.at(n).phase != "bucket":
        n += 1
    for rank, count in ((0, n + 1), (1, n)):
        entries = []
        for i in range(count):
            c = schedule.at(i)
            entries.append({
                "record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"],
                "collective_seq_id": i + 1, "p2p_seq_id": 0, "profiling_name": f"gloo:{c.op}",
                "input_sizes": [[c.numel]], "input_dtypes": [TORCH_DTYPE[c.dtype]],
                "output_sizes": [[c.numel]], "output_dtypes": [TORCH_DTYPE[c.dtype]],
                "state": "scheduled", "retired": i < n, "is_p2p": False,
                "time_created_ns": 10**9 + 1000 * i})
        (folder / f"fr_{rank}").write_text(json.dumps({
            "version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
            "entries": entries}))


def test_dump_folder_opens_in_the_viewer(
        page: Any, lab: LabServer, console: ConsoleLog, lab_root: Path, tmp_path: Path) -> None:
    crafted_dumps(tmp_path, steps=3)
    pm = ddpviz.postmortem(tmp_path, make_model(), settings={"bucket_cap_mb": SMALL_CAP_MB})
    [finding] = pm.findings
    assert finding.title.startswith("rank 1 never launched bucket 0 of step 3")
    pm.to_trace().save(lab_root / "postmortem.ddpviz")
    open_lab(page, lab)
    double_click_file(page, "postmortem.ddpviz")
    viewer = wait_for_viewer(page, "postmortem.ddpviz")
    shown = viewer.locator(".ddpviz-finding")
    assert shown.count() == 1 and finding.title in shown.inner_text()
    maps = viewer.locator(".ddpviz-bucketmap")
    assert maps.count() == 2  # the constructor's map and the rebuilt one
    assert pm.plan is not None and pm.plan.rebuilt is not None
    assert maps.nth(1).locator(".ddpviz-bucket").count() == len(pm.plan.rebuilt)
    assert console.errors == []
