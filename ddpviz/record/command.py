"""`ddpviz record [--connect STRING | --out DIR] -- COMMAND...`: run an unmodified training
command (torchrun ..., python -m pkg ..., python train.py) with every torch
DistributedDataParallel in every rank watched.

It sets $DDPVIZ_RECORD, which the startup hook `ddpviz_autowatch.pth` (installed into
site-packages with ddpviz, editable or not) honours in every Python process of the job, plus
where the events go: $DDPVIZ_CONNECT (a notebook's `ddpviz.listen()` session) or
$DDPVIZ_TRACE_DIR (one `ddpviz-trace-rank{R}.ddpviz` per rank), and with `--recording` what
is recorded ($DDPVIZ_RECORDING, See [Note: recording policy]). See `ddpviz.record.autowatch`.
"""

from __future__ import annotations

import os
import signal
import site
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ddpviz.envvars import (
    ENV_CONNECT,
    ENV_DEBUG,
    ENV_HANG_TIMEOUT,
    ENV_RECORD,
    ENV_RING_DIR,
    ENV_TRACE_DIR,
    TRACE_FILE,
)
from ddpviz.private_dir import PrivateDir
from ddpviz.recording import ENV_RECORDING, Recording
from ddpviz.torch_support import installed, untested_note

HOOK = "ddpviz_autowatch.pth"


class RecordError(ValueError):
    """`ddpviz record` cannot run the command as asked."""


def hook_path() -> Path | None:
    """Where this interpreter's startup hook is, or None when it is not installed."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    for folder in folders:
        path = Path(folder) / HOOK
        if path.is_file():
            return path
    return None


def record_env(*, connect: str | None, out: str | None, hang_timeout: float | None,
               base: dict[str, str] | None = None,
               recording: Recording | None = None, debug: bool | str = False
               ) -> dict[str, str]:
    """The environment the command runs with (`debug`: DDPVIZ_DEBUG=1, the ranks take the
    notebook's debugger commands over the --connect link; "paused": DDPVIZ_DEBUG=paused, they
    also park before their first forward)."""
    env = dict(os.environ if base is None else base)
    env[ENV_RECORD] = "1"
    if debug:
        env[ENV_DEBUG] = "paused" if debug == "paused" else "1"
    if connect is not None:
        env[ENV_CONNECT] = connect
        env.pop(ENV_TRACE_DIR, None)
    elif out is not None or not env.get(ENV_CONNECT):
        env.pop(ENV_CONNECT, None)
        env[ENV_TRACE_DIR] = str(Path(out or ".").resolve())
    if hang_timeout is not None:
        env[ENV_HANG_TIMEOUT] = str(hang_timeout)
    if recording is not None:
        env[ENV_RECORDING] = str(recording)
    return env


def run_recorded(command: Sequence[str], *, connect: str | None = None,
                 out: str | None = None, hang_timeout: float | None = None,
                 recording: str | None = None, debug: bool | str = False) -> int:
    """Run `command` recorded; returns its exit status (128+N when killed by signal N).
    `recording`: $DDPVIZ_RECORDING's spelling ("guard,every=100"), checked here; `debug`: the
    ranks take the debugger's commands from the notebook (only with `connect`); "paused": and
    park before their first forward."""
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise RecordError("ddpviz: record needs a command after '--', e.g. `ddpviz record "
                          "--out traces -- torchrun --nproc-per-node 2 train.py`.")
    if connect is not None and out is not None:
        raise RecordError("ddpviz: record got both --connect and --out; events go to one "
                          "place.\nPass --connect STRING (a notebook's listen() session) or "
                          "--out DIR (per-rank trace files).")
    if debug and connect is None:
        raise RecordError("ddpviz: record --debug takes the debugger's commands from a notebook "
                          "session, so it needs --connect STRING (the notebook's "
                          "ddpviz.listen() connect string).")
    try:
        policy = None if recording is None else Recording.parse(recording, where="--recording ")
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    if hook_path() is None:
        raise RecordError(
            f"ddpviz: the startup hook {HOOK} is not in this Python's site-packages "
            f"({sys.prefix}), so the ranks would run unwatched.\nReinstall ddpviz in this "
            "environment (`pip install ddpviz`, or `pip install -e .` in a checkout): the "
            "hook ships in the wheel.")
    env = record_env(connect=connect, out=out, hang_timeout=hang_timeout, recording=policy,
                     debug=debug)
    note = untested_note(installed())
    if note is not None:
        print(note, file=sys.stderr, flush=True)
    if ENV_TRACE_DIR in env:
        Path(env[ENV_TRACE_DIR]).mkdir(parents=True, exist_ok=True)
        return _run_child(command, env, env[ENV_TRACE_DIR])
    # No trace folder (--connect): the rings of last collectives go to a private one, read
    # after a failed job and removed (See [Note: the ring], probes/ledger_ring.py).
    rings = PrivateDir()
    env[ENV_RING_DIR] = str(rings.path)
    try:
        return _run_child(command, env, env[ENV_RING_DIR])
    finally:
        rings.remove()


def _run_child(command: list[str], env: dict[str, str], rings: str) -> int:
    """Run the recorded command; after it failed, say what its ranks' rings in `rings` show."""
    started = time.time()
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise RecordError(f"ddpviz: cannot run {command[0]!r}: {exc.strerror or exc}.\nCheck "
                          "the command (is it on PATH?).") from exc
    # Ctrl-C reaches the child from the terminal itself; SIGTERM is passed on.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    term = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, term)
    if code != 0:
        say_rings(rings, since=started)
    if ENV_TRACE_DIR in env:
        traces = sorted(Path(env[ENV_TRACE_DIR]).glob(TRACE_FILE.format(rank="*")))
        if traces:
            print(f"ddpviz: {len(traces)} per-rank trace(s) in {env[ENV_TRACE_DIR]}; "
                  f"`ddpviz report {env[ENV_TRACE_DIR]}` writes an HTML report.",
                  file=sys.stderr)
        else:
            print(f"ddpviz: no trace was written to {env[ENV_TRACE_DIR]}: no torch "
                  "DistributedDataParallel was constructed in this job (or not in a Python "
                  "process of this environment). ddpviz observes torch's DDP only: DeepSpeed's "
                  "engine, Megatron's DDP, FSDP/FSDP2 and replicate_with_fsdp are other "
                  "engines.", file=sys.stderr)
    return code if code >= 0 else 128 - code


def say_rings(folder: str, since: float | None = None) -> None:
    """After a failed job: the first difference in the ranks' rings of last collectives (See
    [Note: the ring], probes/ledger_ring.py; `since`: the job's start, older rings are an
    earlier run's), printed once, unless a rank named a mismatch of the job's collectives live
    (it marked the folder, or its trace holds it). Says nothing when the rings agree, and
    nothing when they cannot be read."""
    try:
        from ddpviz.probes.ledger_ring import folder_findings, said_since

        findings = folder_findings(folder, since)
        if not findings or said_since(folder, since) or _said_live(folder):
            return
        for finding in findings:
            print(finding.text(), file=sys.stderr, flush=True)
    except Exception:  # (the job's own exit status is what counts)
        return


def _said_live(folder: str) -> bool:
    """Whether a rank's trace in `folder` holds a mismatch of collectives it named live."""
    from ddpviz._diagnose.diagnosis import trace_said_live
    from ddpviz.traces.source import open_run

    try:
        run = open_run(folder)
    except Exception:
        return False
    if run.trace is None:
        return False
    return trace_said_live(run.trace)
