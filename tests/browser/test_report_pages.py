"""The static report as a person reads it, in Chromium: real 2-rank gloo jobs under `ddpviz
record` (a healthy 31-step run, a hang at step 3, a model that differs across ranks), each
report opened and screenshotted. The verdict comes first; figures say what they count; each
drawn step has its own axis; the legend is there; nothing overflows its container."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ddpviz import diagnose
from ddpviz.report.html import write_report
from tests.browser.conftest import SCREENSHOTS
from tests.dist.harness import free_port
from tests.record.hooked import ROOT, hooked_python
from tests.record.test_record import job_env, run

pytestmark = [pytest.mark.browser, pytest.mark.dist]

JOBS = {  # name: (script, environment, exits 0)
    "healthy": ("train_plain.py", {"TRAIN_STEPS": "31"}, True),
    "hang": ("train_stuck.py", {"TRAIN_PLANT": "sleep", "TRAIN_PG_TIMEOUT": "20",
                                "TRAIN_SLEEP_S": "30"}, False),
    "mismatch": ("train_plain.py", {"TRAIN_MISMATCH": "shape"}, False),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    python = hooked_python(tmp_path_factory.mktemp("hooked"))
    folder = tmp_path_factory.mktemp("reports")

    def record(name: str) -> subprocess.CompletedProcess[str]:
        script, env, _ = JOBS[name]
        return run([python, "-m", "ddpviz", "record", "--out", str(folder / name),
                    "--hang-timeout", "5", "--", python, "-m", "torch.distributed.run",
                    "--nproc-per-node", "2", "--master-port", str(free_port()),
                    str(ROOT / "tests" / "record" / script)], job_env(**env))

    # The hang job spends most of its time waiting (rank 1 asleep, rank 0 until gloo's 20 s
    # timeout ends the job): it runs beside the other two, not after them.
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(record, "hang")
        done = {name: record(name) for name in JOBS if name != "hang"}
        done["hang"] = waiting.result()
    out: dict[str, Path] = {}
    for name, (_, _, ok) in JOBS.items():
        assert (done[name].returncode == 0) == ok, (
            done[name].stdout + done[name].stderr)[-3000:]
        out[name] = write_report(folder / name, folder / f"{name}.html",
                                 title=f"ddpviz report: {name}")
    return out


_OVERFLOW = """() => [...document.querySelectorAll('body *')].filter(e => {
    const p = e.parentElement; if (!p || p === document.body) return false;
    if (getComputedStyle(p).overflowX === 'auto') return false;
    const a = e.getBoundingClientRect(), b = p.getBoundingClientRect();
    return a.width > 0 && (a.right > b.right + 1 || a.left < b.left - 1);
}).map(e => e.tagName + (e.id ? '#' + e.id : '') + ' in ' + e.parentElement.tagName)"""

# every tick label inside its svg (the last one is not clipped)
_TICKS_CLIPPED = """() => [...document.querySelectorAll('figure.step svg')].flatMap(svg => {
    const b = svg.getBoundingClientRect();
    return [...svg.querySelectorAll('text')].filter(t => {
        const r = t.getBoundingClientRect();
        return r.right > b.right + 0.5 || r.left < b.left - 0.5;
    }).map(t => t.textContent);
})"""


def _open(browser: Any, path: Path, name: str) -> tuple[Any, Any]:
    # offline: the report is one file, its interactive view included (nothing is fetched)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1,
                                  offline=True)
    page = context.new_page()
    errors: list[str] = []
    requests: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_selector("#timeline")
    page.wait_for_selector("#ddpviz-view .ddpviz-trace")
    # the panels below the hook timeline are drawn after the first paint (view.ts), in order
    page.wait_for_selector("#ddpviz-view .ddpviz-trace[data-panels=all]")
    sections = page.eval_on_selector_all("#ddpviz-view .ddpviz-panels > [data-section]",
                                         "els => els.map(e => e.dataset.section)")
    assert sections[0] == "verdict" and sections[-1] == "counts", sections
    assert sections.index("timeline") < sections.index("waits") < sections.index("counts")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"report-{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    target = os.environ.get("DDPVIZ_REPORT_SHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)
    assert errors == [] and requests == [path.as_uri()]
    assert page.evaluate(_OVERFLOW) == []
    assert page.evaluate(_TICKS_CLIPPED) == []
    return context, page


def _view_matches_the_report(page: Any, path: Path) -> None:
    """The interactive view (the viewer's own panels) says diagnose()'s verdict and findings,
    as the report's static part does."""
    view = page.locator("#ddpviz-view")
    assert view.locator("[data-section=verdict]").get_attribute("data-scope") == "diagnose"
    found = diagnose(path.parent / path.stem)
    titles = view.locator(".ddpviz-finding").all_inner_texts()
    assert len(titles) == len(found), titles
    for f, shown in zip(sorted(found, key=lambda f: f.title), sorted(titles), strict=True):
        assert f.title in shown, (f.title, shown)


def _first_text(page: Any) -> str:
    """The first paragraph under the title: the verdict."""
    return str(page.locator("h1 ~ section p").first.inner_text())


def test_a_healthy_report_reads_well(browser: Any, reports: dict[str, Path]) -> None:
    context, page = _open(browser, reports["healthy"], "healthy")
    _view_matches_the_report(page, reports["healthy"])
    # (a failure says what was found, in full: its evidence is in the finding's detail)
    found = diagnose(reports["healthy"].parent / "healthy")
    assert _first_text(page).startswith("Healthy"), "\n\n".join(
        f.text() for f in found)
    ranks = page.locator("#ranks").inner_text()
    assert "steps recorded in full" in ranks and "all-reduces recorded" in ranks
    assert "of which waiting for the last rank's launch" in ranks
    cells = page.locator("#ranks tr").nth(1).locator("td").all_inner_texts()
    assert cells[2] == "31" and cells[3] == "0-2"  # 31 steps run, 3 recorded in full
    assert cells[9] == "0"  # no unfinished span on a clean run
    assert "the same on ranks 0,1" in page.locator("#verification").inner_text()
    caps = page.locator("#buckets tr td:nth-child(4)").all_inner_texts()
    assert caps == ["none (one bucket per dtype and device)", "1.0 MiB"]
    assert page.locator("#timeline ul.legend li").count() >= 6
    assert page.locator("figure.step").count() == 3
    assert page.locator("figure.step svg").count() == 3  # one axis per drawn step
    # the interactive view answers in the page: another iteration picked, another drawn
    timeline = page.locator("#ddpviz-view [data-section=timeline]")
    picker = timeline.locator("select").first
    before = timeline.inner_text()
    picker.select_option(index=0)
    page.wait_for_function("b => document.querySelector("
                           "'#ddpviz-view [data-section=timeline]').innerText !== b", arg=before)
    context.close()


def test_a_hang_report_draws_the_step_where_it_hung(browser: Any,
                                                    reports: dict[str, Path]) -> None:
    context, page = _open(browser, reports["hang"], "hang")
    _view_matches_the_report(page, reports["hang"])
    assert _first_text(page).startswith("Errors")
    assert page.locator("#step-3").count() == 1  # the hang step
    hung = page.locator("#step-3").inner_text()
    assert "rank 1: no event in step 3 (its last was in step 2" in hung
    assert "no further event from this rank" in page.locator("ul.legend").inner_text()
    context.close()


def test_a_mismatch_report_shows_the_failed_comparison(browser: Any,
                                                       reports: dict[str, Path]) -> None:
    context, page = _open(browser, reports["mismatch"], "mismatch")
    _view_matches_the_report(page, reports["mismatch"])
    assert _first_text(page).startswith("Errors")
    text = page.locator("#verification").inner_text()
    assert "Failed (reported by ranks 0,1): 3 differences" in text
    assert page.locator("#verification a").count() == 3
    assert "DDP was not built" in page.locator("#buckets").inner_text()
    context.close()
