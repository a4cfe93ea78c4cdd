"""The startup hook (ddpviz_autowatch.pth, which runs in every Python process) with hostile or
stale settings: only DDPVIZ_RECORD=1 records (other values are said once and ignored), a hook
left behind by an uninstalled ddpviz says so once and never prints a traceback, and a rank
whose DDPVIZ_CONNECT names another machine says where its events go."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "ddpviz_autowatch.pth"

# A child and a grandchild process, both starting with the hook's folder as a site dir (how
# site-packages' .pth files run at start-up), then report whether the hook armed.
PROBE = r'''
import site, subprocess, sys
site.addsitedir(sys.argv[1])
armed = any(type(f).__name__ == "_Finder" for f in sys.meta_path)
print("armed" if armed else "idle", flush=True)
if len(sys.argv) > 2:
    subprocess.run([sys.executable, "-I", "-S", "-c", PROBE, sys.argv[1]], check=True)
'''


def _run(tmp_path: Path, value: str | None, *,
         with_module: bool) -> subprocess.CompletedProcess[str]:
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(HOOK, site_dir / HOOK.name)
    if with_module:
        shutil.copy(ROOT / "ddpviz_autowatch.py", site_dir / "ddpviz_autowatch.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_")}
    if value is not None:
        env["DDPVIZ_RECORD"] = value
    code = f"PROBE = {PROBE!r}\n{PROBE}"
    # -I -S: no site-packages and no PYTHONPATH, so only the hook in `site_dir` runs (and, in
    # the leftover case, ddpviz_autowatch is importable from nowhere).
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, str(site_dir), "child"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_only_the_documented_value_arms_recording(tmp_path: Path) -> None:
    assert _run(tmp_path, "1", with_module=True).stdout.split() == ["armed", "armed"]
    for value in ("0", "false", "no"):
        done = _run(tmp_path, value, with_module=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["idle", "idle"]
        assert done.stderr.count(f"ddpviz: ignoring DDPVIZ_RECORD={value!r}") == 1  # once
        assert "Traceback" not in done.stderr
    unset = _run(tmp_path, None, with_module=True)
    assert unset.stdout.split() == ["idle", "idle"] and unset.stderr == ""


def test_a_leftover_hook_without_ddpviz_says_so_once_without_a_traceback(tmp_path: Path) -> None:
    done = _run(tmp_path, "1", with_module=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["idle", "idle"]
    assert "Traceback" not in done.stderr and "Error processing line" not in done.stderr
    assert done.stderr.count("leftover ddpviz_autowatch.pth") == 1


def test_a_remote_connect_string_is_said_on_the_rank(tmp_path: Path) -> None:
    code = ("import ddpviz; from ddpviz.session.connect import disconnect; "
            "ddpviz.connect(rank=0); disconnect(0.1)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOCAL_RANK": "0"}
    secret = "ab" * 32
    remote = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**env, "DDPVIZ_CONNECT": f"tcp://192.0.2.7:9#{secret}"})
    assert remote.returncode == 0, remote.stderr
    assert remote.stderr.count("ddpviz: rank 0 sends its events to 192.0.2.7") == 1
    local = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, env={**env, "DDPVIZ_CONNECT": f"tcp://127.0.0.1:9#{secret}"})
    assert local.returncode == 0, local.stderr
    assert "sends its events to" not in local.stderr
