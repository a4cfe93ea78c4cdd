"""Live findings of a `ddpviz record` job, said as ddpviz's own lines on stderr: every probe
raises its findings as a `DiagnosisWarning`; in a recorded rank that warning is printed as its
text alone (no "file:line: DiagnosisWarning:" around it, no source line after it), and once
for the job: a finding every rank computes alike by the first rank to hold it, a rank-local
one (each rank's own, seen from its side) as one line naming every rank that reported it.

See [Note: one line per finding per job].
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
import threading
import time
import warnings
from typing import Any, TextIO

import msgspec
import torch.distributed as dist

from ddpviz.envvars import ENV_RING_DIR, ENV_TRACE_DIR
from ddpviz.findings import (
    RANK_LOCAL,
    DiagnosisWarning,
    Finding,
    merge_findings,
    named_live,
    waited_key,
)
from ddpviz.probes.ledger_ring import mark_said
from ddpviz.probes.rendezvous import Scope

# [Note: one line per finding per job]
# The probes compute a finding on every rank that holds its evidence, and each rank raised it
# as a Python warning: a 2-rank job printed the same message twice, each time ending in the
# `warnings.warn(...)` line of ddpviz's own source. Under `ddpviz record` the ranks share one
# terminal, so a finding is claimed in the process group's store and said by one rank:
# - a finding whose text every rank computes alike (from evidence they share: the replica
#   check's and the non-finite check's gathered states, a hang named from the board) is
#   claimed by its text: the first rank to `add` on a key named after it (1 means first)
#   says it, the others stay quiet;
# - a rank-local finding (findings.RANK_LOCAL: the gradient-sync contract, each rank naming
#   itself and its own call sites) differs per rank only by what each rank saw. It is claimed
#   by its identity (findings.merge_findings' key, the rank left out). Each rank posts its
#   finding under the key, then adds its bit to the key's mask; the first to add waits (on a
#   thread of its own, never the training thread) until every rank's bit is in or SAY_WAIT_S
#   passed, closes the mask with CLOSED (one atomic `add`: its result says exactly which ranks
#   it holds) and says the merge of their findings: one finding naming every rank, each rank's
#   call sites as a value line, exactly as `ddpviz diagnose` merges the traces afterwards. A
#   rank whose facts differ (other sites, other parameters) keeps its own value line, or its
#   own finding when the merge keeps it apart: nothing only one rank saw goes unsaid. A rank
#   that comes after the close says its own finding; a rank that exits while it waits says
#   what it holds at once (atexit). Worlds over MAX_MASK_RANKS ranks claim by text;
# - a wait that each waiting rank names from its own side (findings.WAITED_FOR: the quiet
#   guard's and the watchdog's) is claimed by the ranks waited for, the place and the step
#   (`findings.waited_key`), as diagnose merges them: each lists every rank's state; ranks
#   that see different ranks behind say each what they see.
# The claims go through the background connection (the training thread's store calls never
# wait behind it); when there is no store to ask (a group of one, or its host already gone),
# the rank says it itself: a line twice is better than none. Outside `ddpviz record` (watch(),
# ddpviz's DDP in Python) findings stay Python warnings, which code can filter
# (docs/replicas.md).

SAY_WAIT_S = 3.0  # how long the first rank waits for the others' part of a rank-local finding
MAX_MASK_RANKS = 62  # ranks a mask (one int64 key of the store) holds a bit for
CLOSED = 1 << MAX_MASK_RANKS  # added by the rank that says the line: later ranks see it
_POLL_S = 0.02

_KEY = "ddpviz/said/"
_lock = threading.Lock()
_scope: Scope | None = None
_previous: Any = None
_pending: dict[str, _Claim] = {}  # key -> the rank-local line this rank is to say


class _Claim:
    """A rank-local finding this rank is to say for the job, once the others' parts are in."""

    def __init__(self, key: str, finding: Finding, file: TextIO | None) -> None:
        self.key, self.finding, self.file = key, finding, file
        self.deadline = time.monotonic() + SAY_WAIT_S


def install(group: dist.ProcessGroup) -> None:
    """Say this process's DiagnosisWarnings as ddpviz's own lines, once per job (the first
    watched DDP's group decides whose store is asked). Other warnings are left as they were."""
    global _scope, _previous
    with _lock:
        if _scope is not None:
            return
        _scope = Scope(group, clone=True)
        _previous = warnings.showwarning
        warnings.showwarning = _show
        atexit.register(_say_pending)


def _show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
          file: TextIO | None = None, line: str | None = None) -> None:
    if not issubclass(category, DiagnosisWarning):
        _previous(message, category, filename, lineno, file, line)
        return
    finding = getattr(message, "finding", None)
    if isinstance(finding, Finding) and named_live(finding):
        _mark_said()
    if isinstance(finding, Finding) and finding.kind in RANK_LOCAL and _mergeable():
        _claim(finding, file)
        return
    text = str(message)
    waited = waited_key(finding) if isinstance(finding, Finding) else None
    if first_in_job(text if waited is None else repr(waited)):
        _say(text, file)


def _mark_said() -> None:
    """A mismatch of the job's collectives is said live: the rings' comparison after the job
    (record/command.py) must not say it again."""
    folder = os.environ.get(ENV_TRACE_DIR) or os.environ.get(ENV_RING_DIR)
    if folder:
        mark_said(folder)


def _say(text: str, file: TextIO | None) -> None:
    print(text, file=sys.stderr if file is None else file, flush=True)


def first_in_job(text: str) -> bool:
    """Whether this rank is the first of the job to say `text` (True when no store answers)."""
    if _scope is None or _scope.world_size == 1:
        return True
    key = _KEY + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:24]
    try:
        return int(_scope.store.add(key, 1)) == 1
    except Exception:  # no store to ask (its host is gone): say it here
        return True


def _mergeable() -> bool:
    return _scope is not None and 1 < _scope.world_size <= MAX_MASK_RANKS


def identity(finding: Finding) -> str:
    """The store key of a rank-local finding: the same on every rank that reports it with the
    same facts (`merge_findings`' key, its own rank left out)."""
    rank = finding.ranks[0] if finding.ranks else -1
    what = repr((finding.kind, finding.title.replace(f"rank {rank}", "rank ?"), finding.name,
                 finding.field, finding.step, finding.detail))
    return _KEY + "job/" + hashlib.sha256(what.encode("utf-8", "replace")).hexdigest()[:24]


def _claim(finding: Finding, file: TextIO | None) -> None:
    assert _scope is not None
    key, me = identity(finding), _scope.rank
    try:
        store = _scope.store
        store.set(f"{key}/{me}", msgspec.json.encode(finding).decode())  # (before its bit)
        mask = int(store.add(f"{key}/mask", 1 << me))
    except Exception:  # no store to ask: say it here
        _say(finding.text(), file)
        return
    if mask & CLOSED:  # the line was said before this rank's part came: say its own
        _say(finding.text(), file)
    elif mask == 1 << me:  # the first: say the job's line once the others' parts are in
        claim = _Claim(key, finding, file)
        with _lock:
            _pending[key] = claim
        threading.Thread(target=_wait_and_say, args=(claim,), name="ddpviz-said",
                         daemon=True).start()
    # else: the first rank's line holds this rank's part


def _wait_and_say(claim: _Claim) -> None:
    assert _scope is not None
    everyone = (1 << _scope.world_size) - 1
    try:
        while time.monotonic() < claim.deadline:
            if int(_scope.store.add(f"{claim.key}/mask", 0)) & everyone == everyone:
                break
            time.sleep(_POLL_S)
    except Exception:  # (said below with what it holds)
        pass
    _say_claim(claim)


def _say_pending() -> None:
    """At exit: say every line still waiting for other ranks' parts, with what it holds."""
    with _lock:
        claims = list(_pending.values())
    for claim in claims:
        _say_claim(claim)


def _say_claim(claim: _Claim) -> None:
    with _lock:
        if _pending.pop(claim.key, None) is None:
            return  # said already
    assert _scope is not None
    findings = [claim.finding]
    try:
        store = _scope.store
        mask = int(store.add(f"{claim.key}/mask", CLOSED)) - CLOSED
        others = [r for r in range(_scope.world_size) if mask >> r & 1 and r != _scope.rank]
        for r in others:  # (each posted its finding before it added its bit)
            findings.append(msgspec.json.decode(store.get(f"{claim.key}/{r}"),
                                                   type=Finding))
    except Exception:  # what it could read: never less than this rank's own
        pass
    merged = merge_findings((f.ranks[0] if f.ranks else -1, f)
                            for f in sorted(findings, key=lambda f: f.ranks))
    for f in merged:
        _say(f.text(), claim.file)
