"""A Python whose site-packages holds ddpviz's startup hook, for running `ddpviz record`.

The venv that runs the tests has the hook once ddpviz is (re)installed from this checkout
(`pip install -e .` copies ddpviz_autowatch.pth into site-packages). Before that, and when
the tests run from another checkout through PYTHONPATH, an overlay venv is made: its
site-packages holds this checkout's hook and a path line to the running interpreter's
site-packages, so it sees the same torch and ddpviz.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "ddpviz_autowatch.pth"


def installed_hook() -> Path | None:
    path = Path(sysconfig.get_paths()["purelib"]) / HOOK.name
    return path if path.is_file() else None


def hooked_python(folder: Path) -> str:
    """The interpreter to run `python -m ddpviz record` and the job with."""
    installed = installed_hook()
    if installed is not None and installed.read_text() == HOOK.read_text():
        return sys.executable
    venv = folder / "overlay-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    paths = [p for p in sys.path if p.endswith("site-packages")]
    (purelib / "zz_parent.pth").write_text("".join(f"{p}\n" for p in paths))
    shutil.copy(HOOK, purelib / HOOK.name)
    return str(python)


def marked_line(script: Path, marker: str) -> int:
    """The line number of `# <marker>` in a job script (where a test plants or expects)."""
    lines = script.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# <{marker}>" in text)
