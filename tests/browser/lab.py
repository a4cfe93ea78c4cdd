"""A JupyterLab server for browser tests: this Python's `jupyter lab` on 127.0.0.1, a random
token, a temporary root folder, and user settings that keep pop-ups (news, update checks) out
of the screenshots. The kernel imports this checkout's ddpviz."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

# User settings written before the server starts (plugin id -> settings).
SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                     "checkForUpdates": False},
    # Every cell rendered (the default skips rendering off-screen cells: empty innerText).
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    # The viewer's own settings: the tests check that both are honoured.
    "ddpviz:plugin": {"colorScheme": "okabe-ito", "maxEvents": 400},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LabServer:
    """`jupyter lab` serving `root`; `url(path)` includes the token. Use as a context manager."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root = root
        self.home = home
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}/"
        self.log_path = home / "jupyter-lab.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, path: str = "lab") -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def __enter__(self) -> LabServer:
        settings = self.home / "user-settings"
        for plugin, values in SETTINGS.items():
            package, _, name = plugin.partition(":")
            path = settings / package / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env["OMP_NUM_THREADS"] = "1"
        env["JUPYTER_CONFIG_DIR"] = str(self.home / "config")  # no user config leaks in
        env["JUPYTER_RUNTIME_DIR"] = str(self.home / "runtime")
        cmd = [
            sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
            f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={self.home / 'workspaces'}",
            "--ServerApp.terminals_enabled=False",
        ]
        built = ROOT / "ddpviz" / "labextension"
        if (built / "package.json").is_file() and not built.is_symlink():
            # this checkout has its own build: serve it ahead of the environment's copy
            # (extra paths come first in JupyterLab's search), leaving the venv untouched
            extra = self.home / "labextensions"
            extra.mkdir(exist_ok=True)
            if not (extra / "ddpviz").exists():
                (extra / "ddpviz").symlink_to(built, target_is_directory=True)
            cmd.append(f"--LabApp.extra_labextensions_path={extra}")
        self._log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self._log,
                                      stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout=90)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"ddpviz tests: jupyter lab exited with code "
                                   f"{self._proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"ddpviz tests: jupyter lab did not answer within {timeout} s:\n"
                           f"{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def api(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def federated_extensions(self) -> list[str]:
        """Names of the prebuilt extensions this server loads (from the page config)."""
        with urllib.request.urlopen(self.url("lab"), timeout=10) as r:
            html = r.read().decode()
        start = html.index('id="jupyter-config-data"')
        start = html.index(">", start) + 1
        config = json.loads(html[start:html.index("</script>", start)])
        return [e["name"] for e in config.get("federated_extensions", [])]

    def delete_sessions(self) -> None:
        """Shut down every kernel session (a stale one makes 'Run All' racy)."""
        for s in self.api("GET", "api/sessions"):
            self.api("DELETE", f"api/sessions/{s['id']}")

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not self._log.closed:
            self._log.close()
